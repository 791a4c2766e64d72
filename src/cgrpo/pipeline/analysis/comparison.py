"""Comparisons across runs: per method and setting (``by_method``), C-GRPO against each baseline (``paired``), and
every trained method against the base model (``over_base``).

An accuracy's interval is a percentile bootstrap (:func:`cgrpo.pipeline.metrics.statistics.bootstrap_mean_ci`) that
resamples the training seeds and the eval prompts: every run is evaluated on the same prompts, so a run's per-prompt
accuracies (the eval record's ``per_prompt``) form one row of a seeds x prompts table. With :data:`FEW_SEEDS` seeds or
fewer that bootstrap resamples the seeds like the range of a handful of values and comes out too narrow, so the
interval is Student's t over the seeds' means instead (:func:`cgrpo.pipeline.metrics.statistics.t_mean_ci`), as a
cost's always is (a cost has no prompts, only one value per seed). Paired differences subtract the baseline's values
from C-GRPO's, seed by seed and prompt by prompt, before either (the paired t interval, or the paired bootstrap). The
base model, a single run, gets an interval from its prompts alone. Each table's ``interval`` column names the one
used.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..configuration.methods import METHODS, method_label, method_order, setting_label
from ..metrics.statistics import bootstrap_mean_ci, t_mean_ci

__all__ = [
    "BY_METHOD_METRICS",
    "CI_HIGH",
    "CI_LOW",
    "FEW_SEEDS",
    "PAIRED_METRICS",
    "Resampling",
    "by_method_table",
    "interval_name",
    "means_with_intervals",
    "over_base_table",
    "paired_table",
]

CI_LOW, CI_HIGH = "95% CI low", "95% CI high"
# Up to this many seeds, an accuracy's interval is Student's t over the seeds' means rather than a bootstrap.
FEW_SEEDS = 5

# summary column -> plain-language name in the by_method table.
BY_METHOD_METRICS = {
    "eval_greedy_acc": "greedy accuracy",
    "eval_maj_acc": "majority-vote accuracy",
    "eval_mean_at_k": "sampled accuracy (mean@k)",
    "rollouts_per_prompt": "rollouts per training prompt (incl. calibration)",
    "total_rollouts_generated": "rollouts generated (training + calibration)",
    # The two parts, so that a calibration's cost reads as a stated cost beside what training drew.
    "train_rollouts_generated": "training rollouts generated",
    "calibration_rollouts_generated": "calibration rollouts generated",
    "total_wall_s": "wall clock (s, training + calibration)",
    "train_mean_k": "mean group size k",
    "train_rollout_savings": "rollout savings",
    "train_rollout_savings_with_calibration": "rollout savings incl. calibration",
    "time_savings": "time savings incl. calibration",
    "total_cpu_s": "CPU time (s, training + calibration)",
    "cpu_time_savings": "CPU time savings incl. calibration",
    "train_tokens_generated": "training tokens generated",
    "train_wall_s": "training wall clock (s)",
    "generation_wall_s": "generation wall clock (s)",
}

# summary column -> plain-language name in the paired table.
PAIRED_METRICS = {
    "eval_greedy_acc": "greedy accuracy",
    "eval_maj_acc": "majority-vote accuracy",
    "eval_mean_at_k": "sampled accuracy (mean@k)",
    "rollouts_per_prompt": "rollouts per training prompt",
    "total_rollouts_generated": "rollouts generated",
    "total_wall_s": "wall clock (s, training + calibration)",
    "total_cpu_s": "CPU time (s, training + calibration)",
    "train_wall_s": "training wall clock (s)",
}


# summary column -> plain-language name in the over_base table: what training added to the base model.
OVER_BASE_METRICS = {name: PAIRED_METRICS[name] for name in ("eval_greedy_acc", "eval_maj_acc", "eval_mean_at_k")}


# Summary columns that average a per-prompt accuracy of the eval record (`per_prompt`).
PER_PROMPT_COLUMNS = ("eval_greedy_acc", "eval_maj_acc", "eval_mean_at_k")


@dataclass(frozen=True)
class Resampling:
    """What the bootstrap resamples: each run's per-prompt accuracies, how many resamples, and the seed."""

    per_prompt: Mapping[str, Mapping[str, Sequence[float]]] = field(default_factory=dict)
    resamples: int = 2000
    seed: int = 0

    def table(self, group: pd.DataFrame, column: str) -> np.ndarray:
        """The seeds x prompts table of `column` for the runs of `group` (one value per seed for a cost)."""
        if column in PER_PROMPT_COLUMNS:
            missing = [run for run in group["run"] if column not in self.per_prompt.get(run, {})]
            if missing:
                raise ValueError(f"Eval records of {missing} lack per_prompt[{column!r}]; evaluate them again.")
            return np.array([self.per_prompt[run][column] for run in group["run"]], dtype=float)
        return pd.to_numeric(group[column], errors="coerce").to_numpy(dtype=float)

    def interval(self, table: np.ndarray, *labels: str) -> tuple[float, float, float]:
        """Mean and interval of `table` (see :func:`interval_name`): t over seeds for one value per seed or for a
        seeds x prompts table of 2 to `FEW_SEEDS` seeds (over the seeds' means), else a bootstrap over seeds and
        prompts with a resampling stream of its own for each `labels`."""
        if np.ndim(table) == 1:
            return t_mean_ci(table)
        if 1 < len(table) <= FEW_SEEDS:
            return t_mean_ci(np.asarray(table, dtype=float).mean(axis=1))
        stream = zlib.crc32("|".join(labels).encode())
        return bootstrap_mean_ci(table, self.resamples, [self.seed, stream])


def interval_name(seeds: int) -> str:
    """What an accuracy's interval over `seeds` seeds is, for a table's `interval` column."""
    if seeds == 1:
        return "bootstrap over eval prompts"
    if seeds <= FEW_SEEDS:
        return f"Student's t over {seeds} seeds (paired for differences)"
    return f"bootstrap over {seeds} seeds and eval prompts, paired for differences (costs: Student's t over seeds)"


def means_with_intervals(
    group: pd.DataFrame, metrics: Mapping[str, str], resampling: Resampling, label: str
) -> dict[str, float]:
    """Each metric's mean over the group's runs under its plain name, and its interval's two ends beside it.

    Runs whose value of a metric is missing (a cost its method does not have) are left out of that metric.
    """
    row = {}
    for column, name in metrics.items():
        present = group[pd.to_numeric(group[column], errors="coerce").notna()]
        interval = (
            (math.nan,) * 3 if present.empty else resampling.interval(resampling.table(present, column), label, column)
        )
        row.update(dict(zip((name, f"{name} {CI_LOW}", f"{name} {CI_HIGH}"), interval)))
    return row


def by_method_table(
    summary: pd.DataFrame, resampling: Resampling, metrics: Mapping[str, str] = BY_METHOD_METRICS
) -> pd.DataFrame:
    """Mean and 95% interval of each metric, per method and setting (see the module's docstring).

    ``metrics`` maps summary columns to the plain-language column names used here; each gets a mean
    column and ``95% CI low`` / ``95% CI high`` columns.
    """
    rows = [
        {
            "method": method,
            "setting": setting,
            "seeds": len(group),
            **means_with_intervals(group, metrics, resampling, f"{method} {setting}"),
            "interval": interval_name(len(group)),
        }
        for (method, setting), group in summary.groupby(["method", "setting"], sort=False)
    ]
    return pd.DataFrame(rows)


def _baselines(
    summary: pd.DataFrame, cgrpo_setting: str, matched: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str]]:
    """(method, setting) of the runs C-GRPO's ``cgrpo_setting`` is compared with, in the registry's order: every
    setting of every other method, except compute-matched runs matched to another C-GRPO setting."""
    own_matches = {
        setting_label({"method": "grpo", "num_generations": m["num_generations"], "compute_matched": True})
        for m in matched
        if m["setting"] == cgrpo_setting
    }
    others = summary[summary["method"].isin([m for m in METHODS if m != "cgrpo"])]
    matched_rows = others["compute_matched"].fillna(False).astype(bool)
    kept = others[~matched_rows | others["setting"].isin(own_matches)]
    # Fixed-G runs before compute-matched ones, as in the summary's order within a method.
    kept = kept.assign(_order=kept["method"].map(method_order), _matched=matched_rows[kept.index])
    kept = kept.sort_values(["_order", "_matched"], kind="stable")
    return list(dict.fromkeys(zip(kept["method"], kept["setting"])))


def paired_table(
    summary: pd.DataFrame,
    resampling: Resampling,
    matched: Sequence[Mapping[str, Any]] = (),
    metrics: Mapping[str, str] = PAIRED_METRICS,
) -> pd.DataFrame:
    """C-GRPO minus each baseline, seed by seed (and prompt by prompt for accuracies), for each C-GRPO setting.

    Baselines of a C-GRPO setting are every setting of every other method, except compute-matched GRPO runs whose
    ``matched`` record (from :func:`cgrpo.pipeline.analysis.matching.match_group_size`) names another setting. Only seeds run
    by both sides are paired. Each metric gets the mean difference and its 95% interval (module docstring).
    """
    rows = []
    cgrpo = summary[summary["method"] == "cgrpo"]
    for setting, treated in cgrpo.groupby("setting", sort=False):
        treated = treated.set_index("seed", drop=False)
        for method, baseline in _baselines(summary, setting, matched):
            base = summary[(summary["method"] == method) & (summary["setting"] == baseline)].set_index(
                "seed", drop=False
            )
            seeds = treated.index.intersection(base.index)
            if seeds.empty:
                continue
            name = f"{method_label(method)} {baseline}"
            row: dict[str, Any] = {"C-GRPO setting": setting, "baseline": name, "paired seeds": len(seeds)}
            for column, metric in metrics.items():
                difference = resampling.table(treated.loc[seeds], column) - resampling.table(base.loc[seeds], column)
                label = f"{metric} difference"
                interval = resampling.interval(difference, setting, name, column)
                row.update(dict(zip((label, f"{label} {CI_LOW}", f"{label} {CI_HIGH}"), interval)))
            row["interval"] = interval_name(len(seeds))
            rows.append(row)
    return pd.DataFrame(rows, columns=None if rows else ["C-GRPO setting", "baseline", "paired seeds"])


def over_base_table(
    summary: pd.DataFrame, resampling: Resampling, metrics: Mapping[str, str] = OVER_BASE_METRICS
) -> pd.DataFrame:
    """Each trained method and setting minus the base model, prompt by prompt: did training move the accuracy?

    Every seed's per-prompt accuracies minus the base model's on the same prompt form a seeds x prompts table, whose
    mean and 95% interval come from the bootstrap over seeds and prompts (module docstring). Empty without a base
    model evaluation.
    """
    base = summary[summary["method"] == "base"]
    if base.empty:
        return pd.DataFrame(columns=["method", "setting", "seeds"])
    rows = []
    for (method, setting), group in summary[summary["method"] != "base"].groupby(["method", "setting"], sort=False):
        row: dict[str, Any] = {"method": method, "setting": setting, "seeds": len(group)}
        for column, metric in metrics.items():
            difference = resampling.table(group, column) - resampling.table(base, column)
            label = f"{metric} gain"
            interval = resampling.interval(difference, "over base", method, setting, column)
            row.update(dict(zip((label, f"{label} {CI_LOW}", f"{label} {CI_HIGH}"), interval)))
        row["interval"] = interval_name(len(group))
        rows.append(row)
    return pd.DataFrame(rows, columns=None if rows else ["method", "setting", "seeds"])
