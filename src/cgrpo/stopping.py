"""The stopping rules a prompt's budget-grid sampling can follow: the conformal rule and two calibration-free ones.

`CGRPOConfig.stopping_rule` picks one (see :data:`STOPPING_RULES`). All three look only at the outcomes drawn so far
for one prompt, at the budgets of the grid in ascending order, and draw the largest budget when none stops:

* ``"conformal"``: C-GRPO's rule, :func:`cgrpo.calibration.should_stop` with the calibrated threshold ``qhat_k``.
* ``"unanimous"``: stop at the first budget where all ``k`` outcomes agree: the same extracted answer, none failed
  (score ``"aps"``), or, for the execution scores, all ``k`` completions pass. This is what a conformal stop with
  ``qhat_k = 1`` amounts to for ``"aps"``. For pass/fail outcomes "agree" could also mean "all fail", but the conformal
  rule never stops a prompt without a pass (more draws may still solve it), and neither does this one.
* ``"share"``: stop at the first budget where the most frequent answer holds at least a share ``tau`` of the ``k``
  outcomes, as in early-stopping self-consistency and adaptive consistency. A failed extraction (None) never forms the
  most frequent answer but counts in the denominator ``k``, so failures make stopping harder, never easier. For the
  execution scores the share is that of passing completions. With ``tau = 1`` the rule is ``"unanimous"``.

The calibration-free rules are deterministic: they draw no random numbers, so they leave the stopping RNG untouched.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

from .calibration import SCORES, should_stop, sorted_grid

__all__ = ["CALIBRATION_FREE_RULES", "STOPPING_RULES", "free_stopping_budgets", "rule_stops", "top_share"]

STOPPING_RULES = ("conformal", "unanimous", "share")
CALIBRATION_FREE_RULES = ("unanimous", "share")


def top_share(score: str, k: int, outcomes: Sequence) -> float:
    """Share of the first ``k`` outcomes held by the most frequent extracted answer (``"aps"``) or by passes.

    Failed extractions (None) count in the denominator only. Raises ValueError on an unknown score or fewer than ``k``
    outcomes.
    """
    if score not in SCORES:
        raise ValueError(f"Unknown score {score!r}; use one of {', '.join(SCORES)}.")
    if not 1 <= k <= len(outcomes):
        raise ValueError(f"k must lie in [1, {len(outcomes)}] for {len(outcomes)} outcomes, got {k}.")
    first = outcomes[:k]
    if score == "aps":
        counts = Counter(answer for answer in first if answer is not None)
        return max(counts.values(), default=0) / k
    return sum(bool(passed) for passed in first) / k


def rule_stops(
    rule: str,
    score: str,
    k: int,
    outcomes: Sequence,
    *,
    qhat_k: float | None = None,
    tau: float = 1.0,
    rng: random.Random | None = None,
) -> bool:
    """Whether ``rule`` stops a prompt at budget ``k`` on its first ``k`` outcomes.

    ``qhat_k`` and ``rng`` serve the ``"conformal"`` rule (``rng`` for ``"aps"``), ``tau`` the ``"share"`` rule.

    Raises:
        ValueError: on an unknown rule, a conformal rule without a threshold, or as :func:`should_stop`.
    """
    if rule == "conformal":
        if qhat_k is None:
            raise ValueError("The conformal rule needs the budget's threshold; pass qhat_k from fitted Thresholds.")
        return should_stop(score, k, qhat_k, outcomes, rng)
    if rule not in CALIBRATION_FREE_RULES:
        raise ValueError(f"Unknown stopping rule {rule!r}; use one of {', '.join(STOPPING_RULES)}.")
    # A share needs at least one agreeing outcome; with tau = 1 it is unanimity.
    share = top_share(score, k, outcomes)
    return share > 0 and share >= (1.0 if rule == "unanimous" else tau)


def free_stopping_budgets(
    rule: str, score: str, grid: Sequence[int], outcomes_per_prompt: Sequence[Sequence], tau: float = 1.0
) -> list[int]:
    """The budget a calibration-free ``rule`` stops each prompt at, replayed on prefixes of its outcomes.

    What the trainer's incremental sampling picks: the first budget of ``grid`` where :func:`rule_stops` holds,
    ``max(grid)`` when none does. Each prompt needs at least ``max(grid)`` outcomes.
    """
    if rule not in CALIBRATION_FREE_RULES:
        raise ValueError(
            f"rule must be one of {', '.join(CALIBRATION_FREE_RULES)}, got {rule!r}; replay the "
            "conformal rule with cgrpo.calibration.stopping_budgets."
        )
    budgets = sorted_grid(grid)
    chosen = []
    for outcomes in outcomes_per_prompt:
        if len(outcomes) < budgets[-1]:
            raise ValueError(
                f"Got {len(outcomes)} outcomes for a prompt but the largest budget is {budgets[-1]}; "
                "pass at least that many per prompt."
            )
        chosen.append(next((k for k in budgets if rule_stops(rule, score, k, outcomes, tau=tau)), budgets[-1]))
    return chosen
