"""Reinforce-Ada's sampling: draw a prompt in rounds until its answers hold enough right and wrong ones (or a cap), then
train on a balanced group of fixed size whose advantages take the whole pool's mean as baseline.

Written from "Reinforce-Ada: An Adaptive Sampling Framework under Non-linear RL Objectives" (arXiv 2510.04996, v3,
Algorithm 2, "Seq-balance"); the facts and their sources are in docs/research/allocators.md. The exit holds once a
prompt's pool has `positives` right and `negatives` wrong answers; a prompt that reaches the cap exits anyway. Of the
pool, `size` answers are trained on, half right and half wrong where the pool allows, the short side filled from the
other; each one's advantage is its reward minus the mean reward of the whole pool (no division by a deviation), times
an optional weight from the pool's success rate (the paper's text re-weights by the inverse rate; its algorithm box does
not; `weighting` chooses).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

__all__ = ["WEIGHTINGS", "balanced_exit", "balanced_group", "pool_advantages", "rate_weight"]

WEIGHTINGS = ("none", "inverse_rate", "inverse_sqrt_rate")


def balanced_exit(rewards: Sequence[float], positives: int, negatives: int) -> bool:
    """Whether a prompt's pool holds at least `positives` right and `negatives` wrong answers."""
    right = sum(float(reward) >= 0.5 for reward in rewards)
    return right >= positives and len(rewards) - right >= negatives


def balanced_group(rewards: Sequence[float], size: int, rng: random.Random) -> list[int]:
    """The indices of `size` answers of the pool to train on: half right, half wrong (the right half rounded down),
    the short side filled from the other, each side drawn with `rng`; in draw order."""
    if size > len(rewards):
        raise ValueError(f"A balanced group of {size} needs a pool of at least {size} answers, got {len(rewards)}.")
    right = [i for i, reward in enumerate(rewards) if float(reward) >= 0.5]
    wrong = [i for i, reward in enumerate(rewards) if float(reward) < 0.5]
    take_right = min(len(right), max(size // 2, size - len(wrong)))
    chosen = rng.sample(right, take_right) + rng.sample(wrong, size - take_right)
    return sorted(chosen)


def pool_advantages(rewards: Sequence[float], chosen: Sequence[int], weighting: str = "none") -> list[float]:
    """The advantages of the `chosen` answers: reward minus the whole pool's mean reward, times the weighting's factor
    of the pool's success rate (1, its inverse, or its inverse square root; 0 where nothing was right, whose
    advantages are zero anyway)."""
    baseline = sum(float(reward) for reward in rewards) / len(rewards)
    factor = rate_weight(rewards, weighting)
    return [(float(rewards[i]) - baseline) * factor for i in chosen]


def rate_weight(rewards: Sequence[float], weighting: str) -> float:
    """The weighting's factor of a pool's success rate: 1, its inverse or its inverse square root (0 where nothing
    was right, whose advantages are zero anyway)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got {weighting!r}.")
    rate = sum(float(reward) >= 0.5 for reward in rewards) / len(rewards)
    if weighting == "none":
        return 1.0
    if not rate:
        return 0.0
    return 1.0 / rate if weighting == "inverse_rate" else 1.0 / math.sqrt(rate)
