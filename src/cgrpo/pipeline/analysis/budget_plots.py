"""The learning-curve figure of a budgeted experiment, drawn from `cgrpo.pipeline.analysis.curves`' tables."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import styles
from .plots import _row_color, _save, _setting_colors, plt

__all__ = ["plot_learning_curves"]


def plot_learning_curves(curve: pd.DataFrame, path: str | Path) -> None:
    """Three panels, one line per method and setting (mean over seeds and eval prompts, read on the common grid):
    sampled accuracy against rollouts generated, its paired difference to the best fixed G with a 95% band, and
    sampled accuracy against CPU seconds. The target accuracy is the dashed line."""
    colors = _setting_colors(curve)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for (method, setting), group in curve.groupby(["method", "setting"], sort=False):
        color = _row_color(colors, group)
        look = {"color": color, "marker": styles.style(method).marker, "markevery": 4, "ms": 5}
        axes[0].plot(group["rollouts"], group["sampled accuracy"], label=f"{group['label'].iloc[0]} {setting}", **look)
        axes[1].plot(group["rollouts"], group["difference to best fixed G"], **look)
        axes[1].fill_between(
            group["rollouts"],
            group["difference to best fixed G 95% CI low"],
            group["difference to best fixed G 95% CI high"],
            color=color,
            alpha=0.12,
        )
        axes[2].plot(group["CPU seconds"], group["sampled accuracy"], **look)
    target = curve["target accuracy"].iloc[0]
    for ax in (axes[0], axes[2]):
        ax.axhline(target, color=styles.REFERENCE, linestyle="--", linewidth=1)
        ax.set_ylabel("sampled accuracy (mean@k, eval prompts)")
    axes[1].axhline(0.0, color=styles.REFERENCE, linewidth=0.8)
    axes[1].set_ylabel(f"difference to the best fixed G ({curve['best fixed G'].iloc[0]})")
    axes[0].set_xlabel("rollouts generated (calibration included)")
    axes[1].set_xlabel("rollouts generated (calibration included)")
    axes[2].set_xlabel("CPU seconds (training and calibration)")
    axes[0].set_title("accuracy at an equal rollout budget")
    axes[1].set_title("paired difference, 95% bootstrap band")
    axes[2].set_title("accuracy against CPU time")
    fig.legend(loc="lower center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    _save(fig, path)
