"""Comparison tables of a C-GRPO vs fixed-group GRPO experiment, from the files the pipeline writes.

Inputs are each training run's ``run.json`` and ``steps.csv`` (see :func:`cgrpo.pipeline.jobs.runs.train_run`), each
evaluated model's eval JSON (see :func:`cgrpo.pipeline.jobs.evaluation.evaluate_model`, the base model's run is
``"base"``) and the compute-matching records of :func:`cgrpo.pipeline.analysis.matching.match_group_size`. Every table is a
``pandas.DataFrame``; :func:`write_table` saves one as CSV and as GitHub-readable markdown.

Tables:

* ``summary``: one row per run (base model included) with its eval accuracy and its training cost;
* ``by_method``: per method and setting, the mean and 95% interval over seeds (and eval prompts, for an accuracy);
* ``paired``: C-GRPO minus each baseline, seed by seed and prompt by prompt (`cgrpo.pipeline.analysis.comparison`);
* ``over_base``: each trained method and setting minus the base model, prompt by prompt;
* ``coverage`` and ``conformal``: the per-budget coverage and the conformal dynamic-k results of every
  evaluated model; ``coverage_splits``: the spread of the per-budget coverage over repeated re-splits of its
  calibration and eval prompts, against split-conformal theory;
* ``frontier`` and ``frontier_at_cgrpo``: sampled accuracy against cost per method and setting, and every method's
  frontier at C-GRPO's cost (`cgrpo.pipeline.analysis.frontier`);
* ``steps`` and ``calibrations``: long tables behind the training-curve and threshold plots.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..configuration.methods import method_order, setting_label
from ..configuration.specs import format_delta, parse_grid
from .comparison import (
    CI_HIGH,
    CI_LOW,
    Resampling,
    by_method_table,
    means_with_intervals,
    over_base_table,
    paired_table,
)
from .frontier import frontier_at_cgrpo, frontier_points

__all__ = [
    "SWEEP_METRICS",
    "build_tables",
    "calibrations_table",
    "conformal_table",
    "coverage_splits_table",
    "coverage_table",
    "delta_sweep_table",
    "format_delta",
    "load_json",
    "markdown",
    "steps_table",
    "summary_table",
    "write_table",
]

# Below this a value is floating-point noise around zero (a difference of two equal means, say), and reads 0.
FLOAT_NOISE = 1e-12

# summary column -> plain-language name in the delta sweep table.
SWEEP_METRICS = {
    "train_rollout_savings": "rollout savings",
    "train_rollout_savings_with_calibration": "rollout savings incl. calibration",
    "time_savings": "time savings incl. calibration",
    "cpu_time_savings": "CPU time savings incl. calibration",
    "eval_greedy_acc": "greedy accuracy",
    "coverage_post_selection": "eval coverage at the run's delta",
}

_RUN_FIELDS = [
    "num_generations",
    "budget_grid",
    "delta",
    "recalibrate_every",
    "compute_matched",
    "steps",
    "groups",
    "train_mean_k",
    "train_rollout_savings",
    "train_rollout_savings_with_calibration",
    "train_rollouts_generated",
    "lockstep_rollouts_generated",
    "calibration_rollouts_generated",
    "rollouts_per_prompt",
    "train_tokens_generated",
    "calibration_tokens_generated",
    "train_wall_s",
    "generation_wall_s",
    "update_wall_s",
    "calibration_wall_s",
    "total_wall_s",
    "train_cpu_s",
    "total_cpu_s",
    "reference_budget",
    "steps_per_generation",
]


# --------------------------------------------------------------------------- loading


def load_json(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The JSON records of ``paths``, in order."""
    return [json.loads(Path(path).read_text()) for path in paths]


def _by_run(records: Iterable[Mapping[str, Any]], what: str) -> dict[str, Mapping[str, Any]]:
    indexed: dict[str, Mapping[str, Any]] = {}
    for record in records:
        if record["run"] in indexed:
            raise ValueError(f"Run {record['run']!r} has two {what}; pass each run's file once.")
        indexed[record["run"]] = record
    return indexed


# --------------------------------------------------------------------------- summary


def summary_table(runs: Sequence[Mapping[str, Any]], evals: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per evaluated model: its run record's fields next to its eval accuracy.

    ``runs`` are ``run.json`` records and ``evals`` eval records; every eval needs the run record of
    the same ``run`` name, except ``"base"`` (the untrained base model, ``method`` ``"base"``).
    Training columns of the base row are empty. ``total_rollouts_generated`` adds the training and
    calibration rollouts; ``time_savings`` is ``1 - total_wall_s`` over that of the same seed's GRPO run
    at G = ``reference_budget`` (empty where that run is missing), the wall-clock twin of
    ``train_rollout_savings_with_calibration``, and ``cpu_time_savings`` the same from ``total_cpu_s``, which the jobs
    running beside a run do not move; ``train_budget_histogram`` reads ``"k:groups, ..."``, and
    ``train_intermediate_share`` is the share of its groups that stopped strictly between the smallest and the largest
    budget; ``eval_budget_histogram`` is the eval prompts' conformal budget histogram at the automatic delta.
    """
    by_run = _by_run(runs, "run records")
    rows = []
    for evaluation in evals:
        name = evaluation["run"]
        if name == "base":
            record: Mapping[str, Any] = {"run": "base", "method": "base"}
        elif name in by_run:
            record = by_run[name]
        else:
            raise ValueError(f"Eval record of run {name!r} has no run.json; evaluate only trained runs or 'base'.")
        row = {
            "run": name,
            "method": record["method"],
            "setting": setting_label(record),
            "seed": record.get("seed"),
            **{field: record.get(field) for field in _RUN_FIELDS},
            "eval_greedy_acc": evaluation["eval_greedy_acc"],
            "eval_maj_acc": evaluation.get("eval_maj_acc"),
            "eval_mean_at_k": evaluation.get("mean_at_k"),
            "eval_wall_s": evaluation.get("eval_wall_s"),
            "train_budget_histogram": _histogram_text(record.get("train_budget_histogram") or {}) or None,
            "train_intermediate_share": _intermediate_share(
                record.get("train_budget_histogram"), record.get("budget_grid")
            ),
            "eval_budget_histogram": _histogram_text(_auto_conformal(evaluation).get("histogram", {})) or None,
        }
        if row["delta"] is not None:
            row["delta"] = format_delta(row["delta"])
        rows.append(row)
    table = pd.DataFrame(rows)
    total = table["train_rollouts_generated"] + table["calibration_rollouts_generated"]
    table.insert(table.columns.get_loc("rollouts_per_prompt"), "total_rollouts_generated", total)
    savings_at = table.columns.get_loc("train_rollout_savings_with_calibration") + 1
    table.insert(savings_at, "time_savings", _time_savings(table, "total_wall_s"))
    table.insert(savings_at + 1, "cpu_time_savings", _time_savings(table, "total_cpu_s"))
    table["seed"] = table["seed"].astype("Int64")
    order = table["method"].map(method_order)
    return (
        table.assign(_order=order)
        .sort_values(["_order", "setting", "seed"], kind="stable")
        .drop(columns="_order")
        .reset_index(drop=True)
    )


def _intermediate_share(histogram: Mapping[str, int] | None, grid: str | None) -> float | None:
    """Share of a C-GRPO run's groups that stopped strictly inside its grid ("2-4-8": at 4)."""
    if not histogram or not grid:
        return None
    budgets = parse_grid(grid)
    inner = sum(count for k, count in histogram.items() if budgets[0] < int(k) < budgets[-1])
    return inner / sum(histogram.values())


def _auto_conformal(evaluation: Mapping[str, Any]) -> Mapping[str, Any]:
    return next((row for row in evaluation.get("conformal", []) if row["delta_mode"] == "auto"), {})


def _time_savings(table: pd.DataFrame, column: str) -> pd.Series:
    """1 - `column` over that of the same seed's fixed-G GRPO run at G = the run's reference budget."""
    fixed = table[(table["method"] == "grpo") & ~table["compute_matched"].fillna(False).astype(bool)]
    reference = fixed.set_index(["seed", "num_generations"])[column]
    keys = list(zip(table["seed"], table["reference_budget"]))
    reference_time = pd.Series([reference.get(key, math.nan) for key in keys], index=table.index, dtype=float)
    return 1 - pd.to_numeric(table[column], errors="coerce") / reference_time


# --------------------------------------------------------------------------- conformal evaluation


def _run_columns(summary: pd.DataFrame) -> pd.DataFrame:
    return summary[["run", "method", "setting", "seed"]]


def coverage_table(evals: Sequence[Mapping[str, Any]], summary: pd.DataFrame) -> pd.DataFrame:
    """Per-budget coverage of every evaluated model: one row per run, delta mode and budget k.

    Keeps the eval record's fields (``coverage``, ``nominal``, ``band_low``, ``band_high``,
    ``ci_low``, ``ci_high``, ``n_eval``, ...) and adds the run's method, setting and seed;
    ``delta_mode`` is ``"auto"`` or the fixed delta as text.
    """
    rows = [
        {"run": evaluation["run"], **row, "delta_mode": format_delta(row["delta_mode"])}
        for evaluation in evals
        for row in evaluation.get("coverage", [])
    ]
    if not rows:
        return pd.DataFrame(columns=["run", "method", "setting", "seed", "delta_mode", "k", "coverage"])
    table = _run_columns(summary).merge(pd.DataFrame(rows), on="run", how="right")
    return table.sort_values(["run", "delta_mode", "k"], kind="stable").reset_index(drop=True)


def coverage_splits_table(evals: Sequence[Mapping[str, Any]], summary: pd.DataFrame) -> pd.DataFrame:
    """Per-budget coverage over repeated calibration/eval re-splits of every evaluated model, against theory.

    One row per run, delta mode and budget k, from the eval record's ``coverage_splits``
    (:func:`cgrpo.pipeline.metrics.coverage.split_coverage_distribution`): the observed mean and 5-95% range of the coverage
    over the re-splits next to split-conformal theory's (Beta-binomial), and the share of re-splits inside the latter.
    """
    rows = [{"run": evaluation["run"], **row} for evaluation in evals for row in evaluation["coverage_splits"]]
    if not rows:
        return pd.DataFrame(columns=["run", "method", "setting", "seed", "delta_mode", "k", "mean"])
    return _run_columns(summary).merge(pd.DataFrame(rows), on="run", how="right")


def _histogram_text(histogram: Mapping[Any, int]) -> str:
    return ", ".join(f"{k}:{count}" for k, count in sorted(histogram.items(), key=lambda item: int(item[0])))


def conformal_table(evals: Sequence[Mapping[str, Any]], summary: pd.DataFrame) -> pd.DataFrame:
    """Conformal dynamic k on the eval prompts: one row per run and delta mode.

    Columns: the run's method, setting and seed, ``delta_mode``, the fitted ``delta``, the accuracy
    and mean budget under the dynamic k, the post-selection coverage (a diagnostic the conformal
    theorem does not cover) and the budget histogram as ``"k:count, ..."``.
    """
    rows = [
        {
            "run": evaluation["run"],
            "delta_mode": format_delta(row["delta_mode"]),
            "delta": row.get("delta"),
            "accuracy": row.get("accuracy"),
            "mean_k": row.get("mean_k"),
            "coverage_post_selection": row.get("coverage_post_selection"),
            "budget histogram": _histogram_text(row.get("histogram", {})),
        }
        for evaluation in evals
        for row in evaluation.get("conformal", [])
    ]
    if not rows:
        return pd.DataFrame(columns=["run", "method", "setting", "seed", "delta_mode", "accuracy", "mean_k"])
    return _run_columns(summary).merge(pd.DataFrame(rows), on="run", how="right")


def delta_sweep_table(
    summary: pd.DataFrame, conformal: pd.DataFrame, calibrations: pd.DataFrame, resampling: Resampling
) -> pd.DataFrame:
    """C-GRPO against its miscoverage level: one row per C-GRPO setting, in order of delta.

    ``delta`` is the setting's fixed delta, or for ``auto`` the mean of the deltas its training calibrations chose.
    Each metric of :data:`SWEEP_METRICS` gets its mean and 95% interval (`cgrpo.pipeline.analysis.comparison`); the coverage is the eval's
    post-selection coverage at the run's own delta mode (empty when ``evaluation.deltas`` lacks that delta), next to
    the nominal ``1 - delta``.
    """
    runs = summary[summary["method"] == "cgrpo"].assign(delta_mode=lambda t: t["delta"].map(format_delta))
    runs = runs.merge(conformal[["run", "delta_mode", "coverage_post_selection"]], on=["run", "delta_mode"], how="left")
    chosen = calibrations.drop_duplicates(["run", "step"]).groupby("run")["delta"].mean()
    runs["chosen_delta"] = runs["run"].map(chosen)
    rows = []
    for (setting, mode), group in runs.groupby(["setting", "delta_mode"], sort=False):
        delta = group["chosen_delta"].mean()
        rows.append(
            {
                "setting": setting,
                "delta_mode": mode,
                "delta": delta,
                "nominal coverage": 1 - delta,
                "seeds": len(group),
                **means_with_intervals(group, SWEEP_METRICS, resampling, setting),
            }
        )
    columns = ["setting", "delta_mode", "delta", "nominal coverage", "seeds"]
    return pd.DataFrame(rows, columns=None if rows else columns).sort_values("delta", ignore_index=True)


# --------------------------------------------------------------------------- training dynamics


def _first_column(frame: pd.DataFrame, names: Sequence[str], default: float) -> pd.Series:
    for name in names:
        if name in frame:
            return frame[name]
    return pd.Series(default, index=frame.index, dtype=float)


def steps_table(runs: Sequence[Mapping[str, Any]], steps: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Reward, group size and savings per logged step of every run, in one long table.

    ``steps`` maps a run name to its ``steps.csv``. GRPO logs no budget metrics: its group size is
    its fixed G and its savings 0.
    """
    frames = []
    for record in runs:
        log = steps[record["run"]]
        fixed_g = float(record["num_generations"])
        frames.append(
            pd.DataFrame(
                {
                    "run": record["run"],
                    "method": record["method"],
                    "setting": setting_label(record),
                    "seed": record["seed"],
                    "step": log["step"],
                    "reward": _first_column(log, ["reward"], math.nan),
                    "mean_k": _first_column(log, ["cgrpo/mean_k"], fixed_g),
                    "rollout_savings": _first_column(log, ["cgrpo/rollout_savings"], 0.0),
                    "rollouts_generated": _first_column(
                        log, ["cgrpo/rollouts_generated", "rollouts_generated"], math.nan
                    ),
                }
            )
        )
    columns = ["run", "method", "setting", "seed", "step", "reward", "mean_k", "rollout_savings", "rollouts_generated"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


def calibrations_table(runs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The conformal thresholds of every calibration of every C-GRPO run: one row per calibration and k.

    ``holdout_coverage`` is the share of held-out prompts of the same policy whose score at k is within ``qhat``
    (``cgrpo.options.calibration_holdout`` of them, ``holdout_n``), which split-conformal theory puts at about
    ``1 - delta``; empty where nothing was held out.
    """
    rows = [
        {
            "run": record["run"],
            "setting": setting_label(record),
            "seed": record["seed"],
            "step": calibration["step"],
            "delta": calibration["delta"],
            "solve_rate": calibration.get("solve_rate"),
            "k": int(k),
            "qhat": qhat,
            "holdout_coverage": (calibration.get("holdout") or {}).get("coverage", {}).get(str(k)),
            "holdout_n": (calibration.get("holdout") or {}).get("n"),
        }
        for record in runs
        if record["method"] == "cgrpo"
        for calibration in record.get("calibrations") or []
        for k, qhat in calibration["qhat"].items()
    ]
    columns = ["run", "setting", "seed", "step", "delta", "solve_rate", "k", "qhat", "holdout_coverage", "holdout_n"]
    return pd.DataFrame(rows, columns=columns)


# --------------------------------------------------------------------------- all tables and output


def build_tables(
    runs: Sequence[str | Path],
    steps: Sequence[str | Path],
    evals: Sequence[str | Path],
    matched: Sequence[str | Path] = (),
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, pd.DataFrame]:
    """Every table of the experiment from the pipeline's files.

    ``runs`` are ``run.json`` files, ``steps`` the ``steps.csv`` files (each belongs to the run whose
    ``run.json`` shares its folder), ``evals`` the eval JSONs (``"base"`` included) and ``matched``
    the compute-matching records; ``resamples`` and ``seed`` drive the bootstrap of every interval. Returns the tables
    ``summary``, ``by_method``, ``paired``, ``over_base``, ``coverage``, ``coverage_splits``, ``conformal``, ``delta_sweep``,
    ``frontier``, ``frontier_at_cgrpo`` (`cgrpo.pipeline.analysis.frontier`), ``steps`` and ``calibrations``.
    """
    run_records = load_json(runs)
    folders = {Path(path).parent: record["run"] for path, record in zip(runs, run_records)}
    missing = [str(path) for path in steps if Path(path).parent not in folders]
    if missing:
        raise ValueError(f"steps files {missing} have no run.json in their folder; pass both files of each run.")
    step_logs = {folders[Path(path).parent]: pd.read_csv(path) for path in steps}
    eval_records = load_json(evals)
    matched_records = load_json(matched)
    resampling = Resampling({record["run"]: record["per_prompt"] for record in eval_records}, resamples, seed)
    summary = summary_table(run_records, eval_records)
    conformal = conformal_table(eval_records, summary)
    calibrations = calibrations_table(run_records)
    return {
        "summary": summary,
        "by_method": by_method_table(summary, resampling),
        "paired": paired_table(summary, resampling, matched_records),
        "over_base": over_base_table(summary, resampling),
        "coverage": coverage_table(eval_records, summary),
        "coverage_splits": coverage_splits_table(eval_records, summary),
        "conformal": conformal,
        "delta_sweep": delta_sweep_table(summary, conformal, calibrations, resampling),
        "frontier": frontier_points(summary, resampling),
        "frontier_at_cgrpo": frontier_at_cgrpo(summary, resampling),
        "steps": steps_table([r for r in run_records if r["run"] in step_logs], step_logs),
        "calibrations": calibrations,
    }


def markdown(table: pd.DataFrame) -> str:
    """GitHub markdown of ``table``; a value and its ``95% CI low/high`` columns merge into ``"mean [low, high]"``.

    Numbers keep 4 significant digits (whole numbers from 10,000 up are written out), floating-point noise around
    zero reads 0, savings (shares of a reference's cost, which a run that costs more makes negative) read in percent,
    and missing values are left blank.
    """
    compact = _savings_in_percent(table)
    for column in list(compact.columns):
        low, high = f"{column} {CI_LOW}", f"{column} {CI_HIGH}"
        if low in compact and high in compact:
            compact[column] = [
                _with_interval(value, lo, hi) for value, lo, hi in zip(compact[column], compact[low], compact[high])
            ]
            compact = compact.drop(columns=[low, high]).rename(columns={column: f"{column} [95% CI]"})
    align = [
        "right" if pd.api.types.is_numeric_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype) else "left"
        for dtype in compact.dtypes
    ]
    cells = compact.astype(object).map(_cell)
    # Cells are already formatted; re-parsing them as numbers would apply one format to a whole column.
    return cells.to_markdown(index=False, disable_numparse=True, colalign=align) + "\n"


def _savings_in_percent(table: pd.DataFrame) -> pd.DataFrame:
    """`table` with every savings column (and its interval's) times 100, its name saying so."""
    savings = [column for column in table if "savings" in column and pd.api.types.is_numeric_dtype(table[column])]
    scaled = table.copy()
    scaled[savings] = scaled[savings] * 100
    return scaled.rename(columns={column: _percent_name(column) for column in savings})


def _percent_name(column: str) -> str:
    for end in (f" {CI_LOW}", f" {CI_HIGH}"):
        if column.endswith(end):
            return f"{column[: -len(end)]} (%){end}"
    return f"{column} (%)"


def _number(value: float) -> str:
    if abs(value) < FLOAT_NOISE:
        return "0"
    if abs(value) >= 1e4:
        return f"{value:.0f}"
    return f"{value:.4g}"


def _cell(value: Any) -> str:
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if isinstance(value, (bool, str)):
        return str(value)
    if isinstance(value, numbers.Number):
        return _number(float(value))
    return str(value)


def _with_interval(value: float, low: float, high: float) -> str:
    if pd.isna(value):
        return ""
    if pd.isna(low) or pd.isna(high):
        return _number(value)
    return f"{_number(value)} [{_number(low)}, {_number(high)}]"


def write_table(table: pd.DataFrame, csv_path: str | Path, md_path: str | Path | None = None) -> None:
    """Save ``table`` as CSV and, when ``md_path`` is given, as markdown (see :func:`markdown`)."""
    Path(csv_path).parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(csv_path, index=False)
    if md_path is not None:
        Path(md_path).write_text(markdown(table))
