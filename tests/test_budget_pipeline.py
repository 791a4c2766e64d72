"""The budgeted experiment: specs, run names, and the learning-curve statistics checked by hand."""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
import yaml
from snakemake.utils import validate

from cgrpo.pipeline.analysis.curves import budget_calibrations_table, budget_tables, curve_points
from cgrpo.pipeline.analysis.mechanisms import mechanism_table
from cgrpo.pipeline.configuration import methods, run_specs, specs

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def _config(path: str = "config/config.yaml", **sections) -> dict:
    config = yaml.safe_load((REPO / path).read_text())
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    validate(config, str(SCHEMA))
    return config


def test_the_default_specs_hold_none_of_the_budget_options():
    # New spec fields are left out at their defaults, so that the specs and cached results of existing folders stay.
    config = _config()
    for run in methods.static_runs(config):
        spec = run_specs.train_spec(config, run, "model", "splits", "calibration").to_dict()
        assert not {"budget", "calibration_prompt_seed"} & set(spec), run
        assert "group_weighting" not in (spec.get("cgrpo") or {}), run
    calibration = specs.calibration_spec(config, "2-4-8-16-32", 0, "model", "splits").to_dict()
    assert "prompt_seed" not in calibration
    assert specs.CalibrationSpec.from_dict(calibration).prompt_seed is None


def test_a_budget_gives_every_run_its_milestones_and_steps_enough_to_spend_it():
    config = _config(budget={"rollouts": 6000, "milestones": 6})
    grpo = run_specs.train_spec(config, "grpo_s1_G32", "model", "splits")
    assert grpo.budget == {
        "rollouts": 6000,
        "include_calibration": True,
        "milestones": [1000, 2000, 3000, 4000, 5000, 6000],
        # transformers' default decay, over the budget's share instead of the steps.
        "lr_schedule": {"shape": "linear", "warmup_share": 0.0, "end_factor": 0.0},
    }
    # Two prompts a step of 32 rollouts each: 94 steps spend 6,016; one generation batch (8 steps) more.
    assert grpo.trainer["max_steps"] == 94 + 8
    cgrpo = run_specs.train_spec(config, "cgrpo_s1_g2-4-8-16-32_dauto_r0", "model", "splits", "calibration")
    # C-GRPO's prompts may stop at 2 rollouts each.
    assert cgrpo.trainer["max_steps"] == 1500 + 8


def test_equal_group_weights_are_a_setting_of_their_own_runs():
    config = _config(cgrpo={"group_weightings": ["tokens", "equal"], "ablations": {"rules": ["signal"]}})
    runs = methods.static_runs(config)
    assert "cgrpo_s0_g2-4-8-16-32_dauto_r0_weq" in runs and "cgrpo_s0_g2-4-8-16-32_dauto_r0" in runs
    assert "signal_s2_g2-4-8-16-32_t0.2_weq" in runs
    name = methods.parse_run_name("signal_s2_g2-4-8-16-32_t0.1_weq")
    assert (name.method, name.seed, name.stop_setting, name.group_weighting) == ("signal", 2, 0.1, "equal")
    spec = run_specs.train_spec(config, "cgrpo_s0_g2-4-8-16-32_dauto_r0_weq", "model", "splits", "calibration")
    assert spec.cgrpo["group_weighting"] == "equal"
    record = {"method": "cgrpo", "budget_grid": "2-4-8", "delta": "auto", "recalibrate_every": 0}
    assert methods.setting_label({**record, "group_weighting": "equal"}).endswith(", equal group weights")


def test_resampled_calibration_prompts_are_drawn_with_each_seed():
    config = _config(cgrpo={"calibrate_per_seed": True, "resample_calibration_prompts": True})
    assert specs.calibration_spec(config, "2-4-8-16-32", 3, "model", "splits").prompt_seed == 3
    spec = run_specs.train_spec(config, "cgrpo_s3_g2-4-8-16-32_dauto_r0", "model", "splits", "calibration")
    assert spec.calibration_prompt_seed == 3


def _point(rollouts, per_prompt, cpu_s, milestone):
    return {"milestone": milestone, "step": 0, "rollouts": rollouts, "train_rollouts": rollouts, "cpu_s": cpu_s}


def _records():
    """GRPO (G=4, the only fixed G) and C-GRPO, two identical seeds each, two eval prompts, a budget of 100."""
    base = {"run": "base", "points": [{**_point(0, None, 0.0, 0), "wall_s": 0.0, "per_prompt": [0.0, 0.5]}]}
    budget = {"rollouts": 100, "include_calibration": True, "milestones": [50, 100]}
    runs, curves = [], [base]
    for seed in (0, 1):
        grpo = {"run": f"grpo_s{seed}_G4", "method": "grpo", "seed": seed, "num_generations": 4, "budget": budget}
        cgrpo = {
            "run": f"cgrpo_s{seed}_g2-4_dauto_r0",
            "method": "cgrpo",
            "seed": seed,
            "budget_grid": "2-4",
            "delta": "auto",
            "recalibrate_every": 0,
            "budget": budget,
            "calibrations": [{"step": 0, "initial": True, "rollouts": 25, "cpu_s": 2.0, "wall_s": 3.0, "delta": 0.3}],
        }
        runs += [grpo, cgrpo]
        curves.append({"run": grpo["run"], "points": [_with(50, [0.5, 0.5], 5.0), _with(100, [1.0, 0.5], 10.0)]})
        # The trainer counts the initial calibration's 25 rollouts; its seconds were spent in the calibrate job.
        curves.append({"run": cgrpo["run"], "points": [_with(50, [0.5, 1.0], 3.0), _with(100, [1.0, 1.0], 8.0)]})
    return runs, curves


def _with(rollouts, per_prompt, cpu_s):
    return {**_point(rollouts, per_prompt, cpu_s, rollouts), "wall_s": cpu_s, "per_prompt": per_prompt}


def test_a_run_starts_after_its_initial_calibration_with_the_base_model_accuracy():
    runs, curves = _records()
    points = curve_points(curves[2], runs[1], curves[0])
    assert [(p["rollouts"], p["cpu_s"], p["per_prompt"]) for p in points] == [
        (25, 2.0, [0.0, 0.5]),
        (50, 5.0, [0.5, 1.0]),
        (100, 10.0, [1.0, 1.0]),
    ]


def test_the_budget_comparison_by_hand():
    runs, curves = _records()
    tables = budget_tables(runs, curves, target_share=0.9, resamples=200, seed=0)
    rows = tables["budget_comparison"].set_index("method")
    # Mean curves: GRPO 0.25 -> 0.5 at 50 -> 0.75 at 100; C-GRPO 0.25 until 25 -> 0.75 at 50 -> 1.0 at 100.
    assert rows.loc["grpo", "best fixed G"] == "G=4"
    assert rows.loc["cgrpo", "target accuracy"] == pytest.approx(0.25 + 0.9 * 0.5)
    assert rows.loc["cgrpo", "accuracy at budget"] == pytest.approx(1.0)
    assert rows.loc["cgrpo", "accuracy at budget minus best fixed G"] == pytest.approx(0.25)
    assert rows.loc["grpo", "mean accuracy over the budget (AUC)"] == pytest.approx(0.5)
    assert rows.loc["cgrpo", "AUC minus best fixed G"] == pytest.approx(0.125)
    # The target 0.7 is reached at 90 rollouts by GRPO and at 25 + 0.9 x 25 = 47.5 by C-GRPO.
    assert rows.loc["grpo", "rollouts to target"] == pytest.approx(90.0)
    assert rows.loc["cgrpo", "rollouts to target"] == pytest.approx(47.5)
    assert rows.loc["cgrpo", "speed-up to target over best fixed G"] == pytest.approx(90 / 47.5)
    # CPU seconds at those rollouts: GRPO 9 s; C-GRPO 2 s of calibration plus 3 x 22.5 / 25 s of training.
    assert rows.loc["cgrpo", "CPU seconds to target"] == pytest.approx(4.7)
    assert rows.loc["cgrpo", "CPU speed-up to target over best fixed G"] == pytest.approx(9 / 4.7)
    low, high = rows.loc[
        "cgrpo", ["speed-up to target over best fixed G 95% CI low", "speed-up to target over best fixed G 95% CI high"]
    ]
    assert low <= 90 / 47.5 <= high
    curve = tables["budget_curve"].set_index(["method", "rollouts"])
    assert curve.loc[("cgrpo", 25.0), "difference to best fixed G"] == pytest.approx(0.25 - 0.375)
    assert len(tables["learning_curve"]) == 4 * 3


def test_a_method_that_never_reaches_the_target_has_an_infinite_time_to_it():
    runs, curves = _records()
    for curve in curves[2::2]:
        curve["points"] = [_with(50, [0.0, 0.5], 3.0), _with(100, [0.0, 0.5], 8.0)]
    rows = budget_tables(runs, curves, target_share=0.9, resamples=50)["budget_comparison"].set_index("method")
    assert rows.loc["cgrpo", "rollouts to target"] == float("inf")
    assert rows.loc["cgrpo", "speed-up to target over best fixed G"] == 0.0


def test_no_target_where_the_best_fixed_g_gains_nothing_over_the_base_model():
    # Every curve starts at the base model's accuracy: a target at or below it would be reached at 0 rollouts.
    runs, curves = _records()
    for curve in curves[1:]:
        curve["points"] = [_with(50, [0.0, 0.5], 3.0), _with(100, [0.0, 0.5], 8.0)]
    rows = budget_tables(runs, curves, target_share=0.9, resamples=50)["budget_comparison"].set_index("method")
    for column in (
        "target accuracy",
        "rollouts to target",
        "CPU seconds to target",
        "CPU speed-up to target over best fixed G",
    ):
        assert rows[column].isna().all(), column
    assert rows.loc["cgrpo", "accuracy at budget minus best fixed G"] == pytest.approx(0.0)


def test_the_calibrations_table_shows_each_calibration_prompt_set():
    runs, _ = _records()
    runs[1]["calibrations"][0]["prompt_set"] = "abc"
    table = budget_calibrations_table(copy.deepcopy(runs))
    assert table["prompt_set"].iloc[0] == "abc" and table["prompt_set"].isna().iloc[1]
    assert list(table["delta"]) == [0.3, 0.3]


def test_runs_of_different_learning_rate_schedules_are_not_compared():
    runs, curves = _records()
    runs[0] = {**runs[0], "budget": {**runs[0]["budget"], "lr_schedule": {"shape": "cosine"}}}
    with pytest.raises(ValueError, match="2 learning-rate schedules .* under one budget.lr_schedule"):
        budget_tables(runs, curves, target_share=0.9, resamples=50)


def _with_validation(runs, curves, validation: dict[str, list[float]], extra_grpo: bool = True):
    """`_records` with a second fixed G (G=8, GRPO's curve less 0.1 on the eval prompts) and each run's validation
    accuracy per prompt at the budget, by method and setting."""
    runs, curves = copy.deepcopy(runs), copy.deepcopy(curves)
    if extra_grpo:
        for seed in (0, 1):
            record = {**runs[0], "run": f"grpo_s{seed}_G8", "seed": seed, "num_generations": 8}
            runs.append(record)
            points = [_with(50, [0.4, 0.4], 5.0), _with(100, [0.9, 0.4], 10.0)]
            curves.append({"run": record["run"], "points": points})
    names = {record["run"]: methods.setting_label(record) for record in runs}
    for curve in curves[1:]:
        curve["points"][-1]["validation_per_prompt"] = validation[names[curve["run"]]]
    return runs, curves


def test_the_best_fixed_g_is_chosen_on_the_validation_prompts():
    runs, curves = _records()
    # G = 4 is better on the eval prompts, G = 8 on the validation prompts: the validation prompts choose.
    validation = {"G=4": [0.2, 0.2, 0.2], "G=8": [0.6, 0.6, 0.6], "grid 2-4, delta auto, recal 0": [0.5, 0.5, 0.5]}
    runs, curves = _with_validation(runs, curves, validation)
    rows = budget_tables(runs, curves, target_share=0.9, resamples=50)["budget_comparison"].set_index("setting")
    assert rows["best fixed G"].eq("G=8").all() and rows["best fixed G chosen on"].eq("validation prompts").all()
    # Against G = 8 at the budget on the eval prompts: 1.0 - 0.65.
    assert rows.loc["grid 2-4, delta auto, recal 0", "accuracy at budget minus best fixed G"] == pytest.approx(0.35)


def test_without_validation_prompts_the_eval_prompts_choose_and_say_so():
    runs, curves = _records()
    rows = budget_tables(runs, curves, target_share=0.9, resamples=50)["budget_comparison"]
    assert rows["best fixed G chosen on"].eq("eval prompts").all()


def test_calibration_excluded_compares_at_the_rollouts_a_method_trained_on():
    runs, curves = _records()
    for curve in curves[2::2]:
        # C-GRPO's trainer counted the 25 calibration rollouts: it trained on 25 and 75 of its 50 and 100.
        for point in curve["points"]:
            point["train_rollouts"] = point["rollouts"] - 25
    rows = budget_tables(runs, curves, target_share=0.9, resamples=200)["budget_comparison"].set_index("method")
    assert rows.loc["cgrpo", "training rollouts at budget"] == pytest.approx(75.0)
    # GRPO's mean curve at 75 rollouts: halfway between 0.5 (50) and 0.75 (100).
    excluded = "accuracy at budget minus best fixed G at equal training rollouts"
    assert rows.loc["cgrpo", excluded] == pytest.approx(1.0 - 0.625)
    assert rows.loc["cgrpo", "accuracy at budget minus best fixed G"] == pytest.approx(0.25)
    # Beside every interval, the difference detectable with 80% power: 1.43 half-widths.
    for name in ("accuracy at budget minus best fixed G", excluded):
        low, high = rows.loc["cgrpo", [f"{name} 95% CI low", f"{name} 95% CI high"]]
        assert rows.loc["cgrpo", f"{name} detectable at 80% power"] == pytest.approx((high - low) / 2 * 1.4286, 1e-3)


def test_the_learning_rate_sweep_marks_each_methods_best_rate_on_validation_prompts():
    config = _config(
        "config/budget.yaml",
        learning_rates={"sweep": [0.5, 1, 2], "by_method": {"esc": 3e-4}},
        splits={"sizes": {"train": 1024, "calibration": 96, "eval": 256, "validation": 64}},
    )
    runs = methods.static_runs(config)
    assert {"grpo_s0_G4", "grpo_s0_G4_lrx0.5", "grpo_s0_G4_lrx2"} <= set(runs)
    name = methods.parse_run_name("esc_s1_g2-4-8-16-32_t4_weq_lrx0.5")
    assert (name.method, name.stop_setting, name.group_weighting, name.lr_factor) == ("esc", 4, "equal", 0.5)
    rates = {
        run: run_specs.train_spec(config, run, "m", "s", "c").trainer["learning_rate"]
        for run in ("grpo_s0_G4_lrx2", "grpo_s0_G4", "esc_s0_g2-4-8-16-32_t4_lrx0.5")
    }
    assert rates == pytest.approx(
        {"grpo_s0_G4_lrx2": 2e-4, "grpo_s0_G4": 1e-4, "esc_s0_g2-4-8-16-32_t4_lrx0.5": 1.5e-4}
    )
    # The sweep's table: each method's multiple with the best mean validation accuracy over its settings.
    records, curves = _records()
    swept = []
    for record in records:
        for factor in (0.5, 1.0):
            swept.append({**record, "learning_rate": 1e-4 * factor, "learning_rate_factor": factor})
            swept[-1]["run"] = record["run"] + methods.lr_suffix(factor)
    curves = [curves[0]] + [
        {**copy.deepcopy(curve), "run": curve["run"] + methods.lr_suffix(factor)}
        for curve in curves[1:]
        for factor in (0.5, 1.0)
    ]
    validation = {
        "G=4, lr x0.5": [0.2, 0.4],
        "G=4": [0.5, 0.5],
        "grid 2-4, delta auto, recal 0, lr x0.5": [0.9, 0.9],
        "grid 2-4, delta auto, recal 0": [0.1, 0.3],
    }
    swept, curves = _with_validation(swept, curves, validation, extra_grpo=False)
    sweep = budget_tables(swept, curves, target_share=0.9, resamples=50)["lr_sweep"]
    chosen = sweep[sweep["chosen"]].set_index("method")["learning rate multiple"]
    assert chosen.to_dict() == {"grpo": 1.0, "cgrpo": 0.5}
    row = sweep[(sweep["method"] == "grpo") & (sweep["learning rate multiple"] == 0.5)].iloc[0]
    assert row["validation accuracy at budget"] == pytest.approx(0.3) and row["learning rate"] == pytest.approx(5e-5)
    assert row["validation accuracy at budget 95% CI low"] <= 0.3 <= row["validation accuracy at budget 95% CI high"]


def test_a_calibrated_rule_calibrates_once_under_a_budget_unless_told_otherwise():
    plain = _config(cgrpo={"ablations": {"rules": ["signal"]}})
    spec = run_specs.train_spec(plain, "signal_s0_g2-4-8-16-32_t0.2", "m", "s").to_dict()
    assert "recalibrate_every" not in spec["cgrpo"]
    budgeted = _config(cgrpo={"ablations": {"rules": ["signal", "esc"]}}, budget={"rollouts": 6000})
    assert run_specs.train_spec(budgeted, "signal_s0_g2-4-8-16-32_t0.2", "m", "s").cgrpo["recalibrate_every"] == 0
    assert "recalibrate_every" not in run_specs.train_spec(budgeted, "esc_s0_g2-4-8-16-32_t4", "m", "s").cgrpo
    every = _config(cgrpo={"ablations": {"rules": ["signal"], "recalibrate_every": 20}}, budget={"rollouts": 6000})
    assert run_specs.train_spec(every, "signal_s0_g2-4-8-16-32_t0.2", "m", "s").cgrpo["recalibrate_every"] == 20


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"learning_rates": {"by_method": {"gpro": 1e-4}}}, "names 'gpro', which is no method .* did you mean 'grpo'"),
        ({"learning_rates": {"sweep": [0.5, 1]}}, "set budget.rollouts and splits.sizes.validation"),
        (
            {"cgrpo": {"ablations": {"rules": ["signal"], "settings": {"signal": [0.05]}}}},
            "delta 0.05, which needs at least 19 informative control prompts, but the signal rule controls on 16",
        ),
    ],
)
def test_learning_rates_and_unattainable_signal_deltas_are_refused_with_one_sentence(sections, message):
    from cgrpo.pipeline.configuration.checks import ConfigError, check_config

    with pytest.raises(ConfigError, match=message):
        check_config(_config(**sections))


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"budget": {"rollouts": 4, "milestones": 6}}, "fewer than budget.milestones"),
        ({"budget": {"rollouts": 6000}, "grpo": {"compute_matched": True}}, "set grpo.compute_matched: false"),
        ({"budget": {"rollouts": 6000}, "grpo": {"num_generations": [], "compute_matched": False}}, "lists none"),
    ],
)
def test_a_budget_that_cannot_compare_is_refused_with_one_sentence(sections, message):
    from cgrpo.pipeline.configuration.checks import ConfigError, check_config

    config = _config(**sections)
    with pytest.raises(ConfigError, match=message):
        check_config(config)


# Long: a whole (tiny) budgeted pipeline takes minutes.
@pytest.mark.slow
@pytest.mark.long
def test_a_budgeted_smoke_pipeline_ends_every_run_at_the_budget_and_compares_the_curves(tmp_path):
    from test_workflow import snakemake

    override = tmp_path / "budget.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                "experiment": "smoke_budget",
                "seeds": [0, 1],
                "grpo": {"num_generations": [2, 4], "compute_matched": False},
                "dapo": {"num_generations": []},
                "cgrpo": {"ablations": {"rules": ["signal"], "settings": {"signal": [0.2]}}},
                "budget": {"rollouts": 96, "milestones": 2, "eval_samples": 2},
            }
        )
    )
    result = snakemake(
        tmp_path, "--cores", "2", "--configfile", str(REPO / "config" / "smoke.yaml"), str(override), timeout=1800
    )
    assert result.returncode == 0, result.stdout[-5000:]
    tables = tmp_path / "results" / "smoke_budget" / "tables"
    curve = pd.read_csv(tables / "learning_curve.csv")
    assert set(curve["method"]) == {"cgrpo", "grpo", "signal"} and set(curve["seed"]) == {0, 1}
    last = curve.sort_values("milestone").groupby("run").tail(1).set_index("run")
    # Every run stops at the first generation batch past the budget: 2 prompts a batch, at most 8 rollouts each, and
    # C-GRPO's refit (recalibrate_every 1 in the smoke config: 8 prompts x 8) may fall in that batch.
    refit = last["method"].eq("cgrpo") * 8 * 8
    assert (last["rollouts"] >= 96).all() and (last["rollouts"] < 96 + 2 * 8 + refit).all()
    # C-GRPO's curve starts after its initial calibration (8 prompts x 8), with the base model's accuracy.
    starts = curve[curve["milestone"] == 0].set_index("run")
    assert (starts.loc[starts["method"] == "cgrpo", "rollouts"] == 64).all()
    assert starts["sampled_accuracy"].nunique() == 1
    comparison = pd.read_csv(tables / "budget_comparison.csv")
    assert comparison["best fixed G"].iloc[0] in {"G=2", "G=4"} and len(comparison) == 4
    calibrations = pd.read_csv(tables / "budget_calibrations.csv")
    assert set(calibrations["method"]) == {"cgrpo", "signal"} and calibrations["prompt_set"].notna().all()
    mechanisms = pd.read_csv(tables / "budget_mechanisms.csv")
    assert {"grpo", "cgrpo", "signal"} <= set(mechanisms["method"])
    assert (mechanisms.loc[mechanisms["seed"] != "mean", "prompts trained per 1,000 rollouts"] > 0).all()
    assert (tmp_path / "results" / "smoke_budget" / "plots" / "learning_curves.png").stat().st_size > 0


def test_the_mechanism_table_by_hand():
    def run(name, method, seed, rollouts, groups, signal, **extra):
        record = {"run": name, "method": method, "seed": seed, "train_rollouts_generated": rollouts, "groups": groups}
        return {**record, "signal_rows_per_rollout": signal, "informative_group_share": 0.5, **extra}

    allocation = {"skipped_prompts": 10, "skipped_redrawn": 4, "skipped_redrawn_informative": 1}
    greso = {"budget_grid": "2-4", "allocation_rollouts_per_prompt": 4.0, "allocator_options": {}}
    runs = [
        run("grpo_s0_G4", "grpo", 0, 400, 100, 0.25, num_generations=4),
        run("greso_s0_g2-4", "greso", 0, 400, 100, 0.5, allocation=allocation, **greso),
        run("greso_s1_g2-4", "greso", 1, 400, 90, 0.7, allocation={**allocation, "skipped_redrawn": 0}, **greso),
    ]
    table = mechanism_table(runs).set_index(["run", "seed"])
    grpo, greso0 = table.loc[("grpo_s0_G4", "0")], table.loc[("greso_s0_g2-4", "0")]
    assert grpo["prompts trained per 1,000 rollouts"] == 250 and grpo["rollouts without signal"] == 0.75
    assert pd.isna(grpo["skip rate"]) and pd.isna(grpo["of them with signal"])
    assert greso0["skip rate"] == pytest.approx(10 / 110) and greso0["of them with signal"] == 0.25
    # Each method's mean follows its runs.
    mean = table.loc[("", "mean")].set_index("method").loc["greso"]
    assert mean["prompts trained"] == 95 and mean["rollouts without signal"] == pytest.approx(0.4)
    assert mean["of them with signal"] == 0.25
