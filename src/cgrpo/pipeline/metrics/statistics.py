"""Confidence intervals: exact binomial for a coverage, a bootstrap over seeds and prompts for an accuracy, and
Student's t over seeds for a cost (one value per seed, where a percentile bootstrap of three seeds is their range);
and the seed of each random purpose (`purpose_seed`), so that the draws of sampling, splits and bootstraps never
meet."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from .checks import is_integer

__all__ = ["binomial_ci", "bootstrap_mean_ci", "purpose_seed", "t_mean_ci"]


def binomial_ci(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of a proportion ``successes / n``."""
    ci = stats.binomtest(successes, n).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


def t_mean_ci(values: np.ndarray | Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean of one value per seed and its Student t interval ``(mean, lo, hi)``: mean -+ t(n - 1) x sd / sqrt(n).

    A percentile bootstrap of a handful of seeds cannot reach past their smallest and largest value; the t interval
    widens with fewer seeds as it should. Of a paired difference's per-seed values it is the paired t interval. With
    a single value the interval is undefined, ``(value, nan, nan)``.
    """
    sample = np.asarray(values, dtype=float)
    if sample.ndim != 1 or sample.size == 0:
        raise ValueError("values must be a non-empty list of one value per seed.")
    if not np.all(np.isfinite(sample)):
        raise ValueError("values contains NaN or inf; drop failed seeds before aggregating.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}; pass e.g. 0.95.")
    mean = float(sample.mean())
    if sample.size == 1:
        return mean, math.nan, math.nan
    half = stats.t.ppf((1.0 + confidence) / 2.0, sample.size - 1) * sample.std(ddof=1) / math.sqrt(sample.size)
    return mean, mean - float(half), mean + float(half)


def bootstrap_mean_ci(
    values: np.ndarray | Sequence[float] | Sequence[Sequence[float]],
    resamples: int,
    seed: int | Sequence[int],
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """Mean of a seeds x prompts table and its percentile bootstrap interval ``(mean, lo, hi)``.

    Each resample draws the training seeds (rows) with replacement and, independently, the eval prompts (columns)
    with replacement, so the interval carries the noise of both; a one-dimensional ``values`` has one value per seed
    (a cost, which has no prompts) and resamples seeds only. A table of differences between two methods' runs of the
    same seeds on the same prompts gives the paired interval. With a single value the interval is undefined,
    ``(value, nan, nan)``. ``seed`` seeds NumPy's generator (an integer or a sequence of integers).
    """
    table = np.asarray(values, dtype=float)
    table = table[:, None] if table.ndim == 1 else table
    if table.ndim != 2 or table.size == 0:
        raise ValueError("values must be a non-empty table of seeds x prompts, or one value per seed.")
    if not np.all(np.isfinite(table)):
        raise ValueError("values contains NaN or inf; drop failed seeds before aggregating.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}; pass e.g. 0.95.")
    if not is_integer(resamples) or resamples < 1:
        raise ValueError(f"resamples must be a positive integer, got {resamples!r}.")
    mean = float(table.mean())
    seeds, prompts = table.shape
    if table.size == 1:
        return mean, math.nan, math.nan
    rng = np.random.default_rng(seed)
    seed_draws = rng.integers(0, seeds, size=(resamples, seeds))
    prompt_draws = rng.integers(0, prompts, size=(resamples, prompts))
    # per_seed[s, b]: seed s's mean over the prompts of resample b.
    per_seed = table[:, prompt_draws].mean(axis=2)
    means = per_seed[seed_draws, np.arange(resamples)[:, None]].mean(axis=1)
    low, high = np.quantile(means, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return mean, float(low), float(high)


def purpose_seed(seed: int, purpose: str) -> int:
    """A 63-bit seed for one random purpose of run `seed`: the top 63 bits of SHA-256 of "<seed>:<purpose>".

    Plain offsets would collide: `generate_completions` seeds batch i with `seed + i`, so sharing the run seed made
    sample s of eval and calibration prompt i share their draws, and run seed 0's batch 1 equal seed 1's batch 0.
    Hashed seeds are spread over 2**63 values, so `seed + i` ranges of different purposes or run seeds do not meet.
    """
    digest = hashlib.sha256(f"{seed}:{purpose}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
