"""Accuracy on already-extracted answers: majority vote, maj@k, unbiased pass@k, mean@K, greedy accuracy, and the
accuracy of the conformal dynamic k.

Answers are per-prompt lists of extracted answers (``None`` or ``""`` when the extractor failed); matching is exact
string equality, since normalisation belongs to the extractor.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ...calibration import sorted_grid, stopping_budgets
from .checks import check_gold, check_k, check_nonempty, check_same_length, is_failed, is_integer

__all__ = [
    "correct_flags",
    "dynamic_k_summary",
    "greedy_accuracy",
    "is_failed",
    "maj_at_k",
    "majority_answer",
    "mean_accuracy",
    "mean_pass_at_k",
    "pass_at_k",
]


def majority_answer(answers: Sequence[str | None], k: int) -> str | None:
    """Majority answer over the first ``k`` extracted answers.

    Failed extractions never win. Ties are broken by first appearance among
    the first ``k``, so the result does not depend on hash order. Returns
    ``None`` when all of the first ``k`` failed.
    """
    check_k(k, len(answers))
    prefix = [a for a in answers[:k] if not is_failed(a)]
    if not prefix:
        return None
    counts = Counter(prefix)
    best = max(counts.values())
    # Counter preserves insertion order, i.e. first appearance.
    return next(a for a, c in counts.items() if c == best)


def correct_flags(answers: Sequence[str | None], gold: str) -> list[bool]:
    """Per-sample correctness (exact match with ``gold``); failed extractions are wrong."""
    check_gold(gold)
    return [(not is_failed(a)) and a == gold for a in answers]


def maj_at_k(answers_per_prompt: Sequence[Sequence[str | None]], golds: Sequence[str], k: int) -> float:
    """maj@k: fraction of prompts whose majority over the first ``k`` answers equals the gold."""
    check_nonempty(answers_per_prompt, "answers_per_prompt")
    check_same_length(answers_per_prompt, golds, "answers_per_prompt", "golds")
    hits = 0
    for answers, gold in zip(answers_per_prompt, golds):
        check_gold(gold)
        maj = majority_answer(answers, k)
        hits += maj is not None and maj == gold
    return hits / len(golds)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimator ``1 - C(n-c, k) / C(n, k)`` from ``n`` samples with ``c`` correct.

    Computed in product form, ``1 - prod_{i=n-c+1}^{n} (1 - k/i)``, which avoids
    the huge binomials of the direct formula.
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if not is_integer(v):
            raise ValueError(f"{name} must be an integer, got {v!r}; pass sample counts as ints.")
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}; pass the number of samples drawn.")
    if not 0 <= c <= n:
        raise ValueError(f"c={c} is outside [0, n={n}]; pass the number of correct samples.")
    check_k(k, n, "samples")
    if n - c < k:
        # Every size-k subset contains a correct sample.
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=float)))


def mean_pass_at_k(correct_per_prompt: Sequence[Sequence[bool]], k: int) -> float:
    """Mean over prompts of the unbiased pass@k, each prompt using all of its samples."""
    check_nonempty(correct_per_prompt, "correct_per_prompt")
    return float(np.mean([pass_at_k(len(flags), int(sum(bool(f) for f in flags)), k) for flags in correct_per_prompt]))


def mean_accuracy(correct_per_prompt: Sequence[Sequence[bool]]) -> float:
    """mean@K: mean single-sample accuracy.

    Each prompt's accuracy is the mean over its samples, then prompts are
    averaged with equal weight; with the same K for every prompt (the normal
    case) this equals the pooled mean over all samples.
    """
    check_nonempty(correct_per_prompt, "correct_per_prompt")
    per_prompt = []
    for flags in correct_per_prompt:
        if len(flags) == 0:
            raise ValueError("a prompt has no samples; pass at least one sample per prompt.")
        per_prompt.append(np.mean([bool(f) for f in flags]))
    return float(np.mean(per_prompt))


def per_prompt_accuracy(
    greedy: Sequence[bool], correct_per_prompt: Sequence[Sequence[bool]], majority_correct: Sequence[bool]
) -> dict[str, list[float]]:
    """Each eval prompt's greedy, majority-vote and sampled (mean over its samples) accuracy, under the names of the
    summary columns they average to, so that intervals can resample prompts as well as seeds."""
    check_same_length(greedy, correct_per_prompt, "greedy", "correct_per_prompt")
    check_same_length(greedy, majority_correct, "greedy", "majority_correct")
    return {
        "eval_greedy_acc": [float(flag) for flag in greedy],
        "eval_maj_acc": [float(flag) for flag in majority_correct],
        "eval_mean_at_k": [float(np.mean([bool(f) for f in flags])) for flags in correct_per_prompt],
    }


def greedy_accuracy(answers: Sequence[str | None], golds: Sequence[str]) -> float:
    """Fraction of prompts whose single (greedy) answer equals the gold; failed extractions are wrong."""
    check_nonempty(answers, "answers")
    check_same_length(answers, golds, "answers", "golds")
    hits = 0
    for a, gold in zip(answers, golds):
        check_gold(gold)
        hits += (not is_failed(a)) and a == gold
    return hits / len(golds)


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
        check_same_length(outcomes_per_prompt, golds, "outcomes_per_prompt", "golds")
        for gold in golds:
            check_gold(gold)
    chosen = stopping_budgets(score, grid, thresholds_qhat, outcomes_per_prompt, rng)
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
        "histogram": _histogram(chosen, sorted_grid(grid)),
        "chosen_k": chosen,
        "n_prompts": len(chosen),
    }
