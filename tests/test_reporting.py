"""Reporting tables and plots, from a synthetic experiment written the way the pipeline writes it."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from cgrpo.pipeline.analysis import comparison, plots, reporting
from cgrpo.pipeline.analysis.comparison import Resampling
from cgrpo.pipeline.analysis.matching import match_group_size
from cgrpo.pipeline.configuration.methods import setting_label
from cgrpo.pipeline.metrics.statistics import t_mean_ci

SEEDS = [0, 1, 2]
GRID = [2, 4, 8, 16, 32]
CGRPO_SETTING = "grid 2-4-8-16-32, delta auto, recal 10"
# run -> (greedy accuracy per seed, rollouts per training prompt per seed)
ACCURACY = {"cgrpo": [0.42, 0.45, 0.40], "G32": [0.43, 0.44, 0.42], "G4": [0.35, 0.37, 0.33], "G12": [0.39, 0.41, 0.38]}
ROLLOUTS = {"cgrpo": [11.5, 12.5, 12.0], "G32": [32.0] * 3, "G4": [4.0] * 3, "G12": [12.0] * 3}
STEPS = 12
PROMPTS = 100


def _run_record(method: str, seed: int, key: str, *, g: int | None = None, matched: bool = False) -> dict:
    """A run.json with the keys cgrpo.pipeline.jobs.runs.train_run writes."""
    cgrpo = method == "cgrpo"
    rollouts_per_prompt = ROLLOUTS[key][seed]
    groups = 300
    calibration = 640 if cgrpo else 0
    train = int(rollouts_per_prompt * groups) - calibration if cgrpo else int(rollouts_per_prompt * groups)
    name = f"cgrpo_s{seed}_g2-4-8-16-32_dauto_r10" if cgrpo else f"grpo_s{seed}_G{g}" + ("_matched" if matched else "")
    width = 32 if cgrpo else g
    return {
        "run": name,
        "method": method,
        "seed": seed,
        "num_generations": width,
        "budget_grid": "2-4-8-16-32" if cgrpo else None,
        "delta": "auto" if cgrpo else None,
        "recalibrate_every": 10 if cgrpo else None,
        "compute_matched": matched,
        "steps": STEPS,
        "groups": groups,
        "train_rollouts_generated": train,
        "train_tokens_generated": 20 * train,
        "calibration_rollouts_generated": calibration,
        "calibration_tokens_generated": 20 * calibration,
        "train_mean_k": train / groups,
        "train_rollout_savings": 1 - train / (groups * width),
        "train_rollout_savings_with_calibration": 1 - (train + calibration) / (groups * width),
        "rollouts_per_prompt": rollouts_per_prompt,
        "train_wall_s": 100.0 + 3 * rollouts_per_prompt + seed,
        "generation_wall_s": 2.0 * rollouts_per_prompt,
        "update_wall_s": 50.0,
        "calibration_wall_s": 8.0 if cgrpo else 0.0,
        "total_wall_s": 100.0 + 3 * rollouts_per_prompt + seed + (4.0 if cgrpo else 0.0),
        "train_cpu_s": 90.0 + 2 * rollouts_per_prompt,
        "total_cpu_s": 90.0 + 2 * rollouts_per_prompt + (3.0 if cgrpo else 0.0),
        "reference_budget": 32,
        "steps_per_generation": 8 if cgrpo else 1,
        "train_budget_histogram": {"2": 150, "8": 50, "32": 100} if cgrpo else {str(width): groups},
        "calibrations": [
            {
                "step": step,
                "delta": 0.3 - 0.01 * step,
                "qhat": {str(k): 1.0 - 0.02 * step - k / 64 for k in GRID},
                "solve_rate": 0.6 + 0.01 * step,
                "rollouts": 320,
                "tokens": 6400,
                "wall_s": 4.0,
            }
            for step in (0, 5, 10)
        ]
        if cgrpo
        else [],
    }


def _steps(record: dict) -> pd.DataFrame:
    steps = np.arange(1, STEPS + 1)
    frame = pd.DataFrame({"step": steps, "loss": 0.01, "reward": 0.2 + 0.02 * steps + 0.01 * record["seed"]})
    if record["method"] == "cgrpo":
        mean_k = np.linspace(20, 8, STEPS) + record["seed"]
        frame["cgrpo/mean_k"] = mean_k
        frame["cgrpo/rollout_savings"] = 1 - mean_k / 32
        frame["cgrpo/rollouts_generated"] = mean_k * 3
        frame["cgrpo/qhat_2"] = 0.9
    return frame


def _eval_record(run: str, accuracy: float) -> dict:
    """An eval JSON with the keys cgrpo.pipeline.jobs.evaluation.evaluate_model writes."""
    coverage = []
    for mode, delta in (("auto", 0.27), (0.1, 0.1), (0.2, 0.2)):
        for k in GRID:
            value = min(1.0, 1 - delta + 0.02 * math.log2(k) - 0.03)
            coverage.append(
                {
                    "delta_mode": mode,
                    "k": k,
                    "coverage": value,
                    "n_covered": int(200 * value),
                    "n_eval": 200,
                    "nominal": 1 - delta,
                    "band_low": 1 - delta,
                    "band_high": 1 - delta + 1 / 129,
                    "band_valid": True,
                    "ci_low": max(0.0, value - 0.06),
                    "ci_high": min(1.0, value + 0.05),
                }
            )
    conformal = [
        {
            "delta_mode": mode,
            "delta": delta,
            "n_calibration": 128,
            "qhat": {str(k): 0.5 for k in GRID},
            "accuracy": accuracy + 0.05,
            "mean_k": 9.5,
            "histogram": {"2": 50, "4": 40, "8": 30, "16": 40, "32": 40},
            "coverage_post_selection": 0.8,
        }
        for mode, delta in (("auto", 0.27), (0.1, 0.1))
    ]
    splits = [
        {
            "delta_mode": mode,
            "delta": delta,
            "k": k,
            "n_calibration": 128,
            "repeats": 200,
            "mean": 1 - delta,
            "q05": 1 - delta - 0.05,
            "q95": 1 - delta + 0.05,
            "theory_mean": 1 - delta,
            "theory_q05": 1 - delta - 0.06,
            "theory_q95": 1 - delta + 0.06,
            "within_theory_90": 0.93,
        }
        for mode, delta in (("auto", 0.27), (0.1, 0.1))
        for k in GRID
    ]
    return {
        "run": run,
        "eval_greedy_acc": accuracy,
        "eval_maj_acc": accuracy + 0.1,
        "maj_at_k": {str(k): accuracy for k in GRID},
        "pass_at_k": {str(k): accuracy for k in GRID},
        "mean_at_k": accuracy - 0.05,
        "conformal": conformal,
        "coverage": coverage,
        "coverage_splits": splits,
        "per_prompt": {
            "eval_greedy_acc": _flags(accuracy),
            "eval_maj_acc": _flags(accuracy + 0.1),
            "eval_mean_at_k": _flags(accuracy - 0.05),
        },
        "eval_wall_s": 30.0,
    }


def _flags(accuracy: float) -> list[float]:
    """Per-prompt outcomes of PROMPTS eval prompts whose mean is `accuracy`."""
    correct = round(accuracy * PROMPTS)
    return [1.0] * correct + [0.0] * (PROMPTS - correct)


def _write_json(path, record) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return str(path)


def write_experiment(root) -> dict[str, list[str]]:
    """Write runs, steps, evals and a matched record of a 3-seed experiment under ``root``; return the paths."""
    runs = [
        (_run_record(method, seed, key, g=g, matched=matched), key)
        for seed in SEEDS
        for method, key, g, matched in [
            ("cgrpo", "cgrpo", None, False),
            ("grpo", "G32", 32, False),
            ("grpo", "G4", 4, False),
            ("grpo", "G12", 12, True),
        ]
    ]
    paths: dict[str, list[str]] = {"runs": [], "steps": [], "evals": [], "matched": []}
    for record, key in runs:
        folder = root / "runs" / record["run"]
        paths["runs"].append(_write_json(folder / "run.json", record))
        _steps(record).to_csv(folder / "steps.csv", index=False)
        paths["steps"].append(str(folder / "steps.csv"))
        accuracy = ACCURACY[key][record["seed"]]
        evaluation = _eval_record(record["run"], accuracy)
        paths["evals"].append(_write_json(root / "eval" / f"{record['run']}.json", evaluation))
    paths["evals"].append(_write_json(root / "eval" / "base.json", _eval_record("base", 0.30)))
    cgrpo_runs = [path for path in paths["runs"] if "/cgrpo_" in path]
    matched = match_group_size(cgrpo_runs)
    paths["matched"].append(_write_json(root / "matched" / "g2-4-8-16-32_dauto_r10.json", matched))
    return paths


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> dict[str, list[str]]:
    return write_experiment(tmp_path_factory.mktemp("experiment"))


@pytest.fixture(scope="module")
def tables(experiment) -> dict[str, pd.DataFrame]:
    return reporting.build_tables(**experiment)


# --------------------------------------------------------------------------- summary


def test_summary_has_one_row_per_evaluated_model(tables):
    summary = tables["summary"]
    assert len(summary) == 1 + 4 * len(SEEDS)
    required = {
        "run",
        "method",
        "seed",
        "num_generations",
        "budget_grid",
        "delta",
        "recalibrate_every",
        "compute_matched",
        "eval_greedy_acc",
        "eval_maj_acc",
        "train_mean_k",
        "train_rollout_savings",
        "train_rollout_savings_with_calibration",
        "train_rollouts_generated",
        "calibration_rollouts_generated",
        "rollouts_per_prompt",
        "train_tokens_generated",
        "calibration_tokens_generated",
        "train_wall_s",
        "generation_wall_s",
        "update_wall_s",
        "calibration_wall_s",
        "eval_wall_s",
    }
    assert required <= set(summary.columns)
    assert summary["method"].tolist()[0] == "base"
    assert set(summary["method"]) == {"base", "cgrpo", "grpo"}
    base = summary.iloc[0]
    assert base["eval_greedy_acc"] == pytest.approx(0.30) and pd.isna(base["seed"])
    cgrpo = summary[summary["method"] == "cgrpo"]
    assert (cgrpo["num_generations"] == 32).all() and (cgrpo["delta"] == "auto").all()
    assert (cgrpo["setting"] == CGRPO_SETTING).all()
    assert (
        cgrpo["total_rollouts_generated"] == cgrpo["train_rollouts_generated"] + cgrpo["calibration_rollouts_generated"]
    ).all()
    matched = summary[summary["compute_matched"] == True]  # noqa: E712  (object column of bools and None)
    assert set(matched["setting"]) == {"G=12 (compute-matched)"}


def test_time_savings_are_against_the_same_seeds_grpo_at_the_reference_budget(tables):
    summary = tables["summary"].set_index("run")
    for seed in SEEDS:
        reference = summary.loc[f"grpo_s{seed}_G32", "total_wall_s"]
        cgrpo = summary.loc[f"cgrpo_s{seed}_g2-4-8-16-32_dauto_r10"]
        assert cgrpo["total_wall_s"] == pytest.approx(100.0 + 3 * ROLLOUTS["cgrpo"][seed] + seed + 4.0)
        assert cgrpo["time_savings"] == pytest.approx(1 - cgrpo["total_wall_s"] / reference)
        cpu_reference = summary.loc[f"grpo_s{seed}_G32", "total_cpu_s"]
        assert cgrpo["cpu_time_savings"] == pytest.approx(1 - cgrpo["total_cpu_s"] / cpu_reference)
        assert summary.loc[f"grpo_s{seed}_G4", "time_savings"] == pytest.approx(
            1 - summary.loc[f"grpo_s{seed}_G4", "total_wall_s"] / reference
        )
        assert summary.loc[f"grpo_s{seed}_G32", "time_savings"] == 0
        assert cgrpo["train_budget_histogram"] == "2:150, 8:50, 32:100"
        assert cgrpo["train_intermediate_share"] == pytest.approx(50 / 300)
        assert cgrpo["eval_budget_histogram"] == "2:50, 4:40, 8:30, 16:40, 32:40"
    assert pd.isna(summary.loc["base", "time_savings"])


def test_time_savings_without_the_reference_run_are_empty():
    records = [_run_record("cgrpo", 0, "cgrpo"), _run_record("grpo", 0, "G4", g=4)]
    summary = reporting.summary_table(records, [_eval_record(r["run"], 0.1) for r in records])
    assert summary["time_savings"].isna().all()


def test_summary_refuses_an_eval_without_its_run():
    with pytest.raises(ValueError, match="no run.json"):
        reporting.summary_table([], [_eval_record("grpo_s0_G4", 0.1)])


def test_summary_refuses_duplicate_runs():
    record = _run_record("grpo", 0, "G4", g=4)
    with pytest.raises(ValueError, match="two run records"):
        reporting.summary_table([record, record], [_eval_record(record["run"], 0.1)])


# --------------------------------------------------------------------------- across seeds


def test_by_method_means_and_intervals_over_seeds_and_prompts(tables):
    by_method = tables["by_method"]
    assert list(by_method[["method", "setting"]].itertuples(index=False, name=None)) == [
        ("base", "base model"),
        ("cgrpo", CGRPO_SETTING),
        ("grpo", "G=12 (compute-matched)"),
        ("grpo", "G=32"),
        ("grpo", "G=4"),
    ]
    row = by_method.set_index("setting").loc[CGRPO_SETTING]
    assert row["seeds"] == 3
    assert row["greedy accuracy"] == pytest.approx(np.mean(ACCURACY["cgrpo"]))
    low, high = row["greedy accuracy 95% CI low"], row["greedy accuracy 95% CI high"]
    # The prompts' noise dominates: 100 prompts at about 0.42 give a standard error near 0.05, far more than the
    # seeds' spread (0.40-0.45).
    assert low < row["greedy accuracy"] < high and 0.12 < high - low < 0.3
    assert row["rollouts per training prompt (incl. calibration)"] == pytest.approx(np.mean(ROLLOUTS["cgrpo"]))
    # A cost has no prompts: Student's t over the seeds, which reaches past three seeds' range (a bootstrap would not).
    rollouts = "rollouts per training prompt (incl. calibration)"
    half = stats.t.ppf(0.975, 2) * np.std(ROLLOUTS["cgrpo"], ddof=1) / math.sqrt(3)
    assert row[f"{rollouts} 95% CI low"] == pytest.approx(np.mean(ROLLOUTS["cgrpo"]) - half)
    assert row[f"{rollouts} 95% CI high"] == pytest.approx(np.mean(ROLLOUTS["cgrpo"]) + half)
    assert (
        row[f"{rollouts} 95% CI low"] < min(ROLLOUTS["cgrpo"]) < max(ROLLOUTS["cgrpo"]) < row[f"{rollouts} 95% CI high"]
    )
    assert row["time savings incl. calibration"] == pytest.approx(
        np.mean([1 - (104.0 + 3 * c + seed) / (100.0 + 96 + seed) for seed, c in enumerate(ROLLOUTS["cgrpo"])])
    )
    base = by_method.set_index("setting").loc["base model"]
    assert base["greedy accuracy"] == pytest.approx(0.30)
    # The base model is one run, and still gets an interval, from its prompts.
    assert base["greedy accuracy 95% CI low"] < 0.30 < base["greedy accuracy 95% CI high"]
    assert math.isnan(base["training wall clock (s)"])


def test_intervals_are_reproducible_and_follow_the_statistics_seed(experiment, tables):
    again = reporting.build_tables(**experiment)
    pd.testing.assert_frame_equal(again["by_method"], tables["by_method"])
    # Three seeds get Student's t over their means, which no statistics seed moves.
    other = reporting.build_tables(**experiment, seed=1)["by_method"]
    pd.testing.assert_frame_equal(other.drop(index=0), tables["by_method"].drop(index=0))
    # Six seeds get the bootstrap over seeds and prompts, whose draws the statistics seed sets.
    table = np.random.default_rng(0).random((6, 40))
    first, second = (Resampling({}, 500, seed).interval(table, "x") for seed in (0, 1))
    assert first[0] == second[0] and first[1:] != pytest.approx(second[1:])
    assert Resampling({}, 500, 0).interval(table[:5], "x") == pytest.approx(t_mean_ci(table[:5].mean(axis=1)))


def test_paired_differences_per_baseline(tables):
    paired = tables["paired"].set_index("baseline")
    assert set(paired.index) == {"GRPO G=32", "GRPO G=4", "GRPO G=12 (compute-matched)"}
    assert (paired["C-GRPO setting"] == CGRPO_SETTING).all() and (paired["paired seeds"] == 3).all()
    row = paired.loc["GRPO G=32"]
    assert row["greedy accuracy difference"] == pytest.approx(np.mean(np.subtract(ACCURACY["cgrpo"], ACCURACY["G32"])))
    assert row["greedy accuracy difference 95% CI low"] < row["greedy accuracy difference"]
    assert row["greedy accuracy difference"] < row["greedy accuracy difference 95% CI high"]
    rollouts = paired.loc["GRPO G=4", "rollouts per training prompt difference"]
    assert rollouts == pytest.approx(np.mean(ROLLOUTS["cgrpo"]) - 4)
    assert "training wall clock (s) difference" in paired
    wall = paired.loc["GRPO G=32", "wall clock (s, training + calibration) difference"]
    assert wall == pytest.approx(np.mean([3 * (c - 32) + 4.0 for c in ROLLOUTS["cgrpo"]]))
    cpu = paired.loc["GRPO G=32", "CPU time (s, training + calibration) difference"]
    assert cpu == pytest.approx(np.mean([2 * (c - 32) + 3.0 for c in ROLLOUTS["cgrpo"]]))


def test_paired_intervals_pair_prompts(experiment):
    # The same per-prompt outcomes on both sides, shifted prompt by prompt: paired, every resample differs by the
    # same amount, so the interval has no width; unpaired, it would be as wide as the prompts' spread.
    summary = reporting.summary_table(*(reporting.load_json(experiment[key]) for key in ("runs", "evals")))
    runs = summary[summary["method"] != "base"]
    outcomes = {run: {"eval_greedy_acc": [float(i % 2) for i in range(PROMPTS)]} for run in runs["run"]}
    fixed = runs[runs["setting"] == "G=32"]["run"]
    for run in fixed:
        outcomes[run] = {"eval_greedy_acc": [float(i % 2) - 0.1 for i in range(PROMPTS)]}
    paired = comparison.paired_table(runs, Resampling(outcomes, 500, 0), metrics={"eval_greedy_acc": "greedy"})
    row = paired.set_index("baseline").loc["GRPO G=32"]
    assert row["greedy difference"] == pytest.approx(0.1)
    assert row["greedy difference 95% CI low"] == pytest.approx(0.1) == row["greedy difference 95% CI high"]


def test_over_base_subtracts_the_base_models_accuracy_prompt_by_prompt(tables, experiment):
    over = tables["over_base"].set_index("setting")
    assert set(over["method"]) == {"cgrpo", "grpo"} and (over["seeds"] == 3).all()
    gain = over.loc["G=32", "greedy accuracy gain"]
    assert gain == pytest.approx(np.mean(ACCURACY["G32"]) - 0.30)
    assert (
        over.loc["G=32", "greedy accuracy gain 95% CI low"]
        < gain
        < over.loc["G=32", "greedy accuracy gain 95% CI high"]
    )
    # Paired: every prompt 0.25 above the base's, so the interval has no width.
    summary = reporting.summary_table(*(reporting.load_json(experiment[key]) for key in ("runs", "evals")))
    outcomes = {run: {"eval_mean_at_k": [float(i % 2) + 0.25 for i in range(PROMPTS)]} for run in summary["run"]}
    outcomes["base"] = {"eval_mean_at_k": [float(i % 2) for i in range(PROMPTS)]}
    over = comparison.over_base_table(summary, Resampling(outcomes, 200, 0), {"eval_mean_at_k": "sampled"})
    assert np.allclose(over[["sampled gain", "sampled gain 95% CI low", "sampled gain 95% CI high"]], 0.25)
    assert comparison.over_base_table(summary[summary["method"] != "base"], _resampling(summary)).empty


def test_paired_uses_only_shared_seeds_and_only_its_own_match(tables):
    summary = tables["summary"]
    partial = summary[~((summary["setting"] == "G=4") & (summary["seed"] == 2))]
    other_match = [{"setting": "grid 2-4, delta 0.1, recal 0", "num_generations": 12}]
    paired = comparison.paired_table(partial, _resampling(partial), other_match).set_index("baseline")
    assert paired.loc["GRPO G=4", "paired seeds"] == 2
    assert "GRPO G=12 (compute-matched)" not in paired.index


def test_paired_compares_cgrpo_with_every_dapo_setting(tables):
    summary = tables["summary"]
    grpo32 = summary[summary["setting"] == "G=32"]
    dapo = grpo32.assign(
        method="dapo",
        setting=setting_label({"method": "dapo", "num_generations": 32}),
        run=grpo32["run"].str.replace("grpo", "dapo"),
    )
    both = pd.concat([summary, dapo], ignore_index=True)
    paired = comparison.paired_table(both, _resampling(both)).set_index("baseline")
    row, grpo_row = paired.loc["DAPO G=32, dynamic sampling"], paired.loc["GRPO G=32"]
    assert row["paired seeds"] == 3
    assert row["greedy accuracy difference"] == pytest.approx(grpo_row["greedy accuracy difference"])


def test_paired_without_cgrpo_is_empty(tables):
    summary = tables["summary"]
    assert comparison.paired_table(summary[summary["method"] != "cgrpo"], _resampling(summary)).empty


def _resampling(summary: pd.DataFrame) -> Resampling:
    """Per-prompt outcomes that average to each run's summary accuracies."""
    columns = comparison.PER_PROMPT_COLUMNS
    return Resampling(
        {run: {column: _flags(row[column]) for column in columns} for run, row in summary.set_index("run").iterrows()},
        500,
        0,
    )


# --------------------------------------------------------------------------- conformal, steps, calibrations


def test_coverage_and_conformal_tables(tables):
    coverage = tables["coverage"]
    assert len(coverage) == (1 + 4 * len(SEEDS)) * 3 * len(GRID)
    assert set(coverage["delta_mode"]) == {"auto", "0.1", "0.2"}
    assert {
        "run",
        "method",
        "setting",
        "seed",
        "k",
        "coverage",
        "nominal",
        "band_low",
        "band_high",
        "ci_low",
        "ci_high",
        "n_eval",
    } <= set(coverage.columns)
    conformal = tables["conformal"]
    assert len(conformal) == (1 + 4 * len(SEEDS)) * 2
    assert conformal["budget histogram"].iloc[0] == "2:50, 4:40, 8:30, 16:40, 32:40"


def test_steps_fill_fixed_group_for_grpo(tables):
    steps = tables["steps"]
    assert len(steps) == 4 * len(SEEDS) * STEPS
    grpo = steps[steps["setting"] == "G=4"]
    assert (grpo["mean_k"] == 4).all() and (grpo["rollout_savings"] == 0).all()
    cgrpo = steps[steps["method"] == "cgrpo"]
    assert cgrpo["mean_k"].iloc[0] == pytest.approx(20.0) and cgrpo["rollouts_generated"].notna().all()


def test_delta_sweep_orders_settings_by_delta_and_takes_coverage_at_each_runs_delta(tables):
    summary, conformal, calibrations = tables["summary"], tables["conformal"], tables["calibrations"]
    auto_runs = summary.loc[summary["method"] == "cgrpo", "run"]

    def as_fixed(table):
        return table[table["run"].isin(auto_runs)].assign(run=lambda t: t["run"].str.replace("dauto", "d0.1"))

    fixed = as_fixed(summary).assign(
        delta=0.1,
        setting=CGRPO_SETTING.replace("delta auto", "delta 0.1"),
        eval_greedy_acc=lambda t: t["eval_greedy_acc"] + 0.1,
    )
    fixed_conformal = as_fixed(conformal)
    fixed_conformal.loc[fixed_conformal["delta_mode"] == "0.1", "coverage_post_selection"] = 0.9
    both = pd.concat([summary, fixed])
    sweep = reporting.delta_sweep_table(
        both,
        pd.concat([conformal, fixed_conformal]),
        pd.concat([calibrations, as_fixed(calibrations).assign(delta=0.1)]),
        _resampling(both),
    )
    assert sweep["delta_mode"].tolist() == ["0.1", "auto"]
    # auto: the mean of the deltas its calibrations chose (0.3, 0.25, 0.2 at steps 0, 5, 10).
    assert sweep["delta"].tolist() == pytest.approx([0.1, 0.25])
    assert sweep["nominal coverage"].tolist() == pytest.approx([0.9, 0.75])
    assert sweep["eval coverage at the run's delta"].tolist() == pytest.approx([0.9, 0.8])
    # Per-prompt outcomes hold whole hundredths, as the accuracies do.
    assert sweep["greedy accuracy"].tolist() == pytest.approx(
        [np.mean(ACCURACY["cgrpo"]) + 0.1, np.mean(ACCURACY["cgrpo"])], abs=0.005
    )
    low, high = sweep["greedy accuracy 95% CI low"], sweep["greedy accuracy 95% CI high"]
    assert (low < sweep["greedy accuracy"]).all() and (sweep["greedy accuracy"] < high).all()
    assert sweep["seeds"].tolist() == [3, 3]


def test_calibrations_long_table(tables):
    calibrations = tables["calibrations"]
    assert len(calibrations) == len(SEEDS) * 3 * len(GRID)
    assert set(calibrations["step"]) == {0, 5, 10} and set(calibrations["k"]) == set(GRID)
    assert (calibrations["setting"] == CGRPO_SETTING).all()


def test_build_tables_refuses_steps_without_run(experiment, tmp_path):
    stray = tmp_path / "stray" / "steps.csv"
    stray.parent.mkdir()
    stray.write_text("step,reward\n1,0.1\n")
    with pytest.raises(ValueError, match="no run.json"):
        reporting.build_tables(experiment["runs"], [*experiment["steps"], str(stray)], experiment["evals"])


# --------------------------------------------------------------------------- compute matching


def test_match_group_size_matches_the_total_rollouts_on_the_same_prompts(experiment):
    runs = [path for path in experiment["runs"] if "/cgrpo_" in path]
    matched = match_group_size(runs)
    records = reporting.load_json(runs)
    target = np.mean([r["train_rollouts_generated"] + r["calibration_rollouts_generated"] for r in records])
    prompts = records[0]["groups"]
    assert matched["total_rollouts_generated"] == pytest.approx(target) and matched["prompts"] == prompts
    # Calibration included: more than the training rollouts per prompt alone.
    assert matched["num_generations"] == round(target / prompts)
    assert matched["num_generations"] > np.mean(ROLLOUTS["cgrpo"]) - 1
    assert abs(matched["relative_gap"]) <= 0.1
    assert matched["matched_rollouts"] == matched["num_generations"] * prompts
    assert matched["setting"] == CGRPO_SETTING and len(matched["runs"]) == 3


def test_match_group_size_needs_one_cgrpo_setting_of_equal_prompts(experiment, tmp_path):
    with pytest.raises(ValueError, match="one setting"):
        match_group_size(experiment["runs"][:2])
    with pytest.raises(ValueError, match="No run.json"):
        match_group_size([])
    records = reporting.load_json([path for path in experiment["runs"] if "/cgrpo_" in path])
    records[0]["groups"] += 1
    paths = [_write_json(tmp_path / f"{i}.json", record) for i, record in enumerate(records)]
    with pytest.raises(ValueError, match="different numbers of prompts"):
        match_group_size(paths)


# --------------------------------------------------------------------------- output


def test_markdown_merges_intervals_and_hides_missing(tables):
    text = reporting.markdown(tables["by_method"])
    lines = text.splitlines()
    assert lines[0].startswith("| method") and set(lines[1]) <= set("|:-")
    assert "greedy accuracy [95% CI]" in lines[0] and "95% CI low" not in text
    row = tables["by_method"].set_index("setting").loc[CGRPO_SETTING]
    mean, low, high = (row[f"greedy accuracy{end}"] for end in ("", " 95% CI low", " 95% CI high"))
    assert f"{mean:.4g} [{low:.4g}, {high:.4g}]" in text
    assert "nan" not in text.lower()


def test_write_table(tables, tmp_path):
    reporting.write_table(tables["summary"], tmp_path / "t" / "summary.csv", tmp_path / "t" / "summary.md")
    back = pd.read_csv(tmp_path / "t" / "summary.csv")
    assert back["run"].tolist() == tables["summary"]["run"].tolist()
    assert (tmp_path / "t" / "summary.md").read_text().startswith("| run")
    reporting.write_table(tables["steps"], tmp_path / "steps.csv")
    assert not (tmp_path / "steps.md").exists()


def test_setting_label_and_delta():
    assert reporting.format_delta("auto") == "auto" and reporting.format_delta(0.10) == "0.1"
    assert setting_label({"method": "grpo", "num_generations": 4}) == "G=4"
    assert setting_label({"method": "dapo", "num_generations": 32}) == "G=32, dynamic sampling"
    cgrpo = {"method": "cgrpo", "budget_grid": "2-4-8", "delta": "auto", "recalibrate_every": 50}
    assert setting_label(cgrpo) == "grid 2-4-8, delta auto, recal 50"
    # Runs recorded before the option existed have no drop_unanimous key.
    assert setting_label({**cgrpo, "drop_unanimous": False}) == "grid 2-4-8, delta auto, recal 50"
    dropping = setting_label({**cgrpo, "drop_unanimous": True})
    assert dropping == "grid 2-4-8, delta auto, recal 50, drop unanimous"
    with pytest.raises(ValueError, match="Unknown method"):
        setting_label({"method": "ppo", "run": "x"})


# --------------------------------------------------------------------------- plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("function", "table", "others"),
    [
        (plots.plot_pareto, "summary", ("by_method",)),
        (plots.plot_training_curves, "steps", ()),
        (plots.plot_thresholds, "calibrations", ()),
        (plots.plot_coverage, "coverage", ()),
        (plots.plot_delta_sweep, "delta_sweep", ()),
        (plots.plot_frontier, "frontier", ("summary",)),
    ],
)
def test_plots_write_png(tables, tmp_path, function, table, others):
    path = tmp_path / "figures" / f"{table}.png"
    function(tables[table], *(tables[other] for other in others), path)
    assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000
    empty = tmp_path / "empty.png"
    function(tables[table].iloc[0:0], *(tables[other] for other in others), empty)
    assert empty.read_bytes()[:8] == PNG_MAGIC


def test_plot_all_from_csv_round_trip(tables, tmp_path):
    names = ("summary", "by_method", "steps", "calibrations", "coverage", "delta_sweep", "frontier")
    for name in names:
        reporting.write_table(tables[name], tmp_path / f"{name}.csv")
    loaded = {name: pd.read_csv(tmp_path / f"{name}.csv") for name in names}
    paths = {
        name: tmp_path / f"{name}.png"
        for name in ("pareto", "training_curves", "thresholds", "coverage", "delta_sweep", "frontier")
    }
    plots.plot_all(loaded, paths)
    assert all(path.stat().st_size > 10_000 for path in paths.values())
