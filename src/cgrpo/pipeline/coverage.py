"""Coverage, kept as two separate quantities: per fixed budget k (what the split-conformal theorem bounds) and at
the adaptively chosen k (post-selection, which the theorem does not cover)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .checks import check_delta, check_nonempty, check_same_length, is_integer, score_array
from .statistics import binomial_ci

__all__ = ["coverage_at_k", "post_selection_coverage"]


def coverage_at_k(
    eval_scores_at_k: Sequence[float], qhat_k: float, delta: float, n_cal: int
) -> dict[str, Any]:
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
