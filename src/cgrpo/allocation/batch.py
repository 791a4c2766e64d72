"""A prompt allocator run over a trainer's generation batches: each batch planned from its prompts' history, every
skipped prompt replaced from a seeded stream over the training set, every group observed on every process.

How a batch keeps its size: the dataloader's prompts are planned first; each one planned 0 (skipped) frees its slot,
and the slots are refilled with new prompts from `cgrpo.dapo.groups.PromptStream` (a seeded permutation of the
training set per pass, the same on every process), planned in turn with what is left of the batch's total, until every
slot holds a prompt with planned rollouts. The processes draw refills in lockstep (each takes its slice of as many
prompts as the neediest process wants), so the stream stays the same everywhere. A skipped prompt draws nothing: every
rollout counted is one that was generated.

Every process observes every process's groups, in process order, so the allocator's state is the same everywhere;
each plans its own prompts with its own seeded random stream. What is tracked for the mechanism tables: prompts skipped,
refill prompts drawn, and how often a skipped prompt, when later drawn, carried signal (right and wrong answers).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Sequence
from typing import Any

from ..dapo.groups import PromptStream
from .base import PromptAllocator, agreeing_kind

__all__ = ["PLANNED_KEY", "TOTALS_KEYS", "BatchAllocation", "prompt_key"]

# The key under which the generation-side copy of an example carries its planned rollouts (TRL's inputs never do).
PLANNED_KEY = "_cgrpo_planned_rollouts"
TOTALS_KEYS = (
    "batches",
    "planned_rollouts",
    "skipped_prompts",
    "refill_prompts",
    "skipped_redrawn",
    "skipped_redrawn_informative",
)
# Refill prompts a batch may draw per slot before the allocator is taken to skip everything.
MAX_REFILLS_PER_SLOT = 100

Gather = Callable[[Any], list[Any]]


def prompt_key(prompt: Any) -> str:
    """A prompt's key in its history: a hash of its text, or of its chat messages."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class BatchAllocation:
    """Plans a trainer's generation batches with `allocator` and feeds it what each group drew.

    Args:
        allocator: the prompt allocator.
        rollouts_per_prompt: each batch's total is this times its prompts (all of it the allocator may plan).
        dataset: the training set, map-style, that refills come from (rows by index).
        seed: the run's seed (the refill stream's, and with `rank` this process's planning stream's).
        rank, processes: this process and how many there are.
        gather: every process's value of its argument, in process order (`[value]` with one process).
    """

    def __init__(
        self,
        allocator: PromptAllocator,
        rollouts_per_prompt: float,
        dataset,
        seed: int,
        rank: int = 0,
        processes: int = 1,
        gather: Gather = lambda value: [value],
    ):
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise NotImplementedError(
                "A prompt allocator refills skipped prompts from train_dataset by index, which an iterable dataset "
                "does not allow; pass a map-style datasets.Dataset."
            )
        self.allocator, self.rollouts_per_prompt, self.dataset = allocator, rollouts_per_prompt, dataset
        self.rank, self.processes, self.gather = rank, processes, gather
        self.stream = PromptStream(len(dataset), seed, "allocation-refills")
        self.rng = random.Random(f"{seed}-allocation-{rank}")
        # Prompts skipped and not drawn since, by key.
        self.skipped: set[str] = set()
        self.totals: dict[str, float] = dict.fromkeys(TOTALS_KEYS, 0.0)

    def plan(self, examples: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
        """This process's groups for the batch whose prompts the dataloader gave (`examples`, one per group): as many
        examples, skipped ones replaced, and each one's planned rollouts."""
        slots, keys = len(examples), list(examples[0])
        total = int(self.rollouts_per_prompt * slots)
        kept: list[tuple[dict[str, Any], int]] = []
        skipped: list[str] = []
        candidates, refills, drawn = list(examples), 0, 0
        while True:
            spent = sum(planned for _, planned in kept)
            plan = self.allocator.plan([prompt_key(e["prompt"]) for e in candidates], total - spent, self.rng)
            for example, planned in zip(candidates, plan, strict=True):
                if planned:
                    kept.append((example, planned))
                else:
                    skipped.append(prompt_key(example["prompt"]))
            need = max(self.gather(slots - len(kept)))
            if not need:
                break
            refills += need
            if refills > MAX_REFILLS_PER_SLOT * slots:
                raise RuntimeError(
                    f"The {self.allocator.name!r} allocator skipped {refills} refill prompts for a batch of {slots}; "
                    "raise its keep probability's floor or the batch's rollouts_per_prompt so that it keeps prompts."
                )
            candidates = self.stream.rows(self.dataset, need, self.processes, self.rank, keys)[: slots - len(kept)]
            drawn += len(candidates)
        self._count(skipped, drawn, sum(planned for _, planned in kept))
        return [example for example, _ in kept], [planned for _, planned in kept]

    def _count(self, skipped: list[str], refills: int, planned: int) -> None:
        every = self.gather([skipped, refills, planned])
        for keys, _, _ in every:
            self.skipped.update(keys)
            self.totals["skipped_prompts"] += len(keys)
        self.totals["refill_prompts"] += sum(part[1] for part in every)
        self.totals["planned_rollouts"] += sum(part[2] for part in every)
        self.totals["batches"] += 1

    def observe(self, keys: Sequence[str], rewards: Sequence[Sequence[float]]) -> None:
        """What this process's groups drew (each one's key and correctness rewards), after the batch; every process
        observes every process's groups."""
        for part in self.gather([[key, list(group)] for key, group in zip(keys, rewards, strict=True)]):
            for key, group in part:
                if key in self.skipped:
                    self.skipped.discard(key)
                    self.totals["skipped_redrawn"] += 1
                    self.totals["skipped_redrawn_informative"] += bool(group) and agreeing_kind(group) is None
                self.allocator.observe(key, group)
        self.allocator.end_batch()

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {
            "allocator": self.allocator.state_dict(),
            "stream_position": self.stream.position,
            "rng": [version, list(internal), gauss],
            "skipped": sorted(self.skipped),
            "totals": dict(self.totals),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.allocator.load_state_dict(state["allocator"])
        self.stream.position = state["stream_position"]
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.skipped = set(state["skipped"])
        self.totals = {**dict.fromkeys(TOTALS_KEYS, 0.0), **state["totals"]}
