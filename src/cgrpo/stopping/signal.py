"""A calibrated rule that targets what GRPO needs: groups whose rewards differ.

GRPO learns only from a group whose rewards differ (otherwise every advantage is zero). A prompt whose first ``k``
rewards all agree may still reach a group with differing rewards at ``max(grid)``; this rule stops it when that is
unlikely, and it stops a prompt whose rewards already differ at the budget ``mixed_stop`` (its group has signal; more
draws only refine the advantage).

The fit, on calibration pools split in two halves in their order:

1. **Estimate.** On the first half, for each budget ``k`` below the largest and each pattern of the first ``k``
   rewards, ``"correct"`` (all 1) or ``"wrong"`` (all 0, the hopeless prompts so far), the probability that the
   prompt's ``max(grid)`` draws hold differing rewards, ``p[k][pattern]`` (Laplace-smoothed: an unseen cell is 1/2).
2. **Control.** The rule at level ``lambda`` stops a prompt at the first budget ``k`` whose pattern is uniform with
   ``p[k][pattern] <= lambda`` (or mixed with ``k >= mixed_stop``). It *loses* an informative prompt (one whose
   ``max(grid)`` draws hold differing rewards) when it stops it on a uniform group. The loss can only grow with
   ``lambda``, so conformal risk control (Angelopoulos et al., 2024) applies: on the ``n`` informative prompts of the
   second half, ``lambda`` is the largest candidate with ``n / (n + 1) * (mean loss) + 1 / (n + 1) <= delta``.

The guarantee: for a new prompt exchangeable with the informative calibration prompts, the probability that the rule
loses it is at most ``delta``, i.e. the share of informative groups lost is at most ``delta`` in expectation over
calibration sets. It assumes the calibration prompts and the training prompts come from the same distribution and are
drawn by the same policy; it says nothing about how much signal a kept group carries. Where no candidate satisfies the
bound (too few informative calibration prompts: ``n + 1 > 1 / delta``), no uniform group stops early.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from .base import Pools, StoppingRule, register

logger = logging.getLogger(__name__)

__all__ = ["SignalRule", "reward_pattern"]

PATTERNS = ("correct", "wrong")


def reward_pattern(rewards) -> str:
    """``"correct"`` when every reward is 1, ``"wrong"`` when every one is 0, ``"mixed"`` otherwise (or when empty)."""
    values = {float(r) > 0.5 for r in rewards}
    if values == {True}:
        return "correct"
    if values == {False}:
        return "wrong"
    return "mixed"


@register
class SignalRule(StoppingRule):
    """Stop where the full group would likely have had no signal, with the share of informative groups lost bounded by
    ``delta`` through conformal risk control; stop a mixed group at ``mixed_stop``. See :mod:`cgrpo.stopping.signal`.
    """

    name = "signal"
    label = "Signal stop (CRC)"
    calibrated = True
    needs_rewards = True
    parameter = "delta"
    sweep = (0.1, 0.2, 0.3)
    defaults = {"delta": 0.2, "mixed_stop": 8}

    def check_options(self) -> None:
        delta, mixed_stop = self.options["delta"], self.options["mixed_stop"]
        if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
            raise ValueError(f"The signal rule's delta must lie in (0, 1), got {delta!r}.")
        if not (isinstance(mixed_stop, int) and not isinstance(mixed_stop, bool) and mixed_stop >= 2):
            raise ValueError(f"The signal rule's mixed_stop must be a budget of at least 2, got {mixed_stop!r}.")

    def fit(self, pools: Pools) -> dict[str, Any]:
        grid, n = pools.grid, len(pools.rewards)
        if n < 2:
            raise ValueError(f"The signal rule needs at least 2 calibration prompts to fit, got {n}; add prompts.")
        half = n // 2
        estimate, control = pools.rewards[:half], pools.rewards[half:]
        probabilities = {str(k): {p: _p_informative(estimate, k, p) for p in PATTERNS} for k in grid[:-1]}
        informative = [r for r in control if reward_pattern(r[: grid[-1]]) == "mixed"]
        candidates = sorted({p for cells in probabilities.values() for p in cells.values()})
        level = -1.0
        for candidate in candidates:
            fit = {"lambda": candidate, "p_informative": probabilities}
            lost = sum(self._loses(fit, grid, rewards) for rewards in informative)
            m = len(informative)
            if m and (lost + 1) / (m + 1) <= self.options["delta"]:
                level = candidate
        if level < 0:
            logger.warning(
                "The signal rule's delta %g needs at least %d informative control prompts, and its calibration found "
                "%d of %d: it stops no uniform group early; give it more calibration prompts or a larger delta.",
                self.options["delta"],
                math.ceil(1 / self.options["delta"] - 1 - 1e-9),
                len(informative),
                n - half,
            )
        return {
            "delta": float(self.options["delta"]),
            "lambda": level,
            "p_informative": probabilities,
            "n_estimate": half,
            "n_control": n - half,
            "n_informative": len(informative),
        }

    def _loses(self, fit: dict[str, Any], grid: list[int], rewards) -> bool:
        for k in grid[:-1]:
            if self.stops(k, rewards[:k], rewards[:k], fit, None):
                return reward_pattern(rewards[:k]) != "mixed"
        return False

    def stops(self, k, outcomes, rewards, fit: dict[str, Any], rng) -> bool:
        pattern = reward_pattern(rewards[:k])
        if pattern == "mixed":
            return k >= self.options["mixed_stop"]
        cell = fit["p_informative"].get(str(k))
        return cell is not None and cell[pattern] <= fit["lambda"]

    def could_stop(self, j, outcomes, rewards, fit: dict[str, Any]) -> bool:
        # A new draw can keep a uniform prefix uniform or make it mixed (from j >= 2); a mixed prefix stays mixed.
        patterns = {reward_pattern(rewards)} if rewards else set(PATTERNS)
        if patterns == {"mixed"}:
            return j >= self.options["mixed_stop"]
        cell = fit["p_informative"].get(str(j))
        uniform = cell is not None and any(cell[pattern] <= fit["lambda"] for pattern in patterns)
        return uniform or (j >= 2 and j >= self.options["mixed_stop"])


def _p_informative(rewards_per_prompt, k: int, pattern: str) -> float:
    """Laplace-smoothed share of the prompts whose first ``k`` rewards show ``pattern`` and whose pool is mixed."""
    matching = [r for r in rewards_per_prompt if reward_pattern(r[:k]) == pattern]
    informative = sum(reward_pattern(r) == "mixed" for r in matching)
    return (informative + 1) / (len(matching) + 2)
