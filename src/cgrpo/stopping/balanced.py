"""Reinforce-Ada's balanced exit as a stopping rule: a prompt stops once it holds `count` right and `count` wrong
answers (Reinforce-Ada, arXiv 2510.04996, Algorithm 2, "Seq-balance"; docs/method.md, "Prompt allocators").

With `CGRPOConfig.balanced_group_size` the trainer then trains on a balanced group of that size drawn from the prompt's
answers, with the whole pool's mean reward as baseline; a prompt that never balances draws to the grid's largest budget
(Reinforce-Ada's cap).
"""

from __future__ import annotations

from ..allocation.reinforce_ada import balanced_exit
from .base import StoppingRule, register

__all__ = ["BalancedRule"]


@register
class BalancedRule(StoppingRule):
    """Stop where the answers so far hold `count` right and `count` wrong ones (Reinforce-Ada's balanced exit)."""

    name = "balanced"
    label = "Reinforce-Ada"
    needs_rewards = True
    parameter = "count"
    # The paper's update group of 4 with balance K = n / 2 = 2 (docs/research/allocators.md, section 2.4).
    sweep = (1, 2, 4)
    defaults = {"count": 2}

    def check_options(self) -> None:
        count = self.options["count"]
        if not (isinstance(count, int) and not isinstance(count, bool) and count >= 1):
            raise ValueError(f"The balanced rule's count must be a positive integer, got {count!r}.")

    def stops(self, k, outcomes, rewards, fit, rng) -> bool:
        count = self.options["count"]
        return balanced_exit(rewards[:k], count, count)

    def could_stop(self, j, outcomes, rewards, fit) -> bool:
        right = sum(float(reward) >= 0.5 for reward in rewards)
        count = self.options["count"]
        return max(0, count - right) + max(0, count - (len(rewards) - right)) <= j - len(rewards)
