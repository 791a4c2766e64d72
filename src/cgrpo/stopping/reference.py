"""The reference line of every comparison: fixed-group GRPO on the budget grid, as a stopping rule."""

from __future__ import annotations

from collections.abc import Sequence

from .base import StoppingRule, register

__all__ = ["FixedRule"]


@register
class FixedRule(StoppingRule):
    """Fixed-group GRPO on the grid: every prompt stops at ``size``, the reference line every rule is judged against."""

    name = "fixed"
    label = "Fixed G"
    parameter = "size"
    defaults = {"size": 2}

    def check_options(self) -> None:
        size = self.options["size"]
        if not (isinstance(size, int) and not isinstance(size, bool) and size >= 2):
            raise ValueError(f"The fixed rule's size must be an integer of at least 2, got {size!r}.")

    @classmethod
    def sweep_for(cls, grid: Sequence[int]) -> list:
        return sorted(grid)

    def stops(self, k, outcomes, rewards, fit, rng) -> bool:
        return k >= self.options["size"]

    def could_stop(self, j, outcomes, rewards, fit) -> bool:
        return j >= self.options["size"]
