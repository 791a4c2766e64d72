"""Confidence intervals: exact binomial for a coverage, Student t across seeds for the comparison tables."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from .checks import check_same_length

__all__ = ["binomial_ci", "mean_ci", "paired_difference_ci"]


def binomial_ci(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval of a proportion ``successes / n``."""
    ci = stats.binomtest(successes, n).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


def mean_ci(values: Iterable[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided Student-t confidence interval ``(mean, lo, hi)`` across seeds.

    With a single value the interval is undefined and returned as
    ``(value, nan, nan)``; identical values give a zero-width interval.
    """
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        raise ValueError("values is empty; pass one value per seed.")
    if not np.all(np.isfinite(arr)):
        raise ValueError("values contains NaN or inf; drop failed seeds before aggregating.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}; pass e.g. 0.95.")
    mean = float(arr.mean())
    n = arr.size
    if n == 1:
        return mean, float("nan"), float("nan")
    half = float(stats.t.ppf(0.5 + confidence / 2.0, df=n - 1) * arr.std(ddof=1) / math.sqrt(n))
    return mean, mean - half, mean + half


def paired_difference_ci(
    treatment: pd.Series | Sequence[float],
    baseline: pd.Series | Sequence[float],
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """:func:`mean_ci` of per-seed differences ``treatment - baseline``.

    Pandas Series are paired on their index (the seed), which must match
    exactly; plain sequences are paired by position.
    """
    if isinstance(treatment, pd.Series) and isinstance(baseline, pd.Series):
        if (
            not treatment.index.is_unique
            or not baseline.index.is_unique
            or set(treatment.index) != set(baseline.index)
        ):
            raise ValueError(
                "treatment and baseline seeds differ or repeat; pass one result per seed for the same seeds in both."
            )
        diff = treatment - baseline.loc[treatment.index]
        return mean_ci(diff.to_numpy(dtype=float), confidence)
    t = list(treatment)
    b = list(baseline)
    check_same_length(t, b, "treatment", "baseline")
    return mean_ci(np.asarray(t, dtype=float) - np.asarray(b, dtype=float), confidence)
