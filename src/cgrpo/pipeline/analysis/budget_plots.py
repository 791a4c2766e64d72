"""The learning-curve figure of a budgeted experiment, drawn from `cgrpo.pipeline.analysis.curves`' tables."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import styles
from .plots import _save, plt

__all__ = ["plot_learning_curves", "shown_settings"]


def shown_settings(curve: pd.DataFrame) -> list[tuple[str, str]]:
    """The (method, setting) pairs the figure draws: the best fixed G, and every other method's setting most accurate
    at the budget, one line per method in its own colour (the tables hold the rest)."""
    at_budget = curve[curve["rollouts"] == curve["rollouts"].max()]
    best_fixed = at_budget["best fixed G"].iloc[0]
    shown = [("grpo", best_fixed)]
    for method, rows in at_budget[at_budget["method"] != "grpo"].groupby("method", sort=False):
        shown.append((method, rows.loc[rows["sampled accuracy"].idxmax(), "setting"]))
    return shown


def plot_learning_curves(curve: pd.DataFrame, path: str | Path) -> None:
    """Four panels, one line per method (its setting most accurate at the budget; GRPO at the best fixed G): sampled
    accuracy against rollouts generated (calibration included), against training rollouts (calibration excluded) and
    against CPU seconds, and the paired difference to the best fixed G with its 95% band. Solid lines are methods; the
    dashed line is the target accuracy, the dotted one no difference."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    (by_rollouts, by_training), (difference, by_cpu) = axes
    for method, setting in shown_settings(curve):
        group = curve[(curve["method"] == method) & (curve["setting"] == setting)]
        look = {"color": styles.style(method).color, "marker": styles.style(method).marker, "markevery": 4, "ms": 5}
        label = f"{group['label'].iloc[0]} ({setting})"
        by_rollouts.plot(group["rollouts"], group["sampled accuracy"], label=label, **look)
        if "training rollouts" in group:
            by_training.plot(group["training rollouts"], group["sampled accuracy"], **look)
        by_cpu.plot(group["CPU seconds"], group["sampled accuracy"], **look)
        difference.plot(group["rollouts"], group["difference to best fixed G"], **look)
        difference.fill_between(
            group["rollouts"],
            group["difference to best fixed G 95% CI low"],
            group["difference to best fixed G 95% CI high"],
            color=look["color"],
            alpha=0.12,
        )
    target = curve["target accuracy"].iloc[0]
    recorded = "training rollouts" in curve
    for ax in (by_rollouts, by_training, by_cpu) if recorded else (by_rollouts, by_cpu):
        ax.axhline(target, color=styles.REFERENCE, linestyle="--", linewidth=1)
    for ax in (by_rollouts, by_training, by_cpu):
        ax.set_ylabel("sampled accuracy (mean@k, eval prompts)")
    difference.axhline(0.0, color=styles.REFERENCE, linestyle=":", linewidth=1)
    difference.set_ylabel(f"accuracy minus the best fixed G ({curve['best fixed G'].iloc[0]})")
    by_rollouts.set_xlabel("rollouts generated (calibration included)")
    by_training.set_xlabel("training rollouts (calibration excluded)")
    difference.set_xlabel("rollouts generated (calibration included)")
    by_cpu.set_xlabel("CPU seconds (training and calibration)")
    if not recorded:
        # A run whose table predates the column: the panel says so rather than staying blank.
        by_training.text(
            0.5, 0.5, "not recorded by this run", ha="center", va="center", transform=by_training.transAxes
        )
    by_rollouts.set_title("at an equal rollout budget, calibration counted")
    by_training.set_title("at equal training rollouts, calibration excluded")
    difference.set_title("paired difference to the best fixed G, 95% bootstrap band")
    by_cpu.set_title("against CPU time")
    fig.legend(loc="lower center", ncol=3, fontsize=9, bbox_to_anchor=(0.5, -0.04))
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    _save(fig, path)
