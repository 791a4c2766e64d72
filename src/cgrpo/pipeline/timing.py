"""Wall clock and generated rollouts of a trainer's training-time generation, for either trainer class."""

from __future__ import annotations

import functools
import time

from trl import GRPOTrainer


class GenerationCounter:
    """Generated (never only kept) training rollouts and tokens, and the wall time spent generating them."""

    def __init__(self):
        self.rollouts = 0
        self.tokens = 0
        self.seconds = 0.0


def count_generation(trainer: GRPOTrainer) -> GenerationCounter:
    """Start counting the training-time calls of `trainer._generate` (evaluation calls are left out).

    Wrapping the instance's `_generate` counts both trainers identically; C-GRPO's `_generate` returns padded
    groups, so its counts come from `cgrpo_totals` instead and only its time is taken from here.
    """
    counter = GenerationCounter()
    generate = trainer._generate

    @functools.wraps(generate)
    def timed(prompts):
        start = time.perf_counter()
        result = generate(prompts)
        if trainer.model.training:
            counter.seconds += time.perf_counter() - start
            counter.rollouts += len(result[1])
            counter.tokens += sum(len(ids) for ids in result[1])
        return result

    trainer._generate = timed
    return counter
