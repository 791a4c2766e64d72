"""The fixed-group GRPO baseline, counting its training-time generation the way `CGRPOTrainer` counts its own."""

from __future__ import annotations

import time

from trl import GRPOTrainer

from ...support.base import Generated, SupportedGRPOTrainer
from ...support.learning_signal import SIGNAL_KEYS


class TimedGRPOTrainer(SupportedGRPOTrainer):
    """TRL's `GRPOTrainer` whose `generation_totals` hold what `CGRPOTrainer.generation_totals` holds for C-GRPO.

    Keys: `train_rollouts` and `train_tokens` generated in training, and `generation_s`, the seconds spent generating
    them. Evaluation-time generation is left out, as C-GRPO leaves it out. Every `GRPOTrainer` argument and model
    keeps working: the support layer adds only the vLLM weight sync.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.generation_totals = {"train_rollouts": 0, "train_tokens": 0, "generation_s": 0.0}
        self.generation_totals.update(dict.fromkeys(SIGNAL_KEYS, 0.0))

    # Why: the baseline's generated rollouts and generation seconds are the costs C-GRPO is compared with, and TRL
    # reports neither for a run.
    def _generate(self, prompts: list):
        start = time.perf_counter()
        result = super()._generate(prompts)
        if self.model.training:
            completion_ids = Generated(*result).completion_ids
            self.generation_totals["generation_s"] += time.perf_counter() - start
            self.generation_totals["train_rollouts"] += len(completion_ids)
            self.generation_totals["train_tokens"] += sum(len(ids) for ids in completion_ids)
        return result


def generation_seconds(trainer: GRPOTrainer) -> float:
    """Seconds any trainer of the support layer (`cgrpo.support.base`) spent in training-time generation."""
    return float(trainer.generation_totals["generation_s"])
