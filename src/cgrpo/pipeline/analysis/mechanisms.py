"""What each run of a budgeted experiment did with its rollouts (`tables/budget_mechanisms`): how many prompts it
trained per 1,000 rollouts, the share of its rollouts that carried no advantage, and for a prompt allocator how often it
skipped a prompt and whether a skipped prompt, drawn again later, carried signal.

Per run, and below each method's runs their mean (seed "mean"), so that the mechanism beside each verdict row is read
off one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ..configuration.methods import method_order, setting_label

__all__ = ["MECHANISM_COLUMNS", "mechanism_table"]

MECHANISM_COLUMNS = [
    "run",
    "method",
    "setting",
    "seed",
    "rollouts",
    "prompts trained",
    "prompts trained per 1,000 rollouts",
    "rollouts without signal",
    "informative groups",
    "skip rate",
    "skipped prompts drawn again",
    "of them with signal",
]


def _row(record: Mapping[str, Any]) -> dict[str, Any]:
    rollouts, groups = record["train_rollouts_generated"], record["groups"]
    signal = record.get("signal_rows_per_rollout")
    allocation = record.get("allocation") or {}
    skipped, redrawn = allocation.get("skipped_prompts"), allocation.get("skipped_redrawn")
    return {
        "run": record["run"],
        "method": record["method"],
        "setting": setting_label(record),
        "seed": str(record["seed"]),
        "rollouts": rollouts,
        "prompts trained": groups,
        "prompts trained per 1,000 rollouts": 1000 * groups / rollouts if rollouts else None,
        # Rollouts whose row carried no advantage: in groups whose rewards agreed, and those generated but not trained
        # on (stopped, dropped, left out of a balanced group or thrown away to keep processes in step).
        "rollouts without signal": None if signal is None else 1 - signal,
        "informative groups": record.get("informative_group_share"),
        "skip rate": None if skipped is None else skipped / (skipped + groups),
        "skipped prompts drawn again": redrawn,
        "of them with signal": allocation["skipped_redrawn_informative"] / redrawn if redrawn else None,
    }


def mechanism_table(runs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per training run (the base model has none), then each method and setting's mean over its runs."""
    ordered = sorted((r for r in runs if r["method"] != "base"), key=lambda r: (method_order(r["method"]), r["run"]))
    table = pd.DataFrame([_row(record) for record in ordered], columns=MECHANISM_COLUMNS)
    if table.empty:
        return table
    numeric = MECHANISM_COLUMNS[4:]
    means = table.groupby(["method", "setting"], sort=False)[numeric].mean().reset_index()
    means.insert(0, "run", "")
    means.insert(3, "seed", "mean")
    return pd.concat([table, means[MECHANISM_COLUMNS]], ignore_index=True)
