"""The prompt-allocator interface and its registry.

A stopping rule (`cgrpo.stopping`) decides within a prompt, as its answers come in, when it has drawn enough. An
allocator decides across the prompts of a generation batch, before any is drawn: each prompt's planned rollouts, 0 to
skip it or a size of the budget grid, from what earlier batches showed of that prompt and a total for the batch. The
two compose: a prompt draws along the grid up to its planned size, and its stopping rule may stop it earlier.

A prompt is known by a key the caller gives it (a hash of its text, say). Rewards are correctness rewards, 1 for a
right completion and 0 otherwise. An allocator's state is plain data (`state_dict`), saved with a checkpoint and
restored on resume, the same on every process when every process observes the same groups.
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from ..calibration import sorted_grid

__all__ = [
    "ALLOCATORS",
    "PromptAllocator",
    "agreeing_kind",
    "allocator_names",
    "get_allocator",
    "register_allocator",
]


def agreeing_kind(rewards: Sequence[float]) -> str | None:
    """``"easy"`` for a group whose rewards are all right, ``"hard"`` all wrong, None where they differ (or it is empty)."""
    right = {float(reward) >= 0.5 for reward in rewards}
    if right == {True}:
        return "easy"
    if right == {False}:
        return "hard"
    return None


class PromptAllocator:
    """One prompt allocator: subclass it, set the class attributes, implement :meth:`plan` (and :meth:`observe`).

    Class attributes:
        name: the registry's key.
        label: its name in tables and plots.
        defaults: its options and their defaults; an option outside them is refused.
    """

    name: ClassVar[str]
    label: ClassVar[str]
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, grid: Sequence[int], **options: Any):
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"The {self.name!r} allocator has no option {unknown[0]!r}; its options are "
                f"{', '.join(self.defaults) or 'none'}."
            )
        self.grid = sorted_grid(grid)
        self.options = {**self.defaults, **options}
        self.check_options()

    def check_options(self) -> None:
        """Raise a ValueError naming a bad option and its fix (none to check by default)."""

    def plan(self, prompts: Sequence[str], total: int, rng: random.Random) -> list[int]:
        """Each prompt's planned rollouts for the next generation batch: 0 (skip) or a grid size, at most `total` in
        all; `rng` draws whatever the plan leaves to chance."""
        raise NotImplementedError

    def observe(self, prompt: str, rewards: Sequence[float]) -> None:
        """What the prompt's group drew (its correctness rewards, in draw order), after the batch is generated."""

    def end_batch(self) -> None:
        """Called once every group of a generation batch has been observed."""

    def state_dict(self) -> dict[str, Any]:
        """Everything the allocator has learnt, as JSON data, for a checkpoint."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


ALLOCATORS: dict[str, type[PromptAllocator]] = {}


def register_allocator(cls: type[PromptAllocator]) -> type[PromptAllocator]:
    """Register an allocator class under its `name` (a class decorator)."""
    if cls.name in ALLOCATORS and ALLOCATORS[cls.name] is not cls:
        raise ValueError(f"An allocator named {cls.name!r} is registered already; give yours another name.")
    ALLOCATORS[cls.name] = cls
    return cls


def allocator_names() -> list[str]:
    """The registered allocators, in registration order."""
    return list(ALLOCATORS)


def get_allocator(name: str) -> type[PromptAllocator]:
    """The allocator class registered as `name`."""
    if name not in ALLOCATORS:
        close = difflib.get_close_matches(name, ALLOCATORS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else "."
        raise ValueError(f"No allocator is registered as {name!r} ({', '.join(ALLOCATORS)}){hint}")
    return ALLOCATORS[name]
