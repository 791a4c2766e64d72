"""Learning curves at an equal rollout budget: who reaches an accuracy first, and what each rollout buys.

Every run of a budgeted experiment trains until it has generated `budget.rollouts` rollouts (its calibrations'
included, unless `budget.include_calibration` is false) and keeps its model at milestones along the way
(`cgrpo.budget.RolloutBudget`); each milestone model is sampled on the eval prompts (`cgrpo.pipeline.jobs.curves`).
A run's curve starts where its training starts, at its initial calibration's cost, with the base model's accuracy,
and is linear between its points. Tables:

- `learning_curve`: every point of every run (method, setting, seed): cumulative rollouts, CPU and wall seconds,
  sampled accuracy (mean@k), and the learning rate with its share of the run's peak;
- `budget_comparison`: per method and setting, against the best fixed group size (the GRPO setting most accurate at
  the budget on the validation prompts, where the splits have them; else on the eval prompts): accuracy at the budget,
  and its difference to the best fixed G there (calibration counted) and at the rollouts the setting trained on
  (calibration excluded), area under the curve (the mean accuracy over the budget), rollouts and CPU seconds to reach
  the target (the base model's accuracy plus `budget.target_share` of the best fixed G's gain at the budget), and the
  speed-up to the target (the best fixed G's rollouts to it over the method's); beside every difference's interval,
  the difference the run detects with 80% power; what the batches offered the policy gradient
  (`cgrpo.support.learning_signal`);
- `lr_sweep`: every setting's validation accuracy at the budget by learning rate, and each method's chosen rate
  (`learning_rates.sweep`; empty without validation prompts);
- `budget_calibrations`: every calibration of every run, with a fingerprint of the prompts it was fitted on, so that
  calibrations drawn per seed show their thresholds and prompts differing;
- `budget_curve`: each method's mean curve on the common grid (accuracy, training rollouts and CPU seconds against
  rollouts) and its paired difference to the best fixed G along the budget.

Statistics: every run's curve is read on a common grid of rollouts (`GRID_POINTS` per milestone interval); a
method's curve is the mean over its seeds and the eval prompts. Intervals are 95% percentile bootstraps that
resample the training seeds and the eval prompts together, the same draws for every method, so that differences and
ratios are paired; the best fixed G and the target are fixed at their point estimates. A method that does not reach
the target within the budget in a resample has an infinite time to it there (a speed-up of 0). Runs trained under
different learning-rate schedules (`budget.lr_schedule`) are refused: their curves would differ by more than the
methods.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import norm

from ..configuration.methods import METHODS, method_label, method_order, setting_label
from ..metrics.statistics import purpose_seed

LOGGER = logging.getLogger(__name__)

__all__ = [
    "GRID_POINTS",
    "budget_calibrations_table",
    "budget_tables",
    "curve_points",
    "detectable_difference",
    "lr_sweep_table",
    "write_budget_outputs",
]

# Grid points per milestone interval on which every run's curve is read (its curve is linear between its points).
GRID_POINTS = 4
STATISTIC = (
    "mean over seeds and eval prompts; 95% percentile bootstrap resampling seeds and prompts together, paired across "
    "methods"
)
SIGNAL_COLUMNS = ("informative_group_share", "signal_rows_per_rollout", "max_prompt_weight")
# A 95% interval's half-width is 1.96 standard errors; a difference of (1.96 + 0.84) standard errors is detected by a
# two-sided 5% test with 80% power.
POWER_FACTOR = float((norm.ppf(0.975) + norm.ppf(0.8)) / norm.ppf(0.975))


def curve_points(curve: Mapping[str, Any], record: Mapping[str, Any], base: Mapping[str, Any]) -> list[dict]:
    """A run's points: its start and its milestones.

    Training starts after the calibrations of step 0 (C-GRPO's initial one, run in a job of its own, or a calibrated
    rule's own, run by its trainer before the first step): where the budget counts calibration, the start is at
    their rollouts and seconds, with the base model's accuracy. The initial calibration's seconds, spent outside
    the training job, are added to every milestone's; the trainer's own calibrations are in its seconds already, as
    every calibration's rollouts are in its count.
    """
    counted = record["budget"]["include_calibration"]
    first = [c for c in record.get("calibrations") or [] if c["step"] == 0] if counted else []
    initial = [c for c in first if c.get("initial")]
    offset = {key: sum(c.get(key, 0.0) for c in initial) for key in ("cpu_s", "wall_s")}
    start = {
        **base["points"][0],
        "rollouts": sum(c["rollouts"] for c in first),
        "cpu_s": sum(c.get("cpu_s", 0.0) for c in first),
        "wall_s": sum(c["wall_s"] for c in first),
    }
    later = [
        {**p, "cpu_s": p["cpu_s"] + offset["cpu_s"], "wall_s": p["wall_s"] + offset["wall_s"]} for p in curve["points"]
    ]
    return [start, *later]


def _curve_table(runs: Sequence[Mapping[str, Any]], points: Mapping[str, list[dict]]) -> pd.DataFrame:
    rows = []
    for record in runs:
        for point in points[record["run"]]:
            rows.append(
                {
                    "run": record["run"],
                    "method": record["method"],
                    "setting": setting_label(record),
                    "seed": record["seed"],
                    **{
                        key: point[key]
                        for key in ("milestone", "step", "rollouts", "train_rollouts", "cpu_s", "wall_s")
                    },
                    "sampled_accuracy": float(np.mean(point["per_prompt"])),
                    **_learning_rate_columns(point, record),
                }
            )
    return pd.DataFrame(rows)


def _learning_rate_columns(point: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, float]:
    """The learning rate at a point and its share of the run's peak (at the start, before any update: the peak's
    schedule has not begun, NaN)."""
    rate, peak = point.get("learning_rate", math.nan), record.get("learning_rate", math.nan)
    return {"learning_rate": rate, "learning_rate_share": rate / peak if peak else math.nan}


def _on_grid(points: list[dict], grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A run's per-prompt accuracy (grid, prompts) and CPU seconds (grid,) read on `grid` (rollouts); flat before
    its start and after its last point."""
    x = np.array([p["rollouts"] for p in points], dtype=float)
    accuracy = np.array([p["per_prompt"] for p in points], dtype=float)
    cpu = np.array([p["cpu_s"] for p in points], dtype=float)
    # np.interp holds the end values outside the points: before its start a run has trained nothing.
    on_grid = np.stack([np.interp(grid, x, accuracy[:, prompt]) for prompt in range(accuracy.shape[1])], axis=1)
    return on_grid, np.interp(grid, x, cpu)


def _trained_on_grid(points: list[dict], grid: np.ndarray) -> np.ndarray:
    """A run's training rollouts (calibration excluded) at each rollout count of `grid`."""
    x = np.array([p["rollouts"] for p in points], dtype=float)
    return np.interp(grid, x, np.array([p["train_rollouts"] for p in points], dtype=float))


def _first_crossing(curve: np.ndarray, grid: np.ndarray, target: float) -> np.ndarray:
    """Per row of `curve` (resamples, grid), the rollouts where it first reaches `target` (linear between grid
    points), inf where it never does."""
    above = curve >= target
    first = np.where(above.any(axis=1), above.argmax(axis=1), -1)
    # An undefined (NaN) target has no crossing to be late for: NaN, not "never".
    result = np.full(len(curve), np.inf if not math.isnan(target) else math.nan)
    for r, i in enumerate(first):
        if i == 0:
            result[r] = grid[0]
        elif i > 0:
            low, high = curve[r, i - 1], curve[r, i]
            result[r] = grid[i - 1] + (target - low) / (high - low) * (grid[i] - grid[i - 1])
    return result


def _interval(values: np.ndarray) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the resamples where the statistic is defined (NaN: a ratio of two curves
    that both miss the target), taken as drawn values, so that an infinite time to the target stays infinite."""
    defined = values[~np.isnan(values)]
    if not len(defined):
        return math.nan, math.nan
    return float(np.percentile(defined, 2.5, method="lower")), float(np.percentile(defined, 97.5, method="higher"))


def budget_tables(
    runs: Sequence[Mapping[str, Any]],
    curves: Sequence[Mapping[str, Any]],
    target_share: float,
    resamples: int = 2000,
    seed: int = 0,
) -> dict[str, pd.DataFrame]:
    """The tables `learning_curve`, `budget_comparison` and `budget_curve` (see the module docstring)
    from the runs' records and their curves (the base model's, run "base", among them)."""
    by_run = {curve["run"]: curve for curve in curves}
    if "base" not in by_run:
        raise ValueError("The learning curves need the base model's curve (run 'base'); add curves/base.json.")
    runs = [record for record in runs if record["run"] in by_run]
    _check_one_schedule(runs)
    points = {record["run"]: curve_points(by_run[record["run"]], record, by_run["base"]) for record in runs}
    budget = max(record["budget"]["rollouts"] for record in runs)
    parts = len(runs[0]["budget"]["milestones"])
    grid = np.linspace(0.0, budget, parts * GRID_POINTS + 1)
    settings = _settings(runs)
    seeds = sorted(set.intersection(*(set(group) for group in settings.values())))
    accuracy = {
        key: np.stack([_on_grid(points[group[s]["run"]], grid)[0] for s in seeds]) for key, group in settings.items()
    }
    cpu = {
        key: np.stack([_on_grid(points[group[s]["run"]], grid)[1] for s in seeds]) for key, group in settings.items()
    }
    # The training rollouts behind each point of the grid (the rollouts less the calibrations counted up to it).
    trained_on_grid = {
        key: np.mean([_trained_on_grid(points[group[s]["run"]], grid) for s in seeds], axis=0)
        for key, group in settings.items()
    }
    base_accuracy = float(np.mean(by_run["base"]["points"][0]["per_prompt"]))
    validation = _validation_at_budget(settings, points, seeds)
    best, chosen_on = _best_fixed(settings, accuracy, validation)
    gain = accuracy[best][:, -1].mean() - base_accuracy
    # Where the best fixed G ends no better than the base model, every curve starts at the target: no time to it means
    # anything, so the target is undefined and the to-target columns are empty rather than a division by zero.
    target = base_accuracy + target_share * gain if gain > 0 else math.nan
    if gain <= 0:
        LOGGER.warning("the best fixed G (%s) gains nothing over the base model: no target accuracy", best[1])
    draws = _draws(len(seeds), accuracy[best].shape[2], resamples, seed)
    curves_drawn = {key: _resampled(values, draws) for key, values in accuracy.items()}
    cpu_drawn = {key: draws[0] @ values / len(seeds) for key, values in cpu.items()}
    trained = {
        key: float(np.mean([points[group[s]["run"]][-1]["train_rollouts"] for s in seeds]))
        for key, group in settings.items()
    }
    context = {
        "best": best,
        "chosen_on": chosen_on,
        "target": target,
        "base": base_accuracy,
        "grid": grid,
        "seeds": len(seeds),
        "trained": trained,
        "trained_on_grid": trained_on_grid,
    }
    comparison = pd.DataFrame(
        [_comparison_row(key, settings[key], accuracy, cpu, curves_drawn, cpu_drawn, context) for key in settings]
    )
    curve = pd.DataFrame([row for key in settings for row in _curve_rows(key, accuracy, cpu, curves_drawn, context)])
    tables = {"learning_curve": _curve_table(runs, points), "budget_comparison": comparison, "budget_curve": curve}
    tables["lr_sweep"] = lr_sweep_table(settings, validation, resamples, seed)
    return tables


def _check_one_schedule(runs: Sequence[Mapping[str, Any]]) -> None:
    """Refuse runs trained under different learning-rate schedules: their curves would differ by more than the
    methods."""
    schedules = {json.dumps(record["budget"].get("lr_schedule"), sort_keys=True) for record in runs}
    if len(schedules) > 1:
        raise ValueError(
            f"The runs were trained under {len(schedules)} learning-rate schedules ({'; '.join(sorted(schedules))}), "
            "so their curves differ by more than their methods; train them again under one budget.lr_schedule."
        )


def _validation_at_budget(settings, points, seeds) -> dict[tuple[str, str], np.ndarray] | None:
    """Per setting, each seed's per-prompt validation accuracy at the budget (seeds, prompts); None where any run
    lacks it (splits without a validation split)."""
    final = {run: run_points[-1].get("validation_per_prompt") for run, run_points in points.items()}
    if any(values is None for values in final.values()):
        return None
    return {key: np.array([final[group[s]["run"]] for s in seeds], dtype=float) for key, group in settings.items()}


def _settings(runs: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], dict[int, Mapping[str, Any]]]:
    """The runs by (method, setting), then by seed, in the tables' method order."""
    settings: dict[tuple[str, str], dict[int, Mapping[str, Any]]] = {}
    for record in sorted(runs, key=lambda r: (method_order(r["method"]), setting_label(r), r["seed"])):
        settings.setdefault((record["method"], setting_label(record)), {})[record["seed"]] = record
    return settings


def _best_fixed(settings, accuracy, validation) -> tuple[tuple[str, str], str]:
    """The fixed group size most accurate at the budget, and the prompts it was chosen on: the validation prompts
    where the splits have them, so that the eval prompts only report; else the eval prompts, with a warning."""
    fixed = [key for key, group in settings.items() if key[0] == "grpo" and not _any(group, "compute_matched")]
    if not fixed:
        raise ValueError("The budget comparison needs fixed-G GRPO runs to compare with; list grpo.num_generations.")
    if validation is not None:
        return max(fixed, key=lambda key: validation[key].mean()), "validation prompts"
    LOGGER.warning(
        "the splits have no validation split: the best fixed G is chosen on the eval prompts it is then compared on "
        "(a winner's curse); set splits.sizes.validation"
    )
    return max(fixed, key=lambda key: accuracy[key][:, -1].mean()), "eval prompts"


def _any(group: Mapping[int, Mapping[str, Any]], field: str) -> bool:
    return any(record.get(field) for record in group.values())


def _draws(
    seeds: int, prompts: int, resamples: int, seed: int, purpose: str = "budget-bootstrap"
) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap counts of each seed and each prompt per resample: (resamples, seeds) and (resamples, prompts)."""
    rng = np.random.default_rng(purpose_seed(seed, purpose))
    seed_draws = rng.integers(0, seeds, size=(resamples, seeds))
    prompt_draws = rng.integers(0, prompts, size=(resamples, prompts))
    seed_counts = np.stack([np.bincount(row, minlength=seeds) for row in seed_draws]).astype(float)
    prompt_counts = np.stack([np.bincount(row, minlength=prompts) for row in prompt_draws]).astype(float)
    return seed_counts, prompt_counts


def _resampled(values: np.ndarray, draws) -> np.ndarray:
    """Mean curves (resamples, grid) of a (seeds, grid, prompts) array under the bootstrap counts."""
    seed_counts, prompt_counts = draws
    return np.einsum("rs,sgp,rp->rg", seed_counts, values, prompt_counts) / (values.shape[0] * values.shape[2])


def _auc(curve: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Mean accuracy over the budget: the area under each curve (last axis over `grid`) divided by the budget."""
    return np.trapezoid(curve, grid, axis=-1) / grid[-1]


def _comparison_row(key, group, accuracy, cpu, curves_drawn, cpu_drawn, context) -> dict[str, Any]:
    grid, best = context["grid"], context["best"]
    mean = accuracy[key].mean(axis=(0, 2))
    mean_cpu = cpu[key].mean(axis=0)
    row = {
        "method": key[0],
        "label": method_label(key[0]),
        "setting": key[1],
        "seeds": context["seeds"],
        "prompts": accuracy[key].shape[2],
        "budget": grid[-1],
        "base accuracy": context["base"],
        "best fixed G": best[1],
        "best fixed G chosen on": context["chosen_on"],
        "target accuracy": context["target"],
        "training rollouts at budget": context["trained"][key],
    }
    # Calibration excluded: the best fixed G's curve at the rollouts this setting trained on (its own: fixed G draws
    # no calibration), as a long run would compare them once one calibration has amortized.
    best_curve = accuracy[best].mean(axis=(0, 2))
    trained = context["trained"][key]
    best_at_trained = np.array([np.interp(trained, grid, drawn) for drawn in curves_drawn[best]])
    measures = {
        "accuracy at budget": (mean[-1], curves_drawn[key][:, -1]),
        "accuracy at budget minus best fixed G": (
            mean[-1] - accuracy[best].mean(axis=(0, 2))[-1],
            curves_drawn[key][:, -1] - curves_drawn[best][:, -1],
        ),
        "accuracy at budget minus best fixed G at equal training rollouts": (
            mean[-1] - np.interp(trained, grid, best_curve),
            curves_drawn[key][:, -1] - best_at_trained,
        ),
        "mean accuracy over the budget (AUC)": (_auc(mean, grid), _auc(curves_drawn[key], grid)),
        "AUC minus best fixed G": (
            _auc(mean, grid) - _auc(accuracy[best].mean(axis=(0, 2)), grid),
            _auc(curves_drawn[key], grid) - _auc(curves_drawn[best], grid),
        ),
    }
    to_target = _first_crossing(mean[None], grid, context["target"])[0]
    drawn_to_target = _first_crossing(curves_drawn[key], grid, context["target"])
    best_to_target = _first_crossing(curves_drawn[best], grid, context["target"])
    point_best = _first_crossing(accuracy[best].mean(axis=(0, 2))[None], grid, context["target"])[0]
    with np.errstate(divide="ignore", invalid="ignore"):
        measures["rollouts to target"] = (to_target, drawn_to_target)
        measures["speed-up to target over best fixed G"] = (point_best / to_target, best_to_target / drawn_to_target)
        cpu_at = _cpu_at(to_target, grid, mean_cpu)
        cpu_best = _cpu_at(point_best, grid, cpu[best].mean(axis=0))
        drawn_cpu = np.array([_cpu_at(t, grid, c) for t, c in zip(drawn_to_target, cpu_drawn[key])])
        drawn_cpu_best = np.array([_cpu_at(t, grid, c) for t, c in zip(best_to_target, cpu_drawn[best])])
        measures["CPU seconds to target"] = (cpu_at, drawn_cpu)
        measures["CPU speed-up to target over best fixed G"] = (cpu_best / cpu_at, drawn_cpu_best / drawn_cpu)
    for name, (point, drawn) in measures.items():
        row[name] = float(point)
        low, high = _interval(np.asarray(drawn, dtype=float))
        row[f"{name} 95% CI low"], row[f"{name} 95% CI high"] = low, high
        if "minus" in name:
            row[f"{name} detectable at 80% power"] = detectable_difference(low, high)
    row["resamples reaching target"] = float(np.isfinite(drawn_to_target).mean())
    row["CPU seconds at budget"] = float(mean_cpu[-1])
    for column in SIGNAL_COLUMNS:
        values = [record.get(column) for record in group.values() if record.get(column) is not None]
        row[column] = float(np.mean(values)) if values else math.nan
    row["statistic"] = STATISTIC
    return row


def detectable_difference(low: float, high: float) -> float:
    """The difference a two-sided test at the 5% level detects with 80% power, for a 95% interval [low, high]: its
    half-width times (z_0.975 + z_0.8) / z_0.975, about 1.43 (a half-width alone is detected half the time)."""
    return (high - low) / 2 * POWER_FACTOR


def _cpu_at(rollouts: float, grid: np.ndarray, cpu: np.ndarray) -> float:
    """CPU seconds of a mean curve at `rollouts` (inf where the target is never reached, NaN where it is undefined)."""
    return float(np.interp(rollouts, grid, cpu)) if np.isfinite(rollouts) else float(rollouts)


def _curve_rows(key, accuracy, cpu, curves_drawn, context) -> list[dict[str, Any]]:
    """The mean curve of `key` on the grid, with its interval, and its paired difference to the best fixed G."""
    best, grid = context["best"], context["grid"]
    mean = accuracy[key].mean(axis=(0, 2))
    difference = mean - accuracy[best].mean(axis=(0, 2))
    drawn_difference = curves_drawn[key] - curves_drawn[best]
    rows = []
    for g, rollouts in enumerate(grid):
        low, high = _interval(curves_drawn[key][:, g])
        difference_low, difference_high = _interval(drawn_difference[:, g])
        rows.append(
            {
                "method": key[0],
                "label": method_label(key[0]),
                "setting": key[1],
                "rollouts": float(rollouts),
                "training rollouts": float(context["trained_on_grid"][key][g]),
                "CPU seconds": float(cpu[key][:, g].mean()),
                "sampled accuracy": float(mean[g]),
                "sampled accuracy 95% CI low": low,
                "sampled accuracy 95% CI high": high,
                "best fixed G": best[1],
                "difference to best fixed G": float(difference[g]),
                "difference to best fixed G 95% CI low": difference_low,
                "difference to best fixed G 95% CI high": difference_high,
                "target accuracy": context["target"],
            }
        )
    return rows


LR_SWEEP_COLUMNS = [
    "method",
    "label",
    "setting",
    "learning rate multiple",
    "learning rate",
    "validation accuracy at budget",
    "validation accuracy at budget 95% CI low",
    "validation accuracy at budget 95% CI high",
    "method's mean over its settings",
    "chosen",
    "statistic",
]


def lr_sweep_table(
    settings: Mapping[tuple[str, str], Mapping[int, Mapping[str, Any]]],
    validation: Mapping[tuple[str, str], np.ndarray] | None,
    resamples: int,
    seed: int,
) -> pd.DataFrame:
    """Every setting's validation accuracy at the budget, by learning rate, and each method's choice: the multiple
    of its learning rate (`learning_rates.sweep`) with the best mean over the method's settings. Empty without
    validation prompts."""
    if validation is None:
        return pd.DataFrame(columns=LR_SWEEP_COLUMNS)
    seeds, prompts = next(iter(validation.values())).shape
    seed_counts, prompt_counts = _draws(seeds, prompts, resamples, seed, "lr-sweep-bootstrap")
    rows = []
    for key, group in settings.items():
        record = next(iter(group.values()))
        drawn = np.einsum("rs,sp,rp->r", seed_counts, validation[key], prompt_counts) / (seeds * prompts)
        low, high = _interval(drawn)
        rows.append(
            {
                "method": key[0],
                "label": method_label(key[0]),
                "setting": METHODS[key[0]].setting(record),
                "learning rate multiple": float(record.get("learning_rate_factor", 1.0)),
                "learning rate": float(record.get("learning_rate", math.nan)),
                "validation accuracy at budget": float(validation[key].mean()),
                "validation accuracy at budget 95% CI low": low,
                "validation accuracy at budget 95% CI high": high,
            }
        )
    table = pd.DataFrame(rows)
    by_rate = table.groupby(["method", "learning rate multiple"])["validation accuracy at budget"].transform("mean")
    table["method's mean over its settings"] = by_rate
    best = table.loc[by_rate.groupby(table["method"]).idxmax(), ["method", "learning rate multiple"]]
    chosen = set(map(tuple, best.to_numpy()))
    table["chosen"] = [(m, f) in chosen for m, f in zip(table["method"], table["learning rate multiple"])]
    table["statistic"] = "mean over seeds and validation prompts; 95% percentile bootstrap over seeds and prompts"
    return table[LR_SWEEP_COLUMNS]


def budget_calibrations_table(runs: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per calibration of every run: its step, the prompts' fingerprint (`prompt_set`), its rollouts, and its
    fit (the conformal delta and thresholds by budget, or the signal rule's lambda, -1 where its delta was not met and
    it stops no uniform group early, with the informative control prompts it found)."""
    rows = [
        {
            "run": record["run"],
            "method": record["method"],
            "setting": setting_label(record),
            "seed": record["seed"],
            "step": calibration["step"],
            "prompt_set": calibration.get("prompt_set"),
            "rollouts": calibration["rollouts"],
            "delta": calibration.get("delta"),
            "lambda": calibration.get("lambda"),
            "informative control prompts": calibration.get("n_informative"),
            "qhat": ", ".join(f"{k}:{q:.3f}" for k, q in (calibration.get("qhat") or {}).items()) or None,
        }
        for record in sorted(runs, key=lambda r: (method_order(r["method"]), r["run"]))
        for calibration in record.get("calibrations") or []
    ]
    columns = ["run", "method", "setting", "seed", "step", "prompt_set", "rollouts", "delta", "lambda"]
    columns += ["informative control prompts", "qhat"]
    return pd.DataFrame(rows, columns=columns)


def write_budget_outputs(
    runs: Sequence[str], curves: Sequence[str], spec: Mapping[str, Any], outputs: Mapping[str, str]
) -> None:
    """Read the runs' records and curves, and write the tables and the figure (rule learning_curves; `spec` holds
    `target_share`, `resamples` and `seed`)."""
    from .budget_plots import plot_learning_curves
    from .mechanisms import mechanism_table
    from .reporting import load_json, write_table

    run_records = load_json(runs)
    tables = budget_tables(run_records, load_json(curves), spec["target_share"], spec["resamples"], spec["seed"])
    tables["budget_calibrations"] = budget_calibrations_table(run_records)
    tables["budget_mechanisms"] = mechanism_table(run_records)
    for name, table in tables.items():
        write_table(table, outputs[name], outputs.get(f"{name}_md"))
    plot_learning_curves(tables["budget_curve"], outputs["plot"])
