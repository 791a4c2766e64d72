"""Calibrating and applying C-GRPO's per-budget conformal stopping thresholds.

Shared by the trainer (which decides online how many rollouts a prompt gets)
and by the offline evaluation (which replays the same rule on logged
outcomes), so both must go through these functions to agree.

Three nonconformity scores are supported (see :data:`SCORES`):

* ``"aps"``: outcomes are extracted answers (``str`` or ``None``) and the
  score is :func:`cgrpo.conformal.aps_score` of the gold answer;
* ``"first_success"`` and ``"pass_rate"``: outcomes are verifier passes
  (booleans), scored by :func:`cgrpo.conformal.first_success_score` and
  :func:`cgrpo.conformal.pass_rate_score`.
"""

from __future__ import annotations

import logging
import numbers
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .conformal import (
    AUTO_DELTA_HIGH,
    AUTO_DELTA_LOW,
    DELTA_MARGIN,
    aps_score,
    conformal_quantile,
    conformal_rank,
    first_success_score,
    pass_rate_score,
    resolves_singleton,
    select_delta_auto,
    smallest_supported_delta,
)

logger = logging.getLogger(__name__)

__all__ = [
    "SCORES",
    "Thresholds",
    "calibration_scores",
    "example_scores",
    "fit_thresholds",
    "should_stop",
    "sorted_grid",
    "stopping_budget",
    "stopping_budgets",
    "training_grid",
    "unanimous_solve_counts",
]

SCORES = ("aps", "first_success", "pass_rate")

_PASS_SCORES = {"first_success": first_success_score, "pass_rate": pass_rate_score}


@dataclass(frozen=True)
class Thresholds:
    """Fitted stopping thresholds.

    Attributes:
        delta: miscoverage level the thresholds were fitted at.
        qhat: budget k -> conformal threshold at that budget.
        solve_rate: fraction of examples solved within the largest budget,
            on the examples used to choose delta (all examples when delta was
            fixed or chosen without a split).
        n_calibration: number of examples the qhat were fitted on.
    """

    delta: float
    qhat: dict[int, float]
    solve_rate: float
    n_calibration: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly copy; ``qhat`` keys stay ints (``json`` turns them into strings)."""
        return {
            "delta": float(self.delta),
            "qhat": {int(k): float(v) for k, v in sorted(self.qhat.items())},
            "solve_rate": float(self.solve_rate),
            "n_calibration": int(self.n_calibration),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Thresholds:
        """Inverse of :meth:`to_dict`; accepts string budget keys as produced by a JSON round trip."""
        missing = [key for key in ("delta", "qhat", "solve_rate", "n_calibration") if key not in data]
        if missing:
            raise ValueError(
                f"Thresholds data lacks {', '.join(missing)}; pass a dict produced by Thresholds.to_dict()."
            )
        return cls(
            delta=float(data["delta"]),
            qhat={int(k): float(v) for k, v in data["qhat"].items()},
            solve_rate=float(data["solve_rate"]),
            n_calibration=int(data["n_calibration"]),
        )


def _check_score(score: str) -> None:
    if score not in SCORES:
        raise ValueError(f"Unknown score {score!r}; use one of {', '.join(SCORES)}.")


def training_grid(grid: Sequence[int]) -> list[int]:
    """:func:`sorted_grid` of a grid to train with, which must also start at 2 or more and hold two budgets or more.

    A prompt stopped at one completion forms a group of one row, whose advantage is always zero; with one budget, no
    prompt can stop early.
    """
    budgets = sorted_grid(grid)
    if budgets[0] < 2:
        raise ValueError(
            f"grid {list(grid)} contains {budgets[0]}: a prompt stopped at one completion forms a group of one row, "
            "whose advantage is always zero; start the grid at 2 or more."
        )
    if len(budgets) == 1:
        raise ValueError(
            f"grid {list(grid)} holds one budget, so no prompt can stop before it (that is GRPO with "
            f"{budgets[0]} completions per prompt); add another budget, e.g. {[2, budgets[0]] if budgets[0] > 2 else [2, 4]}."
        )
    return budgets


def sorted_grid(grid: Sequence[int]) -> list[int]:
    """The budgets of ``grid`` in ascending order; raises ValueError on an empty grid, a repeat or a non-positive one."""
    budgets = list(grid)
    if not budgets:
        raise ValueError("grid is empty; pass at least one rollout budget, e.g. [2, 4, 8].")
    for k in budgets:
        if not isinstance(k, numbers.Integral) or isinstance(k, bool) or k < 1:
            raise ValueError(f"grid contains {k!r}, not a positive integer; pass budgets such as [2, 4, 8].")
    if len(set(budgets)) != len(budgets):
        raise ValueError(f"grid {budgets} repeats a budget; pass each budget once.")
    return sorted(int(k) for k in budgets)


def _check_outcomes(outcomes: Sequence, kmax: int) -> None:
    if len(outcomes) < kmax:
        raise ValueError(
            f"Got {len(outcomes)} outcomes but the largest budget is {kmax}; pass at least {kmax} outcomes per example."
        )


def _check_aps_args(score: str, rng: random.Random | None) -> None:
    if score == "aps" and rng is None:
        raise ValueError("The 'aps' score is randomized; pass rng=random.Random(seed).")


def example_scores(
    score: str,
    grid: Sequence[int],
    outcomes: Sequence,
    gold: str | None = None,
    rng: random.Random | None = None,
) -> dict[int, float]:
    """Score one calibration example at every budget k in ``grid`` on its first k outcomes.

    For ``"aps"`` the outcomes are extracted answers (``str`` or ``None``),
    ``gold`` is the normalised gold answer and ``rng`` is required; budgets
    are scored in ascending order, consuming ``rng`` in that order. For
    ``"first_success"``/``"pass_rate"`` the outcomes are verifier passes and
    ``gold``/``rng`` are ignored.

    Returns:
        Budget k -> score, keys in ascending order.

    Raises:
        ValueError: on an unknown score, an invalid grid, fewer outcomes than
            the largest budget, or a missing gold/rng for ``"aps"``.
    """
    _check_score(score)
    budgets = sorted_grid(grid)
    _check_outcomes(outcomes, budgets[-1])
    _check_aps_args(score, rng)
    if score == "aps":
        if gold is None:
            raise ValueError("The 'aps' score needs the example's gold answer; pass gold=<normalised answer>.")
        return {k: aps_score(gold, outcomes, k, rng) for k in budgets}
    score_fn = _PASS_SCORES[score]
    return {k: score_fn(outcomes, k) for k in budgets}


def calibration_scores(
    score: str,
    grid: Sequence[int],
    outcomes_per_example: Sequence[Sequence],
    golds: Sequence[str] | None = None,
    rng: random.Random | None = None,
) -> dict[int, list[float]]:
    """:func:`example_scores` for every example, collected per budget.

    Lists keep the order of ``outcomes_per_example``. For ``"aps"`` the
    ``rng`` is consumed example by example, budgets ascending within each,
    so the result depends only on the seed and the data.

    Raises:
        ValueError: as :func:`example_scores`, or if ``"aps"`` is given no
            golds or a different number of golds than examples.
    """
    _check_score(score)
    budgets = sorted_grid(grid)
    _check_aps_args(score, rng)
    examples = list(outcomes_per_example)
    if score == "aps":
        if golds is None:
            raise ValueError("The 'aps' score needs gold answers; pass golds=[one per example].")
        if len(golds) != len(examples):
            raise ValueError(f"Got {len(golds)} golds for {len(examples)} examples; pass exactly one gold per example.")
        per_example = [
            example_scores(score, budgets, outcomes, gold=gold, rng=rng) for outcomes, gold in zip(examples, golds)
        ]
    else:
        per_example = [example_scores(score, budgets, outcomes) for outcomes in examples]
    return {k: [scores[k] for scores in per_example] for k in budgets}


def fit_thresholds(
    scores_by_k: Mapping[int, Sequence[float]],
    delta: float | None,
    delta_margin: float = DELTA_MARGIN,
    split_delta: bool = False,
) -> Thresholds:
    """Fit qhat_k = conformal_quantile(scores at k, delta) for every budget.

    With ``delta=None`` delta is chosen by
    :func:`cgrpo.conformal.select_delta_auto` from the scores at the largest
    budget, never below the smallest delta the fitted examples support
    (:func:`cgrpo.conformal.smallest_supported_delta`); a fixed delta below
    it gives qhat = 1.0 at every budget and logs a warning. With
    ``delta=None`` and ``split_delta=True``, delta is chosen on
    the first ``n // 2`` examples and the thresholds are fitted on the
    remaining ones, so the data that picked delta does not also set the
    thresholds; ``split_delta`` is ignored when delta is fixed.

    Raises:
        ValueError: if ``scores_by_k`` is empty, has invalid budgets or lists
            of different lengths, ``delta`` is outside (0, 1), or a split is
            requested with fewer than 2 examples.
    """
    if not scores_by_k:
        raise ValueError("scores_by_k is empty; pass {budget: [score per example]} from calibration_scores.")
    budgets = sorted_grid(list(scores_by_k))
    columns = {k: [float(s) for s in scores_by_k[k]] for k in budgets}
    n = len(columns[budgets[0]])
    if any(len(col) != n for col in columns.values()):
        lengths = {k: len(col) for k, col in columns.items()}
        raise ValueError(
            f"Score lists differ in length across budgets {lengths}; pass one score per example at every budget."
        )
    kmax = budgets[-1]

    if delta is None and split_delta:
        if n < 2:
            raise ValueError(f"split_delta needs at least 2 examples, got {n}; add examples or pass split_delta=False.")
        half = n // 2
        fit_columns = {k: col[half:] for k, col in columns.items()}
        chosen_delta, solve_rate = _auto_delta(columns[kmax][:half], delta_margin, n - half)
    elif delta is None:
        fit_columns = columns
        chosen_delta, solve_rate = _auto_delta(columns[kmax], delta_margin, n)
    else:
        chosen_delta = delta
        solve_rate = sum(1 for s in columns[kmax] if s < 1.0) / n if n else 0.0
        fit_columns = columns

    # conformal_quantile validates delta, including a fixed one passed in.
    qhat = {k: conformal_quantile(col, chosen_delta) for k, col in fit_columns.items()}
    if delta is not None:
        _warn_if_unsupported(delta, n)
    return Thresholds(
        delta=float(chosen_delta),
        qhat=qhat,
        solve_rate=float(solve_rate),
        n_calibration=len(fit_columns[kmax]),
    )


def _auto_delta(scores_at_kmax: list[float], margin: float, n_fit: int) -> tuple[float, float]:
    return select_delta_auto(scores_at_kmax, margin=margin, low=_auto_delta_floor(n_fit))


def _auto_delta_floor(n_fit: int) -> float:
    # The automatic delta never goes below what the n_fit examples that set the thresholds can certify.
    return max(AUTO_DELTA_LOW, smallest_supported_delta(n_fit))


def unanimous_solve_counts(n: int, margin: float) -> list[int]:
    """The numbers of solved calibration examples, out of ``n`` that fit the thresholds, at which the automatic delta
    (:func:`fit_thresholds` with ``delta=None``) leaves every threshold at 1.0, the unanimous rule.

    An example is solved when its score at the largest budget is below 1. With ``solved`` of ``n`` solved, the
    automatic delta asks for the ``conformal_rank(n, delta)``-th smallest score; when that rank exceeds ``solved``,
    the threshold of the largest budget is 1.0, and those of the smaller budgets, whose scores are no lower, too.
    Computed without scores, so that a trainer can warn about its calibration set before any is drawn.
    """
    counts = []
    for solved in range(1, n):
        delta = min(max(1.0 - solved / n + margin, _auto_delta_floor(n)), AUTO_DELTA_HIGH)
        if conformal_rank(n, delta) > solved:
            counts.append(solved)
    return counts


def _warn_if_unsupported(delta: float, n: int) -> None:
    if delta < smallest_supported_delta(n):
        logger.warning(
            "delta=%g is below 1/(n+1)=%.4f for n=%d calibration examples: no threshold certifies it, so every qhat "
            "is 1.0 and prompts stop only when all answers agree; use delta >= %.4f or more calibration examples.",
            delta,
            smallest_supported_delta(n),
            n,
            smallest_supported_delta(n),
        )


def should_stop(
    score: str,
    k: int,
    qhat_k: float,
    outcomes: Sequence,
    rng: random.Random | None = None,
) -> bool:
    """Whether a prompt's first ``k`` outcomes are enough under threshold ``qhat_k``.

    ``"aps"``: the APS prediction set is a single answer with mass >= qhat_k
    (``rng`` required). ``"first_success"``/``"pass_rate"``: at least one
    pass among the first k and the score at k is <= qhat_k; requiring a pass
    keeps an all-fail prefix from stopping when qhat_k happens to be 1.

    Raises:
        ValueError: on an unknown score, a missing rng for ``"aps"``, or an
            invalid ``k``.
    """
    _check_score(score)
    _check_aps_args(score, rng)
    if score == "aps":
        return resolves_singleton(outcomes, k, qhat_k, rng)
    value = _PASS_SCORES[score](outcomes, k)
    return any(bool(p) for p in outcomes[:k]) and value <= qhat_k


def stopping_budget(
    score: str,
    grid: Sequence[int],
    qhat: Mapping[int, float],
    outcomes: Sequence,
    rng: random.Random | None = None,
) -> int:
    """Smallest budget in ``grid`` at which :func:`should_stop` holds; ``max(grid)`` if none.

    Budgets are tried in ascending order (consuming ``rng`` in that order for
    ``"aps"``) and the search stops at the first success.

    Raises:
        ValueError: on an unknown score, an invalid grid, a budget without a
            threshold in ``qhat``, fewer outcomes than ``max(grid)``, or a
            missing rng for ``"aps"``.
    """
    _check_score(score)
    budgets = sorted_grid(grid)
    missing = [k for k in budgets if k not in qhat]
    if missing:
        raise ValueError(f"qhat has no threshold for budgets {missing}; fit thresholds on the same grid.")
    _check_outcomes(outcomes, budgets[-1])
    _check_aps_args(score, rng)
    for k in budgets:
        if should_stop(score, k, qhat[k], outcomes, rng):
            return k
    return budgets[-1]


def stopping_budgets(
    score: str,
    grid: Sequence[int],
    qhat: Mapping[int, float],
    outcomes_per_prompt: Sequence[Sequence],
    rng: random.Random | None = None,
) -> list[int]:
    """:func:`stopping_budget` of every prompt: the budget the trainer's rule picks on prefixes of its outcomes.

    This is how the evaluation replays the trainer's incremental sampling on ``max(grid)`` samples per prompt. For
    ``"aps"`` the ``rng`` is consumed prompt by prompt, in order, so a seeded generator reproduces the choices.

    Raises:
        ValueError: as :func:`stopping_budget`, or if ``outcomes_per_prompt`` is empty.
    """
    if not outcomes_per_prompt:
        raise ValueError("outcomes_per_prompt is empty; pass the outcomes of at least one prompt.")
    return [stopping_budget(score, grid, qhat, outcomes, rng) for outcomes in outcomes_per_prompt]
