"""Split-conformal primitives for C-GRPO's per-prompt rollout budgets.

Everything here is pure: functions take their inputs (and, where randomized,
an explicit ``random.Random``) and return values without touching global
state, so the trainer and the offline evaluation reproduce each other exactly
given the same seed.

Conventions shared by the answer-based functions:

* ``answers`` are extracted final answers, already normalised by the caller
  and compared with ``==``. ``None`` and ``""`` mean the extraction failed:
  such completions count in the budget ``k`` (the denominator) but carry no
  probability mass, so a prompt whose completions mostly fail to produce an
  answer is never mistaken for a confidently solved one.
* Distinct answers are ranked by decreasing empirical probability; equal
  probabilities are ordered by one ``rng.random()`` draw per distinct answer,
  taken in order of first appearance (ascending draw ranks first).
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Hashable, Sequence

import numpy as np

__all__ = [
    "AUTO_DELTA_HIGH",
    "AUTO_DELTA_LOW",
    "DELTA_MARGIN",
    "aps_score",
    "conformal_quantile",
    "conformal_rank",
    "first_success_score",
    "pass_rate_score",
    "prediction_set",
    "resolves_singleton",
    "select_delta_auto",
    "smallest_supported_delta",
]

Answer = Hashable | None

# Margin of the automatic delta over the share of prompts unsolved at the largest budget; CGRPOConfig.delta_margin
# and the pipeline's schema default to it.
DELTA_MARGIN = 0.05

# The automatic delta's bounds: :func:`select_delta_auto`'s defaults.
AUTO_DELTA_LOW, AUTO_DELTA_HIGH = 0.05, 0.95

# Guards the ceil in conformal_quantile against products such as
# 20 * 0.95 landing a hair above an integer and bumping the rank by one.
_CEIL_EPS = 1e-9


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_delta(delta: float, name: str = "delta") -> None:
    if not _is_real(delta) or not 0.0 < delta < 1.0:
        raise ValueError(f"{name} must be a number strictly between 0 and 1, got {delta!r}; pass e.g. 0.1.")


def _check_k(k: int, n_available: int, what: str) -> None:
    if not isinstance(k, numbers.Integral) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}; pass a budget of at least 1.")
    if k > n_available:
        raise ValueError(f"k={k} exceeds the {n_available} {what} given; pass at least k {what} or a smaller k.")


def _check_qhat(qhat: float) -> None:
    if not _is_real(qhat) or math.isnan(qhat):
        raise ValueError(f"qhat must be a real number, got {qhat!r}; pass a threshold from conformal_quantile.")


def _is_failed(answer: Answer) -> bool:
    return answer is None or (isinstance(answer, str) and answer == "")


def smallest_supported_delta(n: int) -> float:
    """The smallest miscoverage level that ``n`` calibration scores can certify: ``1 / (n + 1)``.

    Below it, ``ceil((n + 1)(1 - delta)) > n``: no order statistic of the scores reaches coverage
    ``1 - delta``, and :func:`conformal_quantile` returns the largest possible score.
    """
    return 1.0 / (n + 1)


def conformal_rank(n: int, delta: float) -> int:
    """The rank, ceil((n+1)(1-delta)) and at least 1, of the split-conformal threshold among ``n`` sorted scores.

    Above ``n`` no observed score reaches coverage ``1 - delta`` (see :func:`conformal_quantile`).
    """
    return max(math.ceil((n + 1) * (1.0 - delta) - _CEIL_EPS), 1)


def conformal_quantile(scores: Sequence[float], delta: float) -> float:
    """Split-conformal threshold: the ceil((n+1)(1-delta))-th smallest score.

    With n scores and an exchangeable test score s, P(s <= result) >= 1 - delta. When the rank
    exceeds n (``delta < 1 / (n + 1)``, see :func:`smallest_supported_delta`) no observed score
    gives that coverage, so the result is 1.0, the largest possible value of every nonconformity
    score in this package; the same holds for empty ``scores``.

    Raises:
        ValueError: if ``delta`` is not strictly between 0 and 1, or a score is NaN.
    """
    _check_delta(delta)
    arr = np.asarray(list(scores), dtype=float)
    n = arr.size
    if np.isnan(arr).any():
        raise ValueError("scores contain NaN; drop or recompute the NaN scores before calibrating.")
    rank = conformal_rank(n, delta)
    if rank > n:
        return 1.0
    return float(np.partition(arr, rank - 1)[rank - 1])


def _ranked_answers(answers: Sequence[Answer], k: int, rng: random.Random) -> list[tuple[Answer, int]]:
    """Distinct extracted answers among the first ``k``, with counts, in APS order.

    Consumes exactly one ``rng.random()`` per distinct non-failed answer, in
    order of first appearance, so callers that rank the same answers with
    identically seeded generators see identical tie-breaks.
    """
    _check_k(k, len(answers), "answers")
    counts: dict[Answer, int] = {}
    for answer in answers[:k]:
        if _is_failed(answer):
            continue
        counts[answer] = counts.get(answer, 0) + 1
    draws = {answer: rng.random() for answer in counts}
    # Sort on integer counts rather than count/k so ties are exact.
    return sorted(counts.items(), key=lambda item: (-item[1], draws[item[0]]))


def aps_score(gold: Answer, answers: Sequence[Answer], k: int, rng: random.Random) -> float:
    """Randomized APS nonconformity score of ``gold`` among the first ``k`` answers.

    Score = (mass of answers ranked strictly ahead of ``gold``) + U * p(gold),
    capped at 1.0, where p(answer) = count / k and U is one ``rng.random()``
    drawn after the tie-break draws. If ``gold`` is not among the first ``k``
    extracted answers the score is exactly 1.0.

    The generator is advanced identically whether or not ``gold`` is present
    (one draw per distinct extracted answer, then U), so the random stream
    downstream of a call does not depend on the gold answer.

    Raises:
        ValueError: if ``k`` is not a positive integer or exceeds ``len(answers)``.
    """
    ranked = _ranked_answers(answers, k, rng)
    u = rng.random()
    ahead = 0
    for answer, count in ranked:
        if answer == gold:
            # Integer numerators keep ahead/k exact up to one rounding.
            return min(1.0, ahead / k + u * (count / k))
        ahead += count
    return 1.0


def prediction_set(answers: Sequence[Answer], k: int, qhat: float, rng: random.Random) -> list[Answer]:
    """APS prediction set: ranked answers accumulated until their mass reaches ``qhat``.

    Answers are taken in the same order as in :func:`aps_score` (same
    tie-break draws); the answer whose mass makes the cumulative mass reach
    ``qhat`` is included. Failed extractions never enter the set, so if the
    extracted mass stays below ``qhat`` the set is every extracted answer.
    The set is never empty while at least one answer was extracted (for
    ``qhat <= 0`` it is the top answer alone), which keeps the stopping rule
    continuous as ``qhat`` approaches 0.

    Raises:
        ValueError: if ``k`` is invalid or ``qhat`` is not a real number.
    """
    _check_qhat(qhat)
    ranked = _ranked_answers(answers, k, rng)
    chosen: list[Answer] = []
    cumulative = 0
    for answer, count in ranked:
        chosen.append(answer)
        cumulative += count
        if cumulative / k >= qhat:
            break
    return chosen


def resolves_singleton(answers: Sequence[Answer], k: int, qhat: float, rng: random.Random) -> bool:
    """True iff the APS set is one answer whose own mass is at least ``qhat``.

    The mass condition matters when extractions fail: a lone extracted answer
    among failures forms a one-element set without being confident, and must
    not resolve the prompt. With ``qhat == 1.0`` all ``k`` answers must agree.
    """
    chosen = prediction_set(answers, k, qhat, rng)
    if len(chosen) != 1:
        return False
    mass = sum(1 for answer in answers[:k] if answer == chosen[0]) / k
    return mass >= qhat


def _check_passes(passes: Sequence[bool], k: int) -> list[bool]:
    _check_k(k, len(passes), "outcomes")
    return [bool(p) for p in passes[:k]]


def first_success_score(passes: Sequence[bool], k: int) -> float:
    """j*/k for the 1-based position j* of the first pass among the first ``k``; 1.0 if none.

    Raises:
        ValueError: if ``k`` is not a positive integer or exceeds ``len(passes)``.
    """
    for position, passed in enumerate(_check_passes(passes, k), start=1):
        if passed:
            return position / k
    return 1.0


def pass_rate_score(passes: Sequence[bool], k: int) -> float:
    """1 - (number of passes among the first ``k``) / k.

    Raises:
        ValueError: if ``k`` is not a positive integer or exceeds ``len(passes)``.
    """
    return 1.0 - sum(_check_passes(passes, k)) / k


def select_delta_auto(
    scores_at_kmax: Sequence[float],
    margin: float = DELTA_MARGIN,
    low: float = AUTO_DELTA_LOW,
    high: float = AUTO_DELTA_HIGH,
) -> tuple[float, float]:
    """Choose the miscoverage level from how often the largest budget solves a prompt.

    A prompt is solved when its score at the largest budget is strictly below
    1. Demanding coverage above the solve rate would force qhat to 1 for
    every budget, so delta = clip(1 - solve_rate + margin, low, high).

    Returns:
        (delta, solve_rate); solve_rate is 0.0 for empty input.

    Raises:
        ValueError: if ``low``/``high`` are not 0 < low <= high < 1, or
            ``margin`` is not a finite number.
    """
    _check_delta(low, "low")
    _check_delta(high, "high")
    if low > high:
        raise ValueError(f"low={low} exceeds high={high}; pass low <= high.")
    if not _is_real(margin) or not math.isfinite(margin):
        raise ValueError(f"margin must be a finite number, got {margin!r}; pass e.g. 0.05.")
    scores = list(scores_at_kmax)
    solve_rate = sum(1 for s in scores if s < 1.0) / len(scores) if scores else 0.0
    delta = min(max(1.0 - solve_rate + margin, low), high)
    return float(delta), float(solve_rate)
