"""Evaluation metrics for C-GRPO, as pure functions on already-extracted answers.

Inputs are per-prompt lists of extracted answers (``str``, with ``None`` or
``""`` meaning the extractor failed) of length ``K = max(grid)`` sampled at the
training temperature, the gold answers, and, for execution tasks, per-sample
pass booleans. Answer matching is exact string equality: normalisation belongs
to the extractor, so that every metric here agrees on what "correct" means.

Sections:

1. Accuracy: majority vote, maj@k, unbiased pass@k, mean@K, greedy accuracy.
2. Conformal dynamic k on eval prompts: the trainer's stopping rule replayed
   on prefixes of the same samples.
3. Coverage, kept as two separate quantities: per fixed k (what the
   split-conformal theorem bounds) and at the adaptively chosen k
   (post-selection, which the theorem does not cover).
4. Cost accounting in *generated* rollouts: every sampled completion counts,
   never only the ones kept for the policy update.
5. Confidence intervals across seeds for the comparison tables.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from cgrpo import calibration

__all__ = [
    "is_failed",
    "majority_answer",
    "correct_flags",
    "maj_at_k",
    "pass_at_k",
    "mean_pass_at_k",
    "mean_accuracy",
    "greedy_accuracy",
    "dynamic_k",
    "dynamic_k_summary",
    "coverage_at_k",
    "coverage_table",
    "post_selection_coverage",
    "rollouts_generated",
    "rollout_savings",
    "rollout_savings_with_calibration",
    "rollouts_per_prompt",
    "nearest_admissible_g",
    "mean_ci",
    "paired_difference_ci",
]

# --------------------------------------------------------------------------- #
# Validation helpers
# --------------------------------------------------------------------------- #


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _check_k(k: int, n: int, what: str = "answers") -> None:
    if not _is_int(k):
        raise ValueError(f"k must be an integer, got {k!r}; pass an int budget.")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}; pass a positive budget.")
    if k > n:
        raise ValueError(
            f"k={k} exceeds the {n} {what} available; sample at least k per prompt or lower k."
        )


def _check_same_length(a: Sequence, b: Sequence, a_name: str, b_name: str) -> None:
    if len(a) != len(b):
        raise ValueError(
            f"{a_name} has {len(a)} entries but {b_name} has {len(b)}; pass one per prompt in both."
        )


def _check_nonempty(x: Sequence, name: str) -> None:
    if len(x) == 0:
        raise ValueError(f"{name} is empty; pass at least one prompt.")


def _check_gold(gold: Any) -> None:
    # A missing gold would make every prompt silently "wrong"; refuse instead.
    if is_failed(gold):
        raise ValueError(f"gold answer {gold!r} is missing; drop the prompt or supply its gold.")


def _check_delta(delta: float) -> None:
    if not (0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must lie in (0, 1), got {delta}; pass a miscoverage level like 0.1.")


def _check_grid(grid: Sequence[int]) -> list[int]:
    """Sorted copy of ``grid``, mirroring how ``calibration`` reads a grid."""
    budgets = list(grid)
    if not budgets:
        raise ValueError("grid is empty; pass budgets such as [2, 4, 8, 16, 32].")
    if any(not _is_int(g) or g < 1 for g in budgets):
        raise ValueError(f"grid {budgets} must hold positive integers; pass budgets such as [2, 4, 8].")
    if len(set(budgets)) != len(budgets):
        raise ValueError(f"grid {budgets} repeats a budget; pass each budget once.")
    return sorted(int(g) for g in budgets)


def _check_score(score: str) -> None:
    if score not in calibration.SCORES:
        raise ValueError(f"unknown score {score!r}; use one of {calibration.SCORES}.")


def _score_array(scores: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(list(scores), dtype=float)
    # NaN <= qhat is False, so a NaN would silently count as "not covered".
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN; recompute the scores or drop those prompts.")
    return arr


def _binomial_ci(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    ci = stats.binomtest(successes, n).proportion_ci(confidence_level=confidence, method="exact")
    return float(ci.low), float(ci.high)


# --------------------------------------------------------------------------- #
# 1. Accuracy
# --------------------------------------------------------------------------- #


def is_failed(answer: str | None) -> bool:
    """Return True when an extracted answer is a failed extraction (``None`` or ``""``)."""
    return answer is None or answer == ""


def majority_answer(answers: Sequence[str | None], k: int) -> str | None:
    """Majority answer over the first ``k`` extracted answers.

    Failed extractions never win. Ties are broken by first appearance among
    the first ``k``, so the result does not depend on hash order. Returns
    ``None`` when all of the first ``k`` failed.
    """
    _check_k(k, len(answers))
    prefix = [a for a in answers[:k] if not is_failed(a)]
    if not prefix:
        return None
    counts = Counter(prefix)
    best = max(counts.values())
    # Counter preserves insertion order, i.e. first appearance.
    return next(a for a, c in counts.items() if c == best)


def correct_flags(answers: Sequence[str | None], gold: str) -> list[bool]:
    """Per-sample correctness (exact match with ``gold``); failed extractions are wrong."""
    _check_gold(gold)
    return [(not is_failed(a)) and a == gold for a in answers]


def maj_at_k(
    answers_per_prompt: Sequence[Sequence[str | None]], golds: Sequence[str], k: int
) -> float:
    """maj@k: fraction of prompts whose majority over the first ``k`` answers equals the gold."""
    _check_nonempty(answers_per_prompt, "answers_per_prompt")
    _check_same_length(answers_per_prompt, golds, "answers_per_prompt", "golds")
    hits = 0
    for answers, gold in zip(answers_per_prompt, golds):
        _check_gold(gold)
        maj = majority_answer(answers, k)
        hits += maj is not None and maj == gold
    return hits / len(golds)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator ``1 - C(n-c, k) / C(n, k)`` from ``n`` samples with ``c`` correct.

    Computed in product form, ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``, which avoids
    the huge binomials of the direct formula.
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if not _is_int(v):
            raise ValueError(f"{name} must be an integer, got {v!r}; pass sample counts as ints.")
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}; pass the number of samples drawn.")
    if not 0 <= c <= n:
        raise ValueError(f"c={c} is outside [0, n={n}]; pass the number of correct samples.")
    _check_k(k, n, "samples")
    if n - c < k:
        # Every size-k subset contains a correct sample.
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=float)))


def mean_pass_at_k(correct_per_prompt: Sequence[Sequence[bool]], k: int) -> float:
    """Mean over prompts of the unbiased pass@k, each prompt using all of its samples."""
    _check_nonempty(correct_per_prompt, "correct_per_prompt")
    return float(
        np.mean([pass_at_k(len(flags), int(sum(bool(f) for f in flags)), k) for flags in correct_per_prompt])
    )


def mean_accuracy(correct_per_prompt: Sequence[Sequence[bool]]) -> float:
    """mean@K: mean single-sample accuracy.

    Each prompt's accuracy is the mean over its samples, then prompts are
    averaged with equal weight; with the same K for every prompt (the normal
    case) this equals the pooled mean over all samples.
    """
    _check_nonempty(correct_per_prompt, "correct_per_prompt")
    per_prompt = []
    for flags in correct_per_prompt:
        if len(flags) == 0:
            raise ValueError("a prompt has no samples; pass at least one sample per prompt.")
        per_prompt.append(np.mean([bool(f) for f in flags]))
    return float(np.mean(per_prompt))


def greedy_accuracy(answers: Sequence[str | None], golds: Sequence[str]) -> float:
    """Fraction of prompts whose single (greedy) answer equals the gold; failed extractions are wrong."""
    _check_nonempty(answers, "answers")
    _check_same_length(answers, golds, "answers", "golds")
    hits = 0
    for a, gold in zip(answers, golds):
        _check_gold(gold)
        hits += (not is_failed(a)) and a == gold
    return hits / len(golds)


# --------------------------------------------------------------------------- #
# 2. Conformal dynamic k on eval prompts
# --------------------------------------------------------------------------- #


def dynamic_k(
    score: str,
    grid: Sequence[int],
    thresholds_qhat: Mapping[int, float],
    outcomes_per_prompt: Sequence[Sequence[Any]],
    rng: random.Random | None,
) -> list[int]:
    """Budget the trainer's stopping rule would pick for each eval prompt.

    Applies ``calibration.stopping_budget`` to prefixes of the same
    ``max(grid)`` samples, so each prompt's choice is what an incremental
    sampler would have stopped at. ``outcomes_per_prompt`` holds extracted
    answers for ``"aps"`` and per-sample pass booleans for execution scores.
    ``rng`` (a ``random.Random``; required for ``"aps"``, ignored otherwise)
    is consumed prompt by prompt in order, so a seeded generator reproduces
    the choices exactly.
    """
    _check_score(score)
    grid = _check_grid(grid)
    _check_nonempty(outcomes_per_prompt, "outcomes_per_prompt")
    missing = [k for k in grid if k not in thresholds_qhat]
    if missing:
        raise ValueError(f"thresholds_qhat lacks budgets {missing}; fit thresholds on the same grid.")
    k_max = grid[-1]
    chosen = []
    for outcomes in outcomes_per_prompt:
        # Shorter lists would make the largest budgets unreachable, biasing k down.
        if len(outcomes) < k_max:
            raise ValueError(
                f"a prompt has {len(outcomes)} samples but max(grid)={k_max}; sample max(grid) per eval prompt."
            )
        chosen.append(int(calibration.stopping_budget(score, grid, thresholds_qhat, outcomes, rng=rng)))
    return chosen


def _histogram(chosen: Iterable[int], grid: Sequence[int]) -> dict[int, int]:
    hist = {int(k): 0 for k in grid}
    for k in chosen:
        hist[int(k)] += 1
    return hist


def dynamic_k_summary(
    score: str,
    grid: Sequence[int],
    thresholds_qhat: Mapping[int, float],
    outcomes_per_prompt: Sequence[Sequence[Any]],
    rng: random.Random | None,
    golds: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Accuracy, mean budget and budget histogram under the conformal dynamic k.

    Accuracy at each prompt's chosen k is:

    * ``"aps"``: the majority answer over the first k answers equals the gold
      (``golds`` required);
    * execution scores: a passing completion exists among the first k.

    Returns a dict with ``accuracy``, ``mean_k`` (eval rollouts per prompt),
    ``histogram`` (every grid budget present, zero counts included),
    ``chosen_k`` (per prompt) and ``n_prompts``.
    """
    if score == "aps":
        if golds is None:
            raise ValueError("score 'aps' needs golds to judge the majority answer; pass golds.")
        _check_same_length(outcomes_per_prompt, golds, "outcomes_per_prompt", "golds")
        for gold in golds:
            _check_gold(gold)
    chosen = dynamic_k(score, grid, thresholds_qhat, outcomes_per_prompt, rng)
    if score == "aps":
        hits = []
        for answers, gold, k in zip(outcomes_per_prompt, golds, chosen):
            maj = majority_answer(answers, k)
            hits.append(maj is not None and maj == gold)
    else:
        hits = [any(bool(p) for p in passes[:k]) for passes, k in zip(outcomes_per_prompt, chosen)]
    return {
        "accuracy": float(np.mean(hits)),
        "mean_k": float(np.mean(chosen)),
        "histogram": _histogram(chosen, _check_grid(grid)),
        "chosen_k": chosen,
        "n_prompts": len(chosen),
    }


# --------------------------------------------------------------------------- #
# 3. Coverage
# --------------------------------------------------------------------------- #


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
    _check_delta(delta)
    if not _is_int(n_cal) or n_cal < 1:
        raise ValueError(f"n_cal must be a positive integer, got {n_cal!r}; pass the calibration set size.")
    scores = _score_array(eval_scores_at_k, "eval_scores_at_k")
    if scores.size == 0:
        raise ValueError("eval_scores_at_k is empty; pass one score per eval prompt.")
    if math.isnan(float(qhat_k)):
        raise ValueError("qhat_k is NaN; refit the thresholds on a non-empty calibration set.")
    n_covered = int(np.sum(scores <= float(qhat_k)))
    n_eval = int(scores.size)
    ci_low, ci_high = _binomial_ci(n_covered, n_eval)
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


def coverage_table(
    eval_scores_by_k: Mapping[int, Sequence[float]],
    qhat: Mapping[int, float],
    delta: float,
    n_cal: int,
) -> pd.DataFrame:
    """Per-budget coverage (the quantity the split-conformal theorem bounds) as a table.

    ``eval_scores_by_k`` has the shape ``calibration.calibration_scores``
    returns, computed on eval prompts; ``qhat``, ``delta`` and ``n_cal`` are
    ``Thresholds.qhat``, ``.delta`` and ``.n_calibration``. One row per k,
    sorted by k, with plain-language column names; see :func:`coverage_at_k`
    for what the band means.
    """
    if not eval_scores_by_k:
        raise ValueError("eval_scores_by_k is empty; pass scores for at least one budget.")
    missing = [k for k in eval_scores_by_k if k not in qhat]
    if missing:
        raise ValueError(f"qhat lacks budgets {sorted(missing)}; fit thresholds on the same grid.")
    rows = []
    for k in sorted(eval_scores_by_k):
        c = coverage_at_k(eval_scores_by_k[k], qhat[k], delta, n_cal)
        rows.append(
            {
                "budget k": int(k),
                "eval prompts": c["n_eval"],
                "covered prompts": c["n_covered"],
                "coverage": c["coverage"],
                "nominal coverage (1 - delta)": c["nominal"],
                "theoretical band low": c["band_low"],
                "theoretical band high": c["band_high"],
                "band applies (n_cal large enough)": c["band_valid"],
                "95% CI low (Clopper-Pearson)": c["ci_low"],
                "95% CI high (Clopper-Pearson)": c["ci_high"],
            }
        )
    return pd.DataFrame(rows)


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
    _check_nonempty(chosen_k, "chosen_k")
    covered = 0
    for i, k in enumerate(chosen_k):
        if k not in eval_scores_by_k or k not in qhat:
            raise ValueError(f"chosen budget {k} has no eval scores or qhat; use the grid the scores were computed on.")
        scores_k = eval_scores_by_k[k]
        _check_same_length(scores_k, chosen_k, f"eval_scores_by_k[{k}]", "chosen_k")
        s = float(scores_k[i])
        if math.isnan(s):
            raise ValueError(f"eval score of prompt {i} at k={k} is NaN; recompute the scores.")
        covered += s <= float(qhat[k])
    n = len(chosen_k)
    ci_low, ci_high = _binomial_ci(covered, n)
    return {
        "coverage_post_selection": covered / n,
        "n_covered": covered,
        "n_eval": n,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "covered_by_theorem": False,
    }


# --------------------------------------------------------------------------- #
# 4. Cost accounting (generated rollouts: every sampled completion counts)
# --------------------------------------------------------------------------- #


def _total(counts: int | Iterable[int], name: str) -> int:
    """Sum of a count or per-step counts, refusing negatives and non-integers."""
    # Anything not iterable is treated as one total so a float is reported, not a TypeError.
    values = list(counts) if isinstance(counts, Iterable) else [counts]
    for v in values:
        if not _is_int(v):
            raise ValueError(f"{name} holds {v!r}, not an integer count; pass whole numbers of rollouts/groups.")
        if v < 0:
            raise ValueError(f"{name} holds a negative count {v}; counts must be >= 0.")
    return int(sum(values))


def _check_k_max(k_max: int) -> None:
    if not _is_int(k_max) or k_max < 1:
        raise ValueError(f"k_max must be a positive integer, got {k_max!r}; pass max(grid).")


def _positive_groups(groups: int | Iterable[int]) -> int:
    total = _total(groups, "groups")
    if total == 0:
        raise ValueError("groups totals 0; pass the number of prompt groups trained on (> 0).")
    return total


def rollouts_generated(generated_per_step: int | Iterable[int]) -> int:
    """Total rollouts *generated* (every sampled completion, kept or discarded) over training steps."""
    return _total(generated_per_step, "generated_per_step")


def rollout_savings(
    generated: int | Iterable[int], groups: int | Iterable[int], k_max: int
) -> float:
    """Generation-only savings ``1 - generated / (groups * k_max)``.

    Relative to fixed-group GRPO with ``G = k_max = max(grid)`` over the same
    prompt groups. ``generated`` counts every sampled completion, never only
    the kept ones. Either argument may be a total or per-step counts.
    Calibration rollouts are excluded; see
    :func:`rollout_savings_with_calibration`.
    """
    _check_k_max(k_max)
    return 1.0 - _total(generated, "generated") / (_positive_groups(groups) * int(k_max))


def rollout_savings_with_calibration(
    generated_train: int | Iterable[int],
    generated_calibration: int | Iterable[int],
    groups: int | Iterable[int],
    k_max: int,
) -> float:
    """Savings ``1 - (generated_train + generated_calibration) / (groups * k_max)``.

    Charges the calibration rollouts to C-GRPO; can be negative when
    calibration costs more than training saved. All counts are *generated*
    completions.
    """
    _check_k_max(k_max)
    used = _total(generated_train, "generated_train") + _total(generated_calibration, "generated_calibration")
    return 1.0 - used / (_positive_groups(groups) * int(k_max))


def rollouts_per_prompt(
    generated_train: int | Iterable[int],
    generated_calibration: int | Iterable[int],
    groups: int | Iterable[int],
) -> float:
    """Generated rollouts per training prompt, calibration included (the Pareto-plot x-axis)."""
    used = _total(generated_train, "generated_train") + _total(generated_calibration, "generated_calibration")
    return used / _positive_groups(groups)


def nearest_admissible_g(target: float, batch_size: int, allowed_min: int = 2) -> int:
    """Group size G closest to ``target`` with ``batch_size % G == 0`` and ``G >= allowed_min``.

    This is the compute-matched fixed-G GRPO baseline (e.g. ``target`` =
    C-GRPO's rollouts per prompt). Ties go to the larger G.
    """
    t = float(target)
    if not math.isfinite(t) or t <= 0:
        raise ValueError(f"target must be a positive finite number, got {target!r}; pass rollouts per prompt.")
    if not _is_int(batch_size) or batch_size < 1:
        raise ValueError(
            f"batch_size must be a positive integer, got {batch_size!r}; pass the generation batch size."
        )
    if not _is_int(allowed_min) or allowed_min < 1:
        raise ValueError(f"allowed_min must be a positive integer, got {allowed_min!r}; pass e.g. 2.")
    candidates = [g for g in range(int(allowed_min), int(batch_size) + 1) if batch_size % g == 0]
    if not candidates:
        raise ValueError(
            f"batch_size {batch_size} has no divisor >= {allowed_min}; raise batch_size or lower allowed_min."
        )
    # Sorting key (distance, -g) makes the larger G win ties.
    return min(candidates, key=lambda g: (abs(g - t), -g))


# --------------------------------------------------------------------------- #
# 5. Confidence intervals across seeds
# --------------------------------------------------------------------------- #


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
    _check_same_length(t, b, "treatment", "baseline")
    return mean_ci(np.asarray(t, dtype=float) - np.asarray(b, dtype=float), confidence)
