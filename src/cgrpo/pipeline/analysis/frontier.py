"""The training frontier: sampled accuracy against cost, per method, and every method at C-GRPO's cost.

A method's settings (C-GRPO's deltas, a stopping rule's settings, GRPO's group sizes) trace its frontier: the mean
sampled accuracy (mean@k) of its runs against their mean cost, in rollouts per training prompt (calibration included
or not) or in CPU seconds (training and calibration). :func:`frontier_points` lists the points; :func:`frontier_at_cgrpo`
interpolates every other method's frontier at each C-GRPO setting's cost and subtracts C-GRPO's accuracy there.

Interpolation is linear in log2 of the cost (group sizes double along the grid) and never extrapolates: a C-GRPO cost
outside a method's range leaves its row empty. The interval of a difference is a paired percentile bootstrap: each
resample draws the training seeds and the eval prompts once, for every run of every method alike (every run is
evaluated on the same prompts, every method trained on the same seeds), and recomputes both frontiers and the
interpolation; resamples whose C-GRPO cost falls outside the method's resampled range are left out, and their share
is reported. With `FEW_SEEDS` seeds or fewer, each seed's frontier is interpolated instead, and the interval is the
paired t interval over the seeds' differences (defined where every seed's frontier reaches C-GRPO's cost). A cost
outside the observed range gets neither a difference nor an interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pandas as pd

from ..configuration.methods import method_label
from ..metrics.statistics import t_mean_ci
from .comparison import FEW_SEEDS, Resampling, interval_name, means_with_intervals

__all__ = ["COSTS", "frontier_at_cgrpo", "frontier_points"]

# summary column -> plain-language name of the costs a frontier is drawn against. Training's rollouts alone say what a
# method's stopping costs once its calibration is amortized (a longer run, or a calibration shared between runs).
COSTS = {
    "rollouts_per_prompt": "rollouts per training prompt (incl. calibration)",
    "train_mean_k": "training rollouts per prompt (calibration excluded)",
    "total_cpu_s": "CPU time (s, training + calibration)",
}
ACCURACY = "eval_mean_at_k"

# The point table's columns: its costs apart (training, calibration), both frontier costs and the accuracy.
POINT_METRICS = {
    "train_mean_k": COSTS["train_mean_k"],
    "rollouts_per_prompt": COSTS["rollouts_per_prompt"],
    "total_cpu_s": COSTS["total_cpu_s"],
    "total_wall_s": "wall clock (s, training + calibration)",
    ACCURACY: "sampled accuracy (mean@k)",
}


def _trained(summary: pd.DataFrame) -> pd.DataFrame:
    return summary[summary["method"] != "base"]


def frontier_points(summary: pd.DataFrame, resampling: Resampling) -> pd.DataFrame:
    """One row per method and setting: seeds, costs and sampled accuracy with 95% intervals
    (:func:`cgrpo.pipeline.analysis.comparison.means_with_intervals`: t over seeds for a cost, a bootstrap over seeds and
    prompts for the accuracy), and the calibration's rollouts per prompt apart from training's."""
    rows = []
    for (method, setting), group in _trained(summary).groupby(["method", "setting"], sort=False):
        row = {"method": method, "label": method_label(method), "setting": setting, "seeds": len(group)}
        row.update(means_with_intervals(group, POINT_METRICS, resampling, f"frontier {method} {setting}"))
        row["calibration rollouts per prompt"] = row[COSTS["rollouts_per_prompt"]] - row[COSTS["train_mean_k"]]
        row["interval"] = interval_name(len(group))
        rows.append(row)
    return pd.DataFrame(rows)


def _setting_arrays(
    summary: pd.DataFrame, resampling: Resampling, seeds: list[int]
) -> dict[tuple[str, str], dict[str, np.ndarray]]:
    """Per method and setting: its seeds x prompts accuracies and its per-seed costs, rows in the order of `seeds`."""
    arrays = {}
    for key, group in _trained(summary).groupby(["method", "setting"], sort=False):
        group = group.set_index("seed", drop=False).loc[seeds]
        arrays[key] = {
            ACCURACY: resampling.table(group, ACCURACY),
            **{cost: pd.to_numeric(group[cost]).to_numpy(dtype=float) for cost in COSTS},
        }
    return arrays


def _common_seeds(summary: pd.DataFrame) -> list[int]:
    """The seeds every method and setting was trained with: the bootstrap pairs runs by seed."""
    per_setting = [set(group["seed"]) for _, group in _trained(summary).groupby(["method", "setting"])]
    return sorted(set.intersection(*per_setting)) if per_setting else []


def _resampled_means(arrays: Mapping[str, np.ndarray], seed_draws: np.ndarray, prompt_draws: np.ndarray):
    """Each quantity's mean in every resample (row 0: the observed means, no resampling)."""
    per_seed = arrays[ACCURACY][:, prompt_draws].mean(axis=2)
    resamples = np.arange(len(seed_draws))[:, None]
    means = {ACCURACY: per_seed[seed_draws, resamples].mean(axis=1)}
    means.update({cost: arrays[cost][seed_draws].mean(axis=1) for cost in COSTS})
    return means


def _draws(seeds: int, prompts: int, resampling: Resampling, few: bool) -> tuple[np.ndarray, np.ndarray]:
    """Row 0 draws the observed sample itself; the other rows are the bootstrap resamples of seeds and prompts, or
    with few seeds one row per seed alone (its own frontier), all prompts."""
    if few:
        return np.vstack([np.arange(seeds), *([s] * seeds for s in range(seeds))]), np.tile(
            np.arange(prompts), (seeds + 1, 1)
        )
    rng = np.random.default_rng([resampling.seed, seeds, prompts])
    seed_draws = np.vstack([np.arange(seeds), rng.integers(0, seeds, (resampling.resamples, seeds))])
    prompt_draws = np.vstack([np.arange(prompts), rng.integers(0, prompts, (resampling.resamples, prompts))])
    return seed_draws, prompt_draws


def _interpolate(costs: np.ndarray, accuracies: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Row by row, the accuracy at `target` cost along the frontier (settings x resamples), NaN outside its range."""
    values = np.full(target.shape, math.nan)
    for b in range(target.size):
        order = np.argsort(costs[:, b])
        x, y = np.log2(costs[order, b]), accuracies[order, b]
        point = math.log2(target[b])
        if x[0] <= point <= x[-1]:
            values[b] = np.interp(point, x, y)
    return values


def frontier_at_cgrpo(summary: pd.DataFrame, resampling: Resampling, confidence: float = 0.95) -> pd.DataFrame:
    """Every other method's frontier interpolated at each C-GRPO setting's cost, minus C-GRPO's sampled accuracy.

    One row per C-GRPO setting, method of two or more settings, and cost (:data:`COSTS`): C-GRPO's cost and accuracy,
    the method's interpolated accuracy, the difference (method minus C-GRPO) with its paired bootstrap interval (see
    the module's docstring), and the share of resamples in which the method's frontier reached C-GRPO's cost.
    """
    seeds = _common_seeds(summary)
    arrays = _setting_arrays(summary, resampling, seeds)
    if not seeds or not arrays:
        return pd.DataFrame()
    prompts = next(iter(arrays.values()))[ACCURACY].shape[1]
    few = len(seeds) <= FEW_SEEDS
    seed_draws, prompt_draws = _draws(len(seeds), prompts, resampling, few)
    means = {key: _resampled_means(value, seed_draws, prompt_draws) for key, value in arrays.items()}
    methods = pd.Series([method for method, _ in means]).value_counts()
    curves = [method for method in methods.index if method != "cgrpo" and methods[method] > 1]
    alpha = (1.0 - confidence) / 2.0
    rows = []
    for (method, setting), treated in means.items():
        if method != "cgrpo":
            continue
        for other in curves:
            settings = [value for key, value in means.items() if key[0] == other]
            for cost, cost_name in COSTS.items():
                curve = _interpolate(
                    np.array([s[cost] for s in settings]), np.array([s[ACCURACY] for s in settings]), treated[cost]
                )
                difference = curve - treated[ACCURACY]
                inside = difference[1:][np.isfinite(difference[1:])]
                # Outside the observed range there is no estimate, so no interval either, whatever a few resamples say.
                defined = math.isfinite(difference[0]) and inside.size
                if few:
                    defined = defined and inside.size == len(seeds)
                    low, high = t_mean_ci(inside, confidence)[1:] if defined else (math.nan, math.nan)
                else:
                    low, high = np.quantile(inside, [alpha, 1.0 - alpha]) if defined else (math.nan, math.nan)
                rows.append(
                    {
                        "C-GRPO setting": setting,
                        "method": other,
                        "label": method_label(other),
                        "cost": cost_name,
                        "C-GRPO cost": treated[cost][0],
                        "C-GRPO sampled accuracy": treated[ACCURACY][0],
                        "sampled accuracy at C-GRPO's cost": curve[0],
                        "difference": difference[0],
                        "difference 95% CI low": low,
                        "difference 95% CI high": high,
                        "resamples within range": inside.size / (len(seed_draws) - 1),
                        "seeds": len(seeds),
                        "interval": interval_name(len(seeds)),
                    }
                )
    return pd.DataFrame(rows)
