"""The training frontier (cgrpo.pipeline.analysis.frontier) and the t interval of a cost, on synthetic run summaries."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from cgrpo.pipeline.analysis.comparison import Resampling
from cgrpo.pipeline.analysis.frontier import COSTS, frontier_at_cgrpo, frontier_points
from cgrpo.pipeline.metrics.statistics import t_mean_ci

# Six seeds: more than FEW_SEEDS, so that accuracies get the bootstrap over seeds and prompts.
SEEDS = [0, 1, 2, 3, 4, 5]
PROMPTS = 40
ROLLOUTS = COSTS["rollouts_per_prompt"]


def _flags(accuracy: float, shift: int = 0) -> list[float]:
    correct = round(accuracy * PROMPTS)
    return list(np.roll([1.0] * correct + [0.0] * (PROMPTS - correct), shift))


def _experiment(points: dict[tuple[str, str], tuple[list[float], list[float]]]) -> tuple[pd.DataFrame, Resampling]:
    """A summary of runs (method, setting) -> (rollouts per prompt per seed, sampled accuracy per seed)."""
    rows, per_prompt = [], {}
    for (method, setting), (rollouts, accuracies) in points.items():
        for seed, (cost, accuracy) in enumerate(zip(rollouts, accuracies)):
            run = f"{method}_{setting}_s{seed}"
            calibration = 2.0 if method == "cgrpo" else 0.0
            rows.append(
                {
                    "run": run,
                    "method": method,
                    "setting": setting,
                    "seed": seed,
                    "train_mean_k": cost - calibration,
                    "rollouts_per_prompt": cost,
                    "total_cpu_s": 3.0 * cost,
                    "total_wall_s": 3.5 * cost,
                    "eval_mean_at_k": accuracy,
                }
            )
            per_prompt[run] = {"eval_mean_at_k": _flags(accuracy, shift=seed)}
    base = {"run": "base", "method": "base", "setting": "base model", "seed": math.nan, "eval_mean_at_k": 0.3}
    return pd.DataFrame([base, *rows]), Resampling(per_prompt, 400, 0)


GRPO = {("grpo", f"G={g}"): ([float(g)] * 6, [a] * 6) for g, a in ((4, 0.5), (16, 0.7), (32, 0.75))}


def test_t_interval_matches_scipy_and_needs_two_values():
    values = [11.5, 12.5, 12.0, 13.0]
    mean, low, high = t_mean_ci(values)
    expected = stats.t.interval(0.95, 3, loc=np.mean(values), scale=stats.sem(values))
    assert mean == pytest.approx(12.25) and (low, high) == pytest.approx(expected)
    assert t_mean_ci([4.0, 4.0, 4.0]) == (4.0, 4.0, 4.0)
    single = t_mean_ci([3.0])
    assert single[0] == 3.0 and math.isnan(single[1]) and math.isnan(single[2])
    with pytest.raises(ValueError, match="NaN"):
        t_mean_ci([1.0, math.nan])


def test_points_report_costs_apart_and_accuracy_with_intervals():
    summary, resampling = _experiment({("cgrpo", "delta auto"): ([18.0] * 6, [0.6] * 6), **GRPO})
    points = frontier_points(summary, resampling).set_index("setting")
    assert list(points.index) == ["delta auto", "G=4", "G=16", "G=32"]
    row = points.loc["delta auto"]
    assert row["seeds"] == 6 and row[ROLLOUTS] == pytest.approx(18.0)
    assert row[COSTS["train_mean_k"]] == pytest.approx(16.0)
    assert row["calibration rollouts per prompt"] == pytest.approx(2.0)
    accuracy = "sampled accuracy (mean@k)"
    assert row[accuracy] == pytest.approx(0.6)
    assert row[f"{accuracy} 95% CI low"] < 0.6 < row[f"{accuracy} 95% CI high"]


def test_each_method_is_interpolated_in_log_cost_at_cgrpo_and_never_extrapolated():
    # C-GRPO at 8 rollouts sits halfway between G = 4 and G = 16 in log2: GRPO's frontier gives (0.5 + 0.7) / 2 there.
    # At 64 rollouts it lies beyond G = 32, where nothing is extrapolated.
    summary, resampling = _experiment(
        {
            ("cgrpo", "cheap"): ([8.0] * 6, [0.55] * 6),
            ("cgrpo", "dear"): ([64.0] * 6, [0.8] * 6),
            # Just past G = 32 on average, below it in some resamples of the seeds.
            ("cgrpo", "edge"): ([30.0, 31.0, 33.0, 34.0, 36.0, 35.0], [0.7] * 6),
            **GRPO,
        }
    )
    table = frontier_at_cgrpo(summary, resampling)
    rows = table[table["cost"] == ROLLOUTS].set_index("C-GRPO setting")
    assert set(rows["method"]) == {"grpo"} and (rows["seeds"] == 6).all()
    cheap = rows.loc["cheap"]
    assert cheap["sampled accuracy at C-GRPO's cost"] == pytest.approx(0.6)
    assert cheap["difference"] == pytest.approx(0.05)
    assert cheap["difference 95% CI low"] < 0.05 < cheap["difference 95% CI high"]
    assert cheap["resamples within range"] == 1.0
    dear = rows.loc["dear"]
    assert math.isnan(dear["difference"]) and dear["resamples within range"] == 0.0
    edge = rows.loc["edge"]
    assert math.isnan(edge["difference"]) and 0.0 < edge["resamples within range"] < 1.0
    assert math.isnan(edge["difference 95% CI low"]) and math.isnan(edge["difference 95% CI high"])
    # The CPU-time frontier of the same runs: the same interpolation, since CPU time is proportional to rollouts here.
    cpu = table[table["cost"] == COSTS["total_cpu_s"]].set_index("C-GRPO setting")
    assert cpu.loc["cheap", "difference"] == pytest.approx(0.05)
    # Without its 2 calibration rollouts per prompt, the cheap setting trains on 6 per prompt, log2(6) along the way from
    # G = 4 to G = 16; the dear one on 62, still beyond G = 32.
    training = table[table["cost"] == COSTS["train_mean_k"]].set_index("C-GRPO setting")
    at_six = 0.5 + 0.2 * (math.log2(6) - 2) / 2
    assert training.loc["cheap", "sampled accuracy at C-GRPO's cost"] == pytest.approx(at_six)
    assert math.isnan(training.loc["dear", "difference"])


def test_the_difference_is_paired_by_seed_and_prompt():
    # GRPO's runs repeat C-GRPO's per-prompt outcomes at every group size, so every resample's difference is zero:
    # paired, the interval has no width; unpaired it would span the prompts' noise.
    same = {("grpo", f"G={g}"): ([float(g)] * 6, [0.6] * 6) for g in (4, 16, 32)}
    summary, resampling = _experiment({("cgrpo", "delta auto"): ([6.0, 7.0, 8.0, 9.0, 10.0, 11.0], [0.6] * 6), **same})
    row = frontier_at_cgrpo(summary, resampling).iloc[0]
    assert row["difference"] == pytest.approx(0.0)
    assert row["difference 95% CI low"] == pytest.approx(0.0) == row["difference 95% CI high"]


def test_a_method_of_one_setting_has_no_frontier_and_unequal_seeds_are_left_out():
    summary, resampling = _experiment(
        {("cgrpo", "delta auto"): ([8.0] * 6, [0.55] * 6), ("signal", "0.1"): ([9.0] * 6, [0.6] * 6), **GRPO}
    )
    table = frontier_at_cgrpo(summary, resampling)
    assert set(table["method"]) == {"grpo"}
    # A seed that one setting lacks is left out of every paired resample.
    partial = summary[~((summary["setting"] == "G=4") & (summary["seed"] == 4))]
    assert set(frontier_at_cgrpo(partial, resampling)["seeds"]) == {5}


def test_with_few_seeds_each_seed_frontier_gives_a_paired_t_interval():
    # Three seeds: C-GRPO at 8 rollouts, halfway between G = 4 and G = 16, where GRPO's frontier is 0.6 in every seed.
    grpo = {("grpo", f"G={g}"): ([float(g)] * 3, [a] * 3) for g, a in ((4, 0.5), (16, 0.7), (32, 0.75))}
    summary, resampling = _experiment({("cgrpo", "cheap"): ([8.0] * 3, [0.55, 0.5, 0.6]), **grpo})
    row = frontier_at_cgrpo(summary, resampling).set_index("cost").loc[ROLLOUTS]
    mean, low, high = t_mean_ci([0.05, 0.1, 0.0])
    assert row["difference"] == pytest.approx(mean)
    assert (row["difference 95% CI low"], row["difference 95% CI high"]) == pytest.approx((low, high))
    assert row["interval"] == "Student's t over 3 seeds (paired for differences)"
    points = frontier_points(summary, resampling).set_index("setting")
    accuracy = "sampled accuracy (mean@k)"
    interval = t_mean_ci([0.55, 0.5, 0.6])
    assert tuple(points.loc["cheap", [accuracy, f"{accuracy} 95% CI low", f"{accuracy} 95% CI high"]]) == pytest.approx(
        interval
    )
