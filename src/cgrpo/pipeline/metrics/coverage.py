"""Coverage, kept as two separate quantities: per fixed budget k (what the split-conformal theorem bounds) and at
the adaptively chosen k (post-selection, which the theorem does not cover); and the spread of the per-k coverage over
repeated calibration/eval splits, next to what the theorem predicts for it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from ...conformal import conformal_quantile
from .checks import check_delta, check_nonempty, check_same_length, is_integer, score_array
from .statistics import binomial_ci

__all__ = ["coverage_at_k", "post_selection_coverage", "split_coverage_distribution"]


def coverage_at_k(eval_scores_at_k: Sequence[float], qhat_k: float, delta: float, n_cal: int) -> dict[str, Any]:
    """Empirical split-conformal coverage at one fixed budget k.

    A prompt is covered when its nonconformity score at k is ``<= qhat_k``.
    For exchangeable calibration and eval prompts the theorem puts the
    expected coverage in ``[1 - delta, 1 - delta + 1/(n_cal + 1)]`` (upper end
    clipped to 1). Two caveats are reported rather than hidden:

    * the upper end assumes no tied scores; the execution scores are
      discrete and tie often, so coverage above ``band_high`` is expected
      there and is not a violation;
    * when ``ceil((n_cal + 1)(1 - delta)) > n_cal`` no calibration score
      certifies ``1 - delta``, the threshold is 1.0 and coverage is 1 by
      construction (``band_valid`` is False); add calibration prompts or
      raise delta.

    ``ci_low``/``ci_high`` are the exact Clopper–Pearson 95% interval on the
    observed fraction.

    Returns keys ``coverage``, ``n_covered``, ``n_eval``, ``nominal``,
    ``band_low``, ``band_high``, ``band_valid``, ``ci_low``, ``ci_high``.
    """
    check_delta(delta)
    if not is_integer(n_cal) or n_cal < 1:
        raise ValueError(f"n_cal must be a positive integer, got {n_cal!r}; pass the calibration set size.")
    scores = score_array(eval_scores_at_k, "eval_scores_at_k")
    if scores.size == 0:
        raise ValueError("eval_scores_at_k is empty; pass one score per eval prompt.")
    if math.isnan(float(qhat_k)):
        raise ValueError("qhat_k is NaN; refit the thresholds on a non-empty calibration set.")
    n_covered = int(np.sum(scores <= float(qhat_k)))
    n_eval = int(scores.size)
    ci_low, ci_high = binomial_ci(n_covered, n_eval)
    # Same rounding guard as conformal_quantile, so both agree on clamping.
    rank = math.ceil((n_cal + 1) * (1.0 - float(delta)) - 1e-9)
    return {
        "coverage": n_covered / n_eval,
        "n_covered": n_covered,
        "n_eval": n_eval,
        "nominal": 1.0 - float(delta),
        "band_low": 1.0 - float(delta),
        "band_high": min(1.0, 1.0 - float(delta) + 1.0 / (n_cal + 1)),
        "band_valid": rank <= n_cal,
        "ci_low": ci_low,
        "ci_high": ci_high,
    }


def post_selection_coverage(
    eval_scores_by_k: Mapping[int, Sequence[float]],
    qhat: Mapping[int, float],
    chosen_k: Sequence[int],
) -> dict[str, Any]:
    """Coverage at each prompt's adaptively chosen k (post-selection).

    NOT covered by the split-conformal theorem: k was chosen by looking at the
    same samples, so this is a diagnostic only and is keyed
    ``coverage_post_selection`` to keep it apart from the per-k coverage.
    Prompt i is covered when ``eval_scores_by_k[chosen_k[i]][i] <= qhat[chosen_k[i]]``.

    Returns keys ``coverage_post_selection``, ``n_covered``, ``n_eval``,
    ``ci_low``, ``ci_high`` (Clopper–Pearson 95%) and
    ``covered_by_theorem`` (always False).
    """
    check_nonempty(chosen_k, "chosen_k")
    covered = 0
    for i, k in enumerate(chosen_k):
        if k not in eval_scores_by_k or k not in qhat:
            raise ValueError(f"chosen budget {k} has no eval scores or qhat; use the grid the scores were computed on.")
        scores_k = eval_scores_by_k[k]
        check_same_length(scores_k, chosen_k, f"eval_scores_by_k[{k}]", "chosen_k")
        s = float(scores_k[i])
        if math.isnan(s):
            raise ValueError(f"eval score of prompt {i} at k={k} is NaN; recompute the scores.")
        covered += s <= float(qhat[k])
    n = len(chosen_k)
    ci_low, ci_high = binomial_ci(covered, n)
    return {
        "coverage_post_selection": covered / n,
        "n_covered": covered,
        "n_eval": n,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "covered_by_theorem": False,
    }


def split_coverage_distribution(
    calibration_scores_at_k: Sequence[float],
    eval_scores_at_k: Sequence[float],
    delta: float,
    repeats: int,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Per-k coverage over `repeats` random re-splits of the pooled calibration and eval prompts, against theory.

    Each repeat draws, from the pooled scores already sampled (no new generation), as many calibration prompts as
    there were, fits ``qhat = conformal_quantile(calibration, delta)`` and measures the coverage of the other prompts.
    Split-conformal theory: with n calibration scores without ties and r = ceil((n + 1)(1 - delta)), the coverage of a
    fresh prompt given the calibration draw is Beta(r, n + 1 - r), so the coverage of m eval prompts is
    Beta-binomial(m, r, n + 1 - r) / m. Tied scores (unsolved prompts all score 1) can only raise coverage above it.

    Returns keys ``repeats``, ``mean``, ``q05``, ``q95`` (the observed distribution), ``theory_mean``,
    ``theory_q05``, ``theory_q95`` and ``within_theory_90`` (the share of repeats inside the theory's 90% range);
    the theory keys are NaN where r > n (no score certifies 1 - delta: qhat = 1 covers everything by construction).
    """
    check_delta(delta)
    calibration = score_array(calibration_scores_at_k, "calibration_scores_at_k")
    evaluation = score_array(eval_scores_at_k, "eval_scores_at_k")
    if calibration.size == 0 or evaluation.size == 0 or not is_integer(repeats) or repeats < 1:
        raise ValueError("pass non-empty calibration and eval scores and a positive number of repeats.")
    pooled = np.concatenate([calibration, evaluation])
    n, m = calibration.size, evaluation.size
    coverages = np.empty(repeats)
    for i in range(repeats):
        order = rng.permutation(pooled.size)
        qhat = conformal_quantile(pooled[order[:n]], delta)
        coverages[i] = np.mean(pooled[order[n:]] <= qhat)
    rank = math.ceil((n + 1) * (1.0 - float(delta)) - 1e-9)
    if rank > n:
        theory = (math.nan, math.nan, math.nan)
        within = math.nan
    else:
        counts = stats.betabinom(m, rank, n + 1 - rank)
        low, high = counts.ppf(0.05) / m, counts.ppf(0.95) / m
        theory = (rank / (n + 1), low, high)
        within = float(np.mean((coverages >= low) & (coverages <= high)))
    return {
        "repeats": repeats,
        "mean": float(coverages.mean()),
        "q05": float(np.quantile(coverages, 0.05)),
        "q95": float(np.quantile(coverages, 0.95)),
        "theory_mean": theory[0],
        "theory_q05": theory[1],
        "theory_q95": theory[2],
        "within_theory_90": within,
    }
