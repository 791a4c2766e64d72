"""Figures of a C-GRPO vs fixed-group GRPO experiment, drawn from the tables of :mod:`cgrpo.pipeline.reporting`.

Each function takes one table and writes one PNG; :func:`plot_all` draws the four report figures.
Colours follow the method and setting, so a setting has the same colour in every figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib import ticker  # noqa: E402
import pandas as pd  # noqa: E402

from .methods import METHODS, method_label  # noqa: E402
from .comparison import CI_HIGH, CI_LOW  # noqa: E402

__all__ = ["plot_all", "plot_coverage", "plot_delta_sweep", "plot_pareto", "plot_thresholds", "plot_training_curves"]

DPI = 120


def _labels(table: pd.DataFrame) -> pd.Series:
    """Legend label of each row: method and setting ("C-GRPO grid 2-4-8, ...", "GRPO G=32", "base model")."""
    names = table["method"].map(method_label) + " " + table["setting"].astype(str)
    return names.where(table["method"] != "base", "base model")


def _log2_axis(axis) -> None:
    # Budgets are powers of two; plain numbers read better than 2^n ticks.
    axis.set_major_formatter(ticker.FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(ticker.NullFormatter())


def _colors(labels: Sequence[str]) -> dict[str, tuple]:
    # C-GRPO settings come first in sorted order ("C-" < "G"), so they keep the first colours.
    cmap = plt.get_cmap("tab10")
    return {label: cmap(i % cmap.N) for i, label in enumerate(sorted(set(labels)))}


def _save(fig: plt.Figure, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def _empty(path: str | Path, title: str, message: str) -> None:
    fig, ax = plt.subplots(figsize=(6, 3))
    ax.set_title(title)
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    _save(fig, path)


def plot_pareto(summary: pd.DataFrame, path: str | Path) -> None:
    """Eval greedy accuracy against cost: generated rollouts per training prompt, and wall clock.

    Left panel: rollouts per training prompt (calibration included); right panel: wall-clock seconds of
    the run (training and every calibration). One small point per run, a large marker at each method
    and setting's mean across seeds, and the base model's accuracy as a horizontal line.
    """
    trained = summary[summary["method"] != "base"].copy()
    if trained.empty:
        _empty(path, "Accuracy vs rollouts", "no trained runs")
        return
    trained["label"] = _labels(trained)
    colors = _colors(trained["label"])
    base = summary.loc[summary["method"] == "base", "eval_greedy_acc"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    panels = [("rollouts_per_prompt", "generated rollouts per training prompt (incl. calibration)"),
              ("total_wall_s", "wall clock per run, training + calibration (s)")]
    for ax, (column, xlabel) in zip(axes, panels):
        for label, group in trained.groupby("label", sort=True):
            marker = METHODS[group["method"].iloc[0]].marker
            ax.scatter(group[column], group["eval_greedy_acc"], color=colors[label], alpha=0.45, s=25, marker=marker)
            ax.scatter(group[column].mean(), group["eval_greedy_acc"].mean(), color=colors[label], s=160,
                       marker=marker, edgecolor="black", linewidth=1.2, label=label, zorder=3)
        if not base.empty:
            ax.axhline(base.iloc[0], color="grey", linestyle="--", linewidth=1.2, label="base model")
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
    axes[0].set_xscale("log", base=2)
    _log2_axis(axes[0].xaxis)
    axes[0].set_ylabel("eval greedy accuracy")
    fig.suptitle("Accuracy vs generation cost and wall clock (large markers: mean across seeds)")
    axes[1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _save(fig, path)


def plot_training_curves(steps: pd.DataFrame, path: str | Path) -> None:
    """Reward, group size k and rollout savings over training steps, per method and setting.

    Lines are the mean across seeds, shaded between the lowest and highest seed.
    """
    if steps.empty:
        _empty(path, "Training curves", "no training steps logged")
        return
    steps = steps.assign(label=_labels(steps))
    colors = _colors(steps["label"])
    panels = [("reward", "reward"), ("mean_k", "mean group size k"), ("rollout_savings", "rollout savings")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 7.5), sharex=True)
    for ax, (column, title) in zip(axes, panels):
        for label, group in steps.groupby("label", sort=True):
            # Generation metrics are logged at the first step of each generation batch only.
            per_step = group.groupby("step")[column].agg(["mean", "min", "max"]).dropna()
            ax.plot(per_step.index, per_step["mean"], color=colors[label], label=label)
            ax.fill_between(per_step.index, per_step["min"], per_step["max"], color=colors[label], alpha=0.15)
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
    axes[1].set_yscale("log", base=2)
    _log2_axis(axes[1].yaxis)
    axes[-1].xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    axes[-1].set_xlabel("training step")
    axes[0].set_title("Training curves (mean across seeds, band: min-max)")
    axes[0].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _save(fig, path)


def plot_thresholds(calibrations: pd.DataFrame, path: str | Path) -> None:
    """The conformal thresholds qhat_k at every calibration of the C-GRPO runs, one panel per setting.

    One colour per budget k; the line is the mean across seeds and the dots are the seeds.
    """
    if calibrations.empty:
        _empty(path, "Conformal thresholds", "no C-GRPO calibrations")
        return
    settings = list(dict.fromkeys(calibrations["setting"]))
    fig, axes = plt.subplots(len(settings), 1, figsize=(7, 3.2 * len(settings)), squeeze=False, sharex=True)
    budgets = sorted(calibrations["k"].unique())
    cmap = plt.get_cmap("viridis")
    colors = {k: cmap(i / max(1, len(budgets) - 1)) for i, k in enumerate(budgets)}
    for ax, setting in zip(axes[:, 0], settings):
        rows = calibrations[calibrations["setting"] == setting]
        for k, group in rows.groupby("k"):
            mean = group.groupby("step")["qhat"].mean()
            ax.plot(mean.index, mean.values, color=colors[k], marker="o", label=f"k={k}")
            ax.scatter(group["step"], group["qhat"], color=colors[k], s=10, alpha=0.5)
        ax.set_title(f"C-GRPO {setting}", fontsize=10)
        ax.set_ylabel("threshold qhat_k")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    axes[-1, 0].xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    axes[-1, 0].set_xlabel("training step of the calibration")
    _save(fig, path)


def plot_coverage(coverage: pd.DataFrame, path: str | Path) -> None:
    """Empirical per-budget coverage against the nominal 1 - delta, one panel per delta mode.

    Points are runs (offset by method and setting) with exact Clopper-Pearson 95% intervals; the
    grey band is the split-conformal theorem's [1 - delta, 1 - delta + 1/(n_cal + 1)] (averaged
    over runs when delta is chosen automatically, since each run then has its own delta).
    """
    if coverage.empty:
        _empty(path, "Coverage", "no coverage rows in the eval records")
        return
    coverage = coverage.assign(label=_labels(coverage))
    colors = _colors(coverage["label"])
    modes = sorted(coverage["delta_mode"].astype(str).unique(), key=lambda m: (m != "auto", m))
    fig, axes = plt.subplots(1, len(modes), figsize=(4.5 * len(modes), 4), squeeze=False, sharey=True)
    labels = sorted(colors)
    width = 0.6 / max(1, len(labels))
    for ax, mode in zip(axes[0], modes):
        rows = coverage[coverage["delta_mode"].astype(str) == mode]
        budgets = sorted(rows["k"].unique())
        position = {k: i for i, k in enumerate(budgets)}
        band = rows.groupby("k")[["nominal", "band_low", "band_high"]].mean()
        half = 0.4
        for k, (nominal, low, high) in band.iterrows():
            x = position[k]
            ax.fill_between([x - half, x + half], low, high, color="grey", alpha=0.3, linewidth=0,
                            label="theoretical band" if x == 0 else None)
            ax.hlines(nominal, x - half, x + half, color="black", linestyle="--", linewidth=1,
                      label="nominal 1 - delta" if x == 0 else None)
        for i, label in enumerate(labels):
            group = rows[rows["label"] == label]
            if group.empty:
                continue
            xs = group["k"].map(position) + (i - (len(labels) - 1) / 2) * width
            errors = [group["coverage"] - group["ci_low"], group["ci_high"] - group["coverage"]]
            ax.errorbar(xs, group["coverage"], yerr=errors, fmt="o", markersize=3, color=colors[label],
                        elinewidth=0.8, alpha=0.8, label=label)
        ax.set_xticks(range(len(budgets)), [str(k) for k in budgets])
        ax.set_xlabel("budget k")
        ax.set_title(f"delta: {mode}")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0, 0].set_ylabel("empirical coverage (95% Clopper-Pearson)")
    handles, names = axes[0, -1].get_legend_handles_labels()
    axes[0, -1].legend(handles, names, fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    _save(fig, path)


def _interval_points(ax, table: pd.DataFrame, column: str, label: str, color) -> None:
    # A single seed has no interval: its bar is left out rather than drawn as NaN.
    errors = [(table[column] - table[f"{column} {CI_LOW}"]).fillna(0),
              (table[f"{column} {CI_HIGH}"] - table[column]).fillna(0)]
    ax.errorbar(table["delta"], table[column], yerr=errors, fmt="o-", color=color, capsize=3, label=label)


def plot_delta_sweep(sweep: pd.DataFrame, path: str | Path) -> None:
    """C-GRPO's savings, accuracy and coverage against delta, one point per setting (mean and 95% interval).

    The automatic delta sits at the mean delta its calibrations chose and is labelled "auto".
    """
    if sweep.empty:
        _empty(path, "C-GRPO against delta", "no C-GRPO runs")
        return
    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for i, name in enumerate(["rollout savings", "rollout savings incl. calibration", "time savings incl. calibration"]):
        _interval_points(axes[0], sweep, name, name, cmap(i))
    _interval_points(axes[1], sweep, "greedy accuracy", "eval greedy accuracy", cmap(3))
    _interval_points(axes[2], sweep, "eval coverage at the run's delta", "eval coverage (post-selection)", cmap(4))
    axes[2].plot(sweep["delta"], sweep["nominal coverage"], "k--", linewidth=1, label="nominal 1 - delta")
    for ax, ylabel in zip(axes, ["savings vs GRPO at G = max(grid)", "eval greedy accuracy", "coverage"]):
        for _, row in sweep[sweep["delta_mode"] == "auto"].iterrows():
            ax.axvline(row["delta"], color="grey", linestyle=":", linewidth=1)
            ax.annotate("auto", (row["delta"], 1), xycoords=("data", "axes fraction"), ha="center", va="bottom",
                        fontsize=8)
        ax.set_xlabel("delta")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("C-GRPO against its miscoverage level (mean and 95% interval across seeds)", y=1.04)
    _save(fig, path)


def plot_all(tables: Mapping[str, pd.DataFrame], paths: Mapping[str, str | Path]) -> None:
    """Draw the report figures from the reporting tables.

    ``tables`` holds ``summary``, ``steps``, ``calibrations``, ``coverage`` and ``delta_sweep``; ``paths``
    gives the PNG of ``pareto``, ``training_curves``, ``thresholds``, ``coverage`` and ``delta_sweep``.
    """
    plot_pareto(tables["summary"], paths["pareto"])
    plot_training_curves(tables["steps"], paths["training_curves"])
    plot_thresholds(tables["calibrations"], paths["thresholds"])
    plot_coverage(tables["coverage"], paths["coverage"])
    plot_delta_sweep(tables["delta_sweep"], paths["delta_sweep"])
