"""Compute matching: the fixed group size G whose GRPO run generates as many rollouts as a C-GRPO setting's runs.

The matched run trains the same prompts for the same steps as C-GRPO (the same prompts per step: its batch is
`prompts_per_step x G` rows), so the only difference left is how the rollouts are spread over the prompts: C-GRPO's
total, calibration included, spread unevenly by the stopping rule, against the same total spread evenly.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..configuration.methods import setting_label
from .reporting import load_json

__all__ = ["match_group_size", "matched_group_size"]


def match_group_size(run_files: Sequence[str | Path]) -> dict[str, Any]:
    """The fixed G whose GRPO run, on C-GRPO's prompts, generates C-GRPO's total rollouts (calibration included).

    ``run_files`` are the ``run.json`` of every seed of one C-GRPO setting. The target is their mean
    ``total_rollouts_generated`` (training and calibration) and G the whole number, at least 2, that makes
    ``G x prompts`` (the prompts C-GRPO trained on) closest to it; ``relative_gap`` says how far ``G x prompts`` is from
    the target.
    """
    records = load_json(run_files)
    if not records:
        raise ValueError("No run.json given; pass the C-GRPO runs of one setting.")
    settings = {setting_label(record) for record in records}
    if len(settings) != 1 or any(record["method"] != "cgrpo" for record in records):
        raise ValueError(f"Compute matching needs the C-GRPO runs of one setting, got settings {sorted(settings)}.")
    prompts = {record["groups"] for record in records}
    if len(prompts) != 1:
        raise ValueError(
            f"The C-GRPO runs trained different numbers of prompts {sorted(prompts)}; compute matching "
            "needs runs of the same steps and prompts per step."
        )
    prompts = prompts.pop()
    total = [record["train_rollouts_generated"] + record["calibration_rollouts_generated"] for record in records]
    target = sum(total) / len(total)
    group_size = matched_group_size(target, prompts)
    return {
        "setting": settings.pop(),
        "runs": [record["run"] for record in records],
        "total_rollouts_generated": target,
        "prompts": prompts,
        "num_generations": group_size,
        "matched_rollouts": group_size * prompts,
        "relative_gap": group_size * prompts / target - 1,
    }


def matched_group_size(total_rollouts: float, prompts: int) -> int:
    """The whole G, at least 2 (a group of one has no advantage), whose `G x prompts` is closest to `total_rollouts`."""
    return max(2, round(total_rollouts / prompts))
