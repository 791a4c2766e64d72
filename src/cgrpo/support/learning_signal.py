"""What a generation batch offers the policy gradient, and each prompt's weight in the loss.

Per generation batch (logged as `signal/*` metrics) and added up over a run (the trainer's `generation_totals`):

- the share of its prompt groups with a non-zero advantage (`signal/informative_group_share`): a group whose rewards
  all agree contributes nothing to the policy gradient;
- the rows with a non-zero advantage per rollout generated for it (`signal/signal_rows_per_rollout`), stopped,
  dropped and throwaway rollouts included: what a rollout buys;
- the heaviest prompt's weight in the loss, relative to an equal share (`signal/max_prompt_weight`, 1 when every
  group weighs the same): with a token-mean loss a group weighs its completion tokens, so a group a stopping rule let
  grow to 32 rollouts weighs up to 16 times one it stopped at 2.

With `group_weighting="equal"` (`CGRPOConfig`), the rows' advantages are scaled so that every group of a generation
batch weighs the same in a loss that averages over the batch's tokens (`equal_group_scales`).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["SIGNAL_KEYS", "equal_group_scales", "record_learning_signal", "signal_summary"]

# Running totals of `record_learning_signal`, kept in a trainer's `generation_totals`.
SIGNAL_KEYS = (
    "signal_groups",
    "signal_informative_groups",
    "signal_rows",
    "signal_rollouts",
    "signal_weight_max_sum",
    "signal_batches",
)


def _group_tokens(completion_mask: torch.Tensor, group_ids: torch.Tensor, groups: int) -> torch.Tensor:
    """Completion tokens of each local group (rows of group id -1, padding, count for none)."""
    tokens = completion_mask.sum(dim=1).to(torch.float64)
    real = group_ids >= 0
    return torch.zeros(groups, dtype=torch.float64, device=tokens.device).index_add_(0, group_ids[real], tokens[real])


def equal_group_scales(completion_mask: torch.Tensor, group_ids: torch.Tensor, accelerator) -> torch.Tensor:
    """Per-row factors on the advantages that make every group weigh the same in a token mean over the generation
    batch (all processes): the batch's tokens per group over the row's group's tokens (1 for padded rows)."""
    groups = int(group_ids.max().item()) + 1 if (group_ids >= 0).any() else 0
    tokens = _group_tokens(completion_mask, group_ids, groups)
    local = torch.tensor([tokens.sum().item(), groups], dtype=torch.float64, device=completion_mask.device)
    total_tokens, total_groups = accelerator.gather(local.unsqueeze(0)).sum(dim=0).tolist()
    per_group = total_tokens / max(total_groups, 1) / tokens.clamp(min=1.0)
    scales = torch.ones(len(group_ids), dtype=torch.float64, device=completion_mask.device)
    real = group_ids >= 0
    scales[real] = per_group[group_ids[real]]
    return scales


def _informative(advantages: torch.Tensor, group_ids: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which groups' advantages differ, and which rows carry a non-zero advantage within such a group.

    A group whose rewards all agree is not exactly zero in float32 (eight rewards of 0.2 less their mean leave
    -1.5e-8, and TRL's division by the std plus 1e-4 makes that -1.5e-4), but every row of it carries the same value:
    the group's spread is what tells. A row whose advantage is below a millionth of its group's spread counts as zero.
    """
    real = group_ids >= 0
    ids, values = group_ids[real], advantages[real]
    empty = torch.full((groups,), float("nan"), dtype=values.dtype, device=values.device)
    high = empty.scatter_reduce(0, ids, values, reduce="amax", include_self=False)
    low = empty.scatter_reduce(0, ids, values, reduce="amin", include_self=False)
    spread = torch.nan_to_num(high - low, nan=0.0)
    moving = torch.zeros_like(real)
    moving[real] = (spread[ids] > 0) & (values.abs() > 1e-6 * spread[ids])
    return spread > 0, moving


def record_learning_signal(
    trainer, output: dict[str, Any], group_ids: torch.Tensor, rollouts: float, scales: torch.Tensor | None = None
) -> None:
    """Log the batch's `signal/*` metrics and add them to `trainer.generation_totals`.

    `output` is TRL's batch (this process's rows: `advantages` as the loss will see them, `completion_mask`);
    `group_ids` the row's prompt group on this process (-1 for a padded row); `rollouts` the rollouts generated for
    the batch on all processes; `scales` the factors `equal_group_scales` put on the advantages (None: none).
    """
    advantages, mask = output["advantages"], output["completion_mask"]
    groups = int(group_ids.max().item()) + 1 if (group_ids >= 0).any() else 0
    real = group_ids >= 0
    informative, moving = _informative(advantages.detach().double(), group_ids, groups)
    # A group's weight: its tokens, each scaled by the factor its row's advantage carries relative to TRL's.
    weighted = mask.sum(dim=1).to(torch.float64) * (1.0 if scales is None else scales.double())
    weight = torch.zeros(groups, dtype=torch.float64, device=advantages.device).index_add_(
        0, group_ids[real], weighted[real]
    )
    local = torch.tensor(
        [groups, informative.sum().item(), moving.sum().item(), weight.sum().item()],
        dtype=torch.float64,
        device=advantages.device,
    )
    gathered = trainer.accelerator.gather(local.unsqueeze(0))
    heaviest = trainer.accelerator.gather(weight.max().reshape(1) if groups else torch.zeros(1, dtype=torch.float64))
    total_groups, total_informative, total_rows, total_weight = gathered.sum(dim=0).tolist()
    max_weight = heaviest.max().item() * total_groups / total_weight if total_weight else 1.0
    totals = trainer.generation_totals
    for key, value in zip(
        SIGNAL_KEYS, (total_groups, total_informative, total_rows, rollouts, max_weight, 1.0), strict=True
    ):
        totals[key] = totals.get(key, 0.0) + value
    metrics = trainer._metrics["train"]
    metrics["signal/informative_group_share"].append(total_informative / max(total_groups, 1))
    metrics["signal/signal_rows_per_rollout"].append(total_rows / rollouts if rollouts else 0.0)
    metrics["signal/max_prompt_weight"].append(max_weight)


def signal_summary(totals: dict[str, float]) -> dict[str, float | None]:
    """A run's learning signal from its totals: the share of informative groups, the rows with a non-zero advantage per
    rollout generated, and the mean over batches of the heaviest prompt's relative weight (None without batches)."""
    if not totals.get("signal_batches"):
        return {"informative_group_share": None, "signal_rows_per_rollout": None, "max_prompt_weight": None}
    return {
        "informative_group_share": totals["signal_informative_groups"] / max(totals["signal_groups"], 1.0),
        "signal_rows_per_rollout": totals["signal_rows"] / max(totals["signal_rollouts"], 1.0),
        "max_prompt_weight": totals["signal_weight_max_sum"] / totals["signal_batches"],
    }
