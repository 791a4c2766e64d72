"""The calibration-free rules: they stop on agreement among the outcomes drawn so far, or at a fixed group size.

For the ``"aps"`` score "agree" means the same extracted answer; a failed extraction (None) never forms an answer but
counts among the draws, so failures make stopping harder, never easier. For the execution scores the agreeing outcome
is a pass: like the conformal rule, these rules never stop a prompt without a pass (more draws may still solve it).
None of them draws random numbers.

Each says exactly where it could still stop (:meth:`~cgrpo.stopping.StoppingRule.could_stop`): the rules on the leading
answer's share or count by repeating the leader, the window rule by the agreement of the draws its window keeps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from scipy.special import betainc

from ..calibration import SCORES
from .base import StoppingRule, register, repeat_leader

__all__ = ["AdaptiveConsistencyRule", "ShareRule", "UnanimousRule", "WindowRule", "top_share"]


def _top_two(score: str, outcomes: Sequence) -> tuple[int, int]:
    """Counts of the two most frequent agreeing outcomes: answers (``"aps"``), or passes and fails."""
    if score == "aps":
        counts = sorted(Counter(answer for answer in outcomes if answer is not None).values(), reverse=True)
        return (counts + [0, 0])[0], (counts + [0, 0])[1]
    passes = sum(bool(passed) for passed in outcomes)
    return passes, len(outcomes) - passes


def top_share(score: str, k: int, outcomes: Sequence) -> float:
    """Share of the first ``k`` outcomes held by the most frequent extracted answer (``"aps"``) or by passes.

    Failed extractions (None) count in the denominator only. Raises ValueError on an unknown score or fewer than
    ``k`` outcomes.
    """
    if score not in SCORES:
        raise ValueError(f"Unknown score {score!r}; use one of {', '.join(SCORES)}.")
    if not 1 <= k <= len(outcomes):
        raise ValueError(f"k must lie in [1, {len(outcomes)}] for {len(outcomes)} outcomes, got {k}.")
    return _top_two(score, outcomes[:k])[0] / k


def _all_agree(score: str, outcomes: Sequence) -> bool:
    return len(outcomes) > 0 and top_share(score, len(outcomes), outcomes) == 1.0


@register
class UnanimousRule(StoppingRule):
    """Stop at the first budget where all ``k`` outcomes agree (one extracted answer, none failed; or all pass).

    The conformal rule with every ``qhat_k = 1``. Outcomes are nested prefixes, so after two different answers
    unanimity never holds again: a prompt stops at the first budget or at the largest.
    """

    name = "unanimous"
    label = "Unanimous stop"

    def stops(self, k, outcomes, rewards, fit, rng) -> bool:
        return _all_agree(self.score, outcomes[:k])

    def could_stop(self, j, outcomes, rewards, fit) -> bool:
        return _could_stop_by_leader(self, j, outcomes, fit)


@register
class ShareRule(StoppingRule):
    """Stop where the most frequent answer holds at least a share ``tau`` of the ``k`` outcomes; ``tau = 1`` is
    ``unanimous``. A `CGRPOConfig` without ``stopping_options["tau"]`` takes ``tau`` from ``stop_share``."""

    name = "share"
    label = "Majority-share stop"
    parameter = "tau"
    sweep = (0.6, 0.75, 0.9)
    defaults = {"tau": 0.75}

    def check_options(self) -> None:
        tau = self.options["tau"]
        if not (isinstance(tau, (int, float)) and 0.0 < tau <= 1.0):
            raise ValueError(f"The share rule's tau must lie in (0, 1], got {tau!r}.")

    @classmethod
    def from_config(cls, args) -> ShareRule:
        return cls(args.score, **{"tau": args.stop_share, **(args.stopping_options or {})})

    def stops(self, k, outcomes, rewards, fit, rng) -> bool:
        share = top_share(self.score, k, outcomes)
        return share > 0 and share >= self.options["tau"]

    def could_stop(self, j, outcomes, rewards, fit) -> bool:
        return _could_stop_by_leader(self, j, outcomes, fit)


@register
class WindowRule(StoppingRule):
    """Early-stopping self-consistency (Li et al., ICLR 2024): stop when the latest ``window`` outcomes all agree.

    Unlike ``unanimous``, a disagreement early on does not rule out stopping later: only the last ``window`` draws
    before the budget count. A budget smaller than the window never stops.
    """

    name = "esc"
    label = "ESC window stop"
    parameter = "window"
    sweep = (2, 4, 8)
    defaults = {"window": 4}

    def check_options(self) -> None:
        window = self.options["window"]
        if not (isinstance(window, int) and not isinstance(window, bool) and window >= 2):
            raise ValueError(f"The esc rule's window must be an integer of at least 2, got {window!r}.")

    def stops(self, k, outcomes, rewards, fit, rng) -> bool:
        window = self.options["window"]
        return k >= window and _all_agree(self.score, outcomes[k - window : k])

    def could_stop(self, j, outcomes, rewards, fit) -> bool:
        # New draws can all agree with the window's old draws, and the window needs nothing else.
        window = self.options["window"]
        kept = outcomes[max(j - window, 0) :]
        return j >= window and (not kept or _all_agree(self.score, kept))


@register
class AdaptiveConsistencyRule(StoppingRule):
    """Adaptive-Consistency (Aggarwal et al., EMNLP 2023) with its Beta criterion.

    With ``v1`` and ``v2`` draws of the two most frequent answers (for the execution scores, passes and fails), stop
    when the posterior probability that the leading answer is the majority, ``P(p1 > p2)`` under ``Beta(v1 + 1,
    v2 + 1)``, reaches ``confidence``.
    """

    name = "adaptive"
    label = "Adaptive-Consistency"
    parameter = "confidence"
    sweep = (0.8, 0.9, 0.95, 0.99)
    defaults = {"confidence": 0.95}

    def check_options(self) -> None:
        confidence = self.options["confidence"]
        if not (isinstance(confidence, (int, float)) and 0.5 < confidence < 1.0):
            raise ValueError(f"The adaptive rule's confidence must lie in (0.5, 1), got {confidence!r}.")

    def stops(self, k, outcomes, rewards, fit, rng) -> bool:
        first, second = _top_two(self.score, outcomes[:k])
        # P(X > 1/2) for X ~ Beta(a, b) is the regularised incomplete beta I_{1/2}(b, a).
        return first > 0 and betainc(second + 1, first + 1, 0.5) >= self.options["confidence"]

    def could_stop(self, j, outcomes, rewards, fit) -> bool:
        # Every continuation leaves the leader at most its count plus the new draws and the runner-up at least its
        # count; repeating the leader reaches both bounds, and the posterior grows with the first, falls with the second.
        return _could_stop_by_leader(self, j, outcomes, fit)


def _could_stop_by_leader(rule: StoppingRule, j: int, outcomes, fit) -> bool:
    """Whether ``rule`` stops at ``j`` when every new draw repeats the leading answer (or passes)."""
    return rule.stops(j, repeat_leader(rule.score, outcomes, j), None, fit, None)
