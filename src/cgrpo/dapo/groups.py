"""The pure parts of dynamic sampling (see `cgrpo.dapo.sampler` for what a round is): which groups carry reward
variance, the seeded stream of refill prompts, and how the informative groups found by every process are shared out.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


# ---------------------------------------------------------------------- the filter
def informative_groups(
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    group_size: int,
    aggregation: str = "sum_then_normalize",
) -> torch.Tensor:
    """Which groups carry reward variance: a bool per group of `group_size` consecutive rows.

    `rewards_per_func` is TRL's (rows, reward functions) matrix, NaN where a function returned None (and for C-GRPO's
    padded rows). The reward tested is the one TRL normalises within groups (see the module docstring); rows where
    every function returned None are left out; a group is informative when at least two rows remain and their
    standard deviation is not close to zero (`torch.isclose`, as TRL's `frac_reward_zero_std`).
    """
    if rewards_per_func.size(0) % group_size:
        raise ValueError(f"{rewards_per_func.size(0)} reward rows do not split into groups of {group_size}.")
    # In double precision: a float32 mean of equal weighted rewards (1.0 + 0.2) can miss them by a rounding error,
    # whose standard deviation (1e-7) torch.isclose would not call zero.
    rewards_per_func = rewards_per_func.double()
    weights = weights.to(rewards_per_func.device, rewards_per_func.dtype)
    grouped = rewards_per_func.view(-1, group_size, rewards_per_func.size(1))
    unscorable = torch.isnan(grouped).all(dim=2)
    if aggregation == "normalize_then_sum":
        mean, std = _nan_mean_std(grouped, dim=1)
        grouped = (grouped - mean) / (std + 1e-4)
    elif aggregation != "sum_then_normalize":
        raise ValueError(
            f"Unknown multi_objective_aggregation {aggregation!r}; expected 'sum_then_normalize' or "
            "'normalize_then_sum'."
        )
    rewards = (grouped * weights).nansum(dim=2).masked_fill(unscorable, math.nan)
    std = _nan_mean_std(rewards, dim=1)[1].squeeze(1)
    return ~torch.isnan(std) & ~torch.isclose(std, torch.zeros_like(std))


def _nan_mean_std(values: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """NaN-ignoring mean and sample standard deviation along `dim`, kept as a size-1 dimension (std NaN below 2)."""
    present = ~torch.isnan(values)
    count = present.sum(dim=dim, keepdim=True)
    mean = values.nansum(dim=dim, keepdim=True) / count.clamp(min=1)
    squares = torch.where(present, (values - mean) ** 2, torch.zeros_like(values)).sum(dim=dim, keepdim=True)
    std = (squares / (count - 1).clamp(min=1)).sqrt()
    return mean, torch.where(count >= 2, std, torch.full_like(std, math.nan))


# ---------------------------------------------------------------------- the prompt stream
class PromptStream:
    """Indices into the training set, one seeded permutation per pass, the same sequence on every process.

    `position` (indices handed out so far) is all the state there is: the permutation of pass `e` is rebuilt from
    `seed`, `purpose` and `e`. The purpose (``"dynamic-sampling"``, ``"allocation-refills"``) keeps the streams of two
    features that share a run's seed apart.
    """

    def __init__(self, size: int, seed: int, purpose: str):
        if size < 1:
            raise ValueError(f"The training set is empty; {purpose} needs prompts to refill from.")
        self.size, self.seed, self.purpose, self.position = size, seed, purpose, 0
        self._order: tuple[int, list[int]] | None = None

    def take(self, count: int) -> list[int]:
        taken: list[int] = []
        while len(taken) < count:
            epoch, offset = divmod(self.position, self.size)
            order = self._permutation(epoch)[offset : offset + count - len(taken)]
            taken.extend(order)
            self.position += len(order)
        return taken

    def rows(self, dataset, count: int, processes: int, rank: int, keys: Sequence[str]) -> list[dict[str, Any]]:
        """`count` rows of the map-style `dataset` for process `rank`: its slice of `count` per process from the
        stream. Each row keeps the columns in `keys` it has: the dataloader's rows may lack some
        (remove_unused_columns), and TRL reads the keys of a batch's first row."""
        indices = self.take(count * processes)[rank * count : (rank + 1) * count]
        rows = (dataset[index] for index in indices)
        return [{key: row[key] for key in keys if key in row} for row in rows]

    def _permutation(self, epoch: int) -> list[int]:
        if self._order is None or self._order[0] != epoch:
            order = list(range(self.size))
            random.Random(f"{self.seed}-{self.purpose}-{epoch}").shuffle(order)
            self._order = (epoch, order)
        return self._order[1]


# ---------------------------------------------------------------------- sharing groups out over processes
@dataclass(frozen=True)
class SharePlan:
    """How the informative groups found by all processes become equal batches.

    `share`: groups each process trains on. `moves`: (source process, index among the source's informative groups,
    destination process) for each group that changes process. `zero_variance`: per process, the zero-variance groups it
    trains on (only when `fallback`). `found`: informative groups found; `kept`: those trained on.
    """

    share: int
    moves: list[tuple[int, int, int]]
    zero_variance: list[int]
    found: int
    kept: int
    fallback: bool


def share_plan(counts: Sequence[int], local_target: int, unit: int = 1) -> SharePlan:
    """Share out the informative groups found on each process (`counts`) so that every process trains on as many.

    The share is at most `local_target` (the groups a process's generation batch holds), at most the groups found
    divided by the number of processes, and a multiple of `unit` (so that TRL splits the rows evenly into
    micro-batches). Each process keeps its own informative groups up to the share; a process short of it takes the
    others' surplus, in process order, then sampling order. When the share would be 0 (fewer informative groups than
    processes times `unit`), it is `unit` instead, every informative group is trained on, and a process still short
    trains on its own zero-variance groups, which have zero advantage.
    """
    processes, found = len(counts), sum(counts)
    share = min(local_target, found // processes) // unit * unit
    fallback = share == 0
    share = share or unit
    surplus = [(k, j) for k in range(processes) for j in range(share, counts[k])]
    moves, zero_variance = [], []
    for k in range(processes):
        need = share - min(counts[k], share)
        taken, surplus = surplus[:need], surplus[need:]
        moves += [(src, j, k) for src, j in taken]
        zero_variance.append(need - len(taken))
    return SharePlan(
        share=share,
        moves=moves,
        zero_variance=zero_variance,
        found=found,
        kept=min(found, share * processes),
        fallback=fallback,
    )


def filter_column(reward_func_names: Sequence[str], filter_metric: str | None) -> int | None:
    """The column of TRL's reward matrix that `filter_metric` names (None: the combined reward decides)."""
    if filter_metric is None:
        return None
    if filter_metric not in reward_func_names:
        raise ValueError(
            f"filter_metric {filter_metric!r} names no reward function; set it to one of "
            f"{', '.join(map(repr, reward_func_names))} (TRL's reward function names) or None for the combined reward."
        )
    return list(reward_func_names).index(filter_metric)
