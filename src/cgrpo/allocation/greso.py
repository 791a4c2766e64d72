"""GRESO: skip, before rollout, the prompts whose recent groups all agreed, with an exploration probability that adapts.

Written from "Act Only When It Pays: Efficient Reinforcement Learning for LLM Reasoning via Selective Rollouts" (Zheng
et al., arXiv 2506.02177); the facts and their sources are in docs/research/allocators.md. A group whose rewards all
agree carries no GRPO advantage. GRESO observes that a prompt whose group agreed at its last rollouts is likely to again,
and keeps such a prompt with probability ``p ** z``, where ``z`` is its streak of agreeing groups (its most recent
rollouts, consecutive) and ``p`` the exploration probability of its kind: *easy* where the streak's latest group was all
right, *hard* where it was all wrong; a prompt with no streak is always kept. After every generation batch each kind's
``p`` moves by ``step`` toward its target share of agreeing groups among those drawn: down where more of that kind agreed
than the target (skip more), up where fewer did.

Deviations, where the sources leave a choice open: the keep probability never falls below `floor` (a single source
states a 5% floor without saying on what; here, on the keep probability and on ``p`` alike); a streak takes the kind of
its latest group; the batch's share is over the groups drawn in it. Every prompt kept draws the same `size` (GRESO
pre-filters fixed-size GRPO groups); a skipped prompt draws nothing, and the trainer refills its place.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from .base import PromptAllocator, agreeing_kind, register_allocator

__all__ = ["GresoAllocator"]

KINDS = ("easy", "hard")


@register_allocator
class GresoAllocator(PromptAllocator):
    """Skip a prompt whose last `z` groups agreed with probability ``1 - p ** z`` (see :mod:`cgrpo.allocation.greso`)."""

    name = "greso"
    label = "GRESO"
    # The defaults of GRESO's own runs, as a reproduction that follows them lists them (docs/research/allocators.md):
    # both exploration probabilities start at 0.5, the targets share a total of 1/4 (a third easy, two thirds hard),
    # and each batch moves them by 0.01. `size`: None is the grid's largest budget.
    defaults = {
        "size": None,
        "p_easy": 0.5,
        "p_hard": 0.5,
        "target_easy": 1 / 12,
        "target_hard": 1 / 6,
        "step": 0.01,
        "floor": 0.05,
    }

    def check_options(self) -> None:
        for key in ("p_easy", "p_hard", "target_easy", "target_hard", "floor"):
            if not 0.0 <= float(self.options[key]) <= 1.0:
                raise ValueError(f"GRESO's {key} must lie in [0, 1], got {self.options[key]!r}.")
        size = self.options["size"]
        if size is not None and size not in self.grid:
            raise ValueError(f"GRESO's size must be a budget of the grid {self.grid}, got {size!r}.")
        self.size = self.grid[-1] if size is None else int(size)
        self.p = {"easy": float(self.options["p_easy"]), "hard": float(self.options["p_hard"])}
        self.streaks: dict[str, list] = {}
        self.drawn = {"groups": 0, "easy": 0, "hard": 0}

    def keep_probability(self, prompt: str) -> float:
        """The probability that `prompt` is rolled out in the next batch: 1 without a streak, else ``p ** z``."""
        streak, kind = self.streaks.get(prompt, (0, None))
        if streak == 0:
            return 1.0
        return max(self.p[kind] ** streak, float(self.options["floor"]))

    def plan(self, prompts: Sequence[str], total: int, rng: random.Random) -> list[int]:
        plan = []
        for prompt in prompts:
            # A prompt that would not fit the total is skipped too: the trainer refills its place.
            fits = sum(plan) + self.size <= total
            plan.append(self.size if fits and rng.random() < self.keep_probability(prompt) else 0)
        return plan

    def observe(self, prompt: str, rewards: Sequence[float]) -> None:
        kind = agreeing_kind(rewards)
        streak = self.streaks.get(prompt, (0, None))[0]
        self.streaks[prompt] = [0, None] if kind is None else [streak + 1, kind]
        self.drawn["groups"] += 1
        if kind is not None:
            self.drawn[kind] += 1

    def end_batch(self) -> None:
        groups = self.drawn["groups"]
        if groups:
            for kind in KINDS:
                share = self.drawn[kind] / groups
                direction = -1.0 if share > self.options[f"target_{kind}"] else 1.0
                moved = self.p[kind] + direction * float(self.options["step"])
                self.p[kind] = min(1.0, max(float(self.options["floor"]), moved))
        self.drawn = {"groups": 0, "easy": 0, "hard": 0}

    def state_dict(self) -> dict[str, Any]:
        return {"p": dict(self.p), "streaks": {prompt: list(s) for prompt, s in self.streaks.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.p = dict(state["p"])
        self.streaks = {prompt: list(streak) for prompt, streak in state["streaks"].items()}
