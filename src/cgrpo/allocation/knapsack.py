"""A budgeted allocator in the manner of Knapsack RL: a batch's rollouts shared out by each prompt's estimated success
rate, under a fixed total.

Written from "Knapsack RL: Unlocking Exploration of LLMs via Optimizing Budget Allocation" (arXiv 2509.25849); the facts
and their sources are in docs/research/allocators.md. A group of ``n`` rollouts of a prompt solved with probability
``p`` has a non-zero GRPO gradient with probability ``1 - p**n - (1 - p)**n``, and what an update on it teaches grows
with ``p * (1 - p)**2``; their product is the value of giving the prompt ``n`` rollouts. Each prompt gets one budget,
the batch's values summed are the largest the total allows (an exact dynamic program over the rollouts, as the paper
solves it), ``p`` is the prompt's success rate the last time it was drawn, and a prompt never drawn gets the even share.

Deviations: budgets are the grid's sizes (the paper's run from 2 to 128 rollouts); prompts that were always right get
the smallest budget, as in the paper, and the rollouts the program leaves unspent go to the prompts that were always
wrong, one grid step at a time in turn (the paper sends its leftover there without saying how it splits it).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .base import PromptAllocator, register_allocator

__all__ = ["KnapsackAllocator", "rollout_value"]


def rollout_value(rollouts: int, rate: float) -> float:
    """The value of `rollouts` rollouts for a prompt solved with probability `rate`: the chance its group has a non-zero
    gradient, times ``rate * (1 - rate)**2``."""
    signal = 1.0 - rate**rollouts - (1.0 - rate) ** rollouts
    return signal * rate * (1.0 - rate) ** 2


@register_allocator
class KnapsackAllocator(PromptAllocator):
    """Share a batch's rollouts out by each prompt's last success rate (see :mod:`cgrpo.allocation.knapsack`)."""

    name = "knapsack"
    label = "Knapsack allocation"
    defaults: dict[str, Any] = {}

    def check_options(self) -> None:
        self.rates: dict[str, float] = {}

    def plan(self, prompts: Sequence[str], total: int, rng: random.Random) -> list[int]:
        smallest = self.grid[0]
        if total < smallest * len(prompts):
            # Not even the smallest budget for every prompt: the first ones get it, the rest are skipped.
            fitting = total // smallest
            return [smallest] * fitting + [0] * (len(prompts) - fitting)
        even = max((size for size in self.grid if size * len(prompts) <= total), default=smallest)
        plan = [even if prompt not in self.rates else smallest for prompt in prompts]
        learning = [i for i, prompt in enumerate(prompts) if 0.0 < self.rates.get(prompt, -1.0) < 1.0]
        spare = total - sum(plan) + smallest * len(learning)
        for i, size in zip(learning, self._best_budgets([self.rates[prompts[i]] for i in learning], spare)):
            plan[i] = size
        hopeless = [i for i, prompt in enumerate(prompts) if self.rates.get(prompt) == 0.0]
        return self._spread(plan, hopeless, total)

    def _best_budgets(self, rates: Sequence[float], total: int) -> list[int]:
        """One grid budget per rate with the largest summed value at most `total` rollouts: a dynamic program over
        the rollouts spent (value -inf where a total cannot be met)."""
        if not rates:
            return []
        best = np.full(total + 1, -np.inf)
        best[0] = 0.0
        choices = []
        for rate in rates:
            values = np.full(total + 1, -np.inf)
            chosen = np.zeros(total + 1, dtype=int)
            for size in self.grid:
                if size > total:
                    continue
                candidate = np.full(total + 1, -np.inf)
                candidate[size:] = best[: total + 1 - size] + rollout_value(size, rate)
                better = candidate > values
                values[better], chosen[better] = candidate[better], size
            best = values
            choices.append(chosen)
        spent = int(np.argmax(best))
        budgets = []
        for chosen in reversed(choices):
            budgets.append(int(chosen[spent]))
            spent -= budgets[-1]
        return budgets[::-1]

    def _spread(self, plan: list[int], hopeless: Sequence[int], total: int) -> list[int]:
        """Give the rollouts `plan` leaves unspent to the `hopeless` prompts, one grid step each in turn."""
        raised = True
        while raised:
            raised = False
            for i in hopeless:
                larger = [size for size in self.grid if size > plan[i]]
                if larger and sum(plan) - plan[i] + larger[0] <= total:
                    plan[i], raised = larger[0], True
        return plan

    def observe(self, prompt: str, rewards: Sequence[float]) -> None:
        if rewards:
            self.rates[prompt] = sum(float(reward) >= 0.5 for reward in rewards) / len(rewards)

    def state_dict(self) -> dict[str, Any]:
        return {"rates": dict(self.rates)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rates = dict(state["rates"])
