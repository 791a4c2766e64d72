"""The committed reference tables come from the configs the docs say produced them.

`results/reference/` holds the default experiment's tables, and its subfolders those of shipped overrides; a config
edit that is not followed by a new reference run would leave the README quoting tables of another experiment.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
import yaml
from snakemake.utils import update_config, validate

from cgrpo.budget_schedule import budget_lr_factor
from cgrpo.pipeline.configuration.methods import METHODS

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "results" / "reference"


def merged_config(*configs: str) -> dict:
    """config.yaml with `configs` (paths under config/) merged over it in order, as `--configfile` merges them."""
    config = copy.deepcopy(yaml.safe_load((REPO / "config" / "config.yaml").read_text()))
    for name in configs:
        update_config(config, yaml.safe_load((REPO / "config" / name).read_text()))
    return config


@pytest.mark.parametrize(
    ("folder", "configs"),
    [
        ("", ()),
        ("long", ("overrides/long.yaml",)),
        ("with_dapo", ("overrides/long.yaml", "overrides/with_dapo.yaml")),
        ("one_step_generation", ("overrides/long.yaml", "overrides/one_step_generation.yaml")),
        ("smollm2_cpu", ("smollm2_cpu.yaml",)),
        ("frontier", ("frontier.yaml",)),
    ],
    ids=["default", "long", "with_dapo", "one_step_generation", "smollm2_cpu", "frontier"],
)
def test_reference_tables_match_their_config(folder, configs):
    config = merged_config(*configs)
    summary = pd.read_csv(REFERENCE / folder / "summary.csv")
    runs = summary[summary["method"] != "base"]
    training = config["training"]
    assert set(runs["steps"]) == {training["max_steps"]}
    assert set(runs["steps_per_generation"]) == {training["steps_per_generation"]}
    assert set(runs["seed"]) == set(config["seeds"])
    cgrpo = runs[runs["method"] == "cgrpo"]
    assert set(cgrpo["recalibrate_every"]) == set(config["cgrpo"]["recalibrate_every"])
    expected_methods = {"cgrpo", "grpo"} | set(config["cgrpo"]["ablations"]["rules"])
    if config["dapo"]["num_generations"]:
        expected_methods.add("dapo")
    assert set(runs["method"]) == expected_methods
    # Groups per run: the training prompts, max_steps x per-step batch / G, which the eval split does not change.
    prompts_per_step = training["per_device_train_batch_size"] // max(config["cgrpo"]["budget_grids"][0])
    assert set(runs["groups"]) == {training["max_steps"] * prompts_per_step}


def test_the_training_frontier_has_its_seeds_settings_and_a_calibration_per_seed():
    config = merged_config("frontier.yaml")
    folder = REFERENCE / "frontier"
    summary = pd.read_csv(folder / "summary.csv")
    runs = summary[summary["method"] != "base"]
    assert len(config["seeds"]) >= 5 and config["cgrpo"]["calibrate_per_seed"]
    assert runs.groupby(["method", "setting"])["seed"].nunique().min() == len(config["seeds"])
    assert runs[runs["method"] == "cgrpo"]["setting"].nunique() >= 3
    assert set(runs[runs["method"] == "grpo"]["num_generations"]) == set(config["grpo"]["num_generations"])
    assert len(config["grpo"]["num_generations"]) >= 3
    # Each seed's calibration draws its own samples, so the initial thresholds differ between seeds.
    calibrations = pd.read_csv(folder / "calibrations.csv")
    initial = calibrations[(calibrations["step"] == 0) & calibrations["run"].str.contains("_dauto_")]
    per_seed = initial.pivot_table(index="seed", columns="k", values="qhat")
    assert len(per_seed) == len(config["seeds"]) and per_seed.drop_duplicates().shape[0] > 1
    frontier = pd.read_csv(folder / "frontier_at_cgrpo.csv")
    assert set(frontier["seeds"]) == {len(config["seeds"])}


def _differences(expected, recorded, path: str = "") -> list[str]:
    """Keys of `expected` whose value `recorded` does not hold; `recorded` may add the schema's defaults."""
    if isinstance(expected, dict) and isinstance(recorded, dict):
        return [
            difference
            for key in expected
            for difference in _differences(expected[key], recorded.get(key, "<missing>"), f"{path}.{key}")
        ]
    return [] if expected == recorded else [f"{path}: config {expected!r}, reference run {recorded!r}"]


@pytest.mark.parametrize(("folder", "configs"), [("smollm2_cpu", ("smollm2_cpu.yaml",))], ids=["smollm2_cpu"])
def test_a_reference_run_recorded_with_its_resolved_config_ran_the_configs_settings(folder, configs):
    # The run's own record of its config (results/<experiment>/config.yaml): prompts, sizes and options alike. Keys the
    # schema gained since take their defaults, as the workflow reads a recorded config (workflow/rules/common.smk).
    recorded = yaml.safe_load((REFERENCE / folder / "config.yaml").read_text())
    validate(recorded, schema=str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    assert _differences(merged_config(*configs), recorded) == []


def test_the_8_seed_smollm2_config_brackets_c_grpos_training_rollouts_with_fixed_groups():
    # config/smollm2_power.yaml is sized from the 2-seed run's tables: its fixed groups must lie on both sides of what
    # C-GRPO drew there per training prompt (its calibration excluded, issue #55), for frontier_at_cgrpo to compare at
    # equal training rollouts.
    config = merged_config("smollm2_power.yaml")
    summary = pd.read_csv(REFERENCE / "smollm2_cpu" / "summary.csv")
    drawn = summary.loc[summary["method"] == "cgrpo", "train_mean_k"]
    sizes = config["grpo"]["num_generations"]
    assert any(size < drawn.min() for size in sizes) and any(drawn.max() < size < 2 * drawn.max() for size in sizes)
    assert len(config["seeds"]) >= 8 and config["splits"]["sizes"]["eval"] >= 96
    assert config["cgrpo"]["calibrate_per_seed"] and config["splits"]["dedupe"] == "computation"
    assert config["cgrpo"]["ablations"]["rules"] == ["esc"]


@pytest.mark.parametrize(
    ("folder", "configs"),
    [("budget", ("budget.yaml",)), ("budget_default_mix", ("budget.yaml", "overrides/budget_default_mix.yaml"))],
    ids=["binding_mix", "default_mix"],
)
def test_budget_reference_tables_match_their_config(folder, configs):
    config = merged_config(*configs)
    budget = config["budget"]
    curve = pd.read_csv(REFERENCE / folder / "learning_curve.csv")
    # Every run sampled at the start and at each of its milestones, on the eval split's prompts, to the budget.
    assert set(curve["seed"]) == set(config["seeds"]) and len(config["seeds"]) >= 8
    assert set(curve.groupby("run")["milestone"].nunique()) == {budget["milestones"] + 1}
    assert curve.groupby("run")["rollouts"].max().min() >= budget["rollouts"]
    assert set(curve[curve["method"] == "grpo"]["setting"]) == {f"G={g}" for g in config["grpo"]["num_generations"]}
    assert set(curve["method"]) == {"cgrpo", "grpo", *config["cgrpo"]["ablations"]["rules"]}
    comparison = pd.read_csv(REFERENCE / folder / "budget_comparison.csv")
    assert set(comparison["prompts"]) == {config["splits"]["sizes"]["eval"]}
    assert set(comparison["budget"]) == {budget["rollouts"]}
    # A calibration per seed, from its own sample of the calibration prompts.
    calibrations = pd.read_csv(REFERENCE / folder / "budget_calibrations.csv")
    per_seed = calibrations.drop_duplicates("seed")
    assert per_seed["prompt_set"].nunique() == per_seed["qhat"].nunique() == len(config["seeds"])


@pytest.mark.parametrize(
    ("folder", "configs"),
    [("budget", ("budget.yaml",)), ("budget_default_mix", ("budget.yaml", "overrides/budget_default_mix.yaml"))],
    ids=["binding_mix", "default_mix"],
)
def test_every_budget_run_follows_one_learning_rate_schedule_by_budget_share(folder, configs):
    budget = merged_config(*configs)["budget"]
    recorded = pd.read_csv(REFERENCE / folder / "learning_curve.csv")
    # The start's share is undefined (no update yet); every run has its milestones after it.
    curve = recorded.dropna(subset=["learning_rate_share"])
    assert curve["run"].nunique() == recorded["run"].nunique()
    # At every milestone a run's share of its peak rate is the schedule's at the share of the budget it has spent,
    # whether its steps drew 2 or 32 rollouts a prompt: one generation batch's rollouts at most apart (TRL generates
    # once per generation batch).
    expected = (curve["rollouts"] / budget["rollouts"]).map(
        lambda share: budget_lr_factor(share, **budget["lr_schedule"])
    )
    assert (curve["learning_rate_share"] - expected).abs().max() <= 0.05
    # At the budget (each run's point at or past it) every run trains at the same share of its peak.
    at_budget = curve[curve["rollouts"] >= budget["rollouts"]].groupby("run")["learning_rate_share"].first()
    assert len(at_budget) == curve["run"].nunique() and at_budget.max() - at_budget.min() <= 0.05
    # Midway the rate has not reached its end value: the column holds the schedule, not a constant.
    assert curve.loc[curve["milestone"] == curve["milestone"].max() / 2, "learning_rate_share"].min() > 0.3


@pytest.mark.parametrize(
    ("folder", "configs", "sweep_configs"),
    [
        ("budget_lr_sweep", ("budget.yaml",), ("overrides/lr_sweep.yaml",)),
        (
            "budget_default_mix_lr_sweep",
            ("budget.yaml", "overrides/budget_default_mix.yaml"),
            ("overrides/lr_sweep.yaml", "overrides/lr_sweep_default_mix.yaml"),
        ),
        (
            "budget_allocators_lr_sweep",
            ("budget.yaml", "overrides/budget_allocators.yaml"),
            ("overrides/lr_sweep.yaml", "overrides/lr_sweep_allocators.yaml"),
        ),
    ],
    ids=["binding", "default_mix", "allocators"],
)
def test_a_budget_configs_learning_rates_are_its_sweeps_choice_on_validation_prompts(folder, configs, sweep_configs):
    """A budget config's learning_rates.by_method are the rates its committed sweep chose (results/reference/<folder>,
    run with `--configfile` the config's files then the sweep's overrides)."""
    config = merged_config(*configs)
    sweep_config = merged_config(*configs, *sweep_configs)
    assert sweep_config["experiment"] == folder
    sweep = pd.read_csv(REFERENCE / folder / "lr_sweep.csv")
    # At least three rates for at least four methods, on seeds of their own, sampled on the validation prompts.
    rates = sweep.groupby("method")["learning rate multiple"].nunique()
    assert (rates >= 3).sum() >= 4 and len(sweep_config["seeds"]) >= 3
    chosen = sweep[sweep["chosen"]].drop_duplicates("method").set_index("method")["learning rate"]
    # Configs merge deeply, so a config over config/budget.yaml also holds rates for methods it does not run; every
    # method it runs takes its sweep's choice.
    ran = [name for name, method in METHODS.items() if method.runs(config)]
    by_method = config["learning_rates"]["by_method"]
    assert chosen.to_dict() == pytest.approx({name: by_method.get(name) for name in ran})
