"""Typed run specs and the method registry: run names, spellings and the experiment's policy, built in one place."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cgrpo.allocation import allocator_names
from cgrpo.pipeline.configuration.allocator_methods import allocator_run_name
from cgrpo.pipeline.configuration.methods import (
    METHODS,
    RunName,
    ablation_run_name,
    cgrpo_run_name,
    dapo_run_name,
    grpo_run_name,
    parse_run_name,
    run_pattern,
    static_runs,
)
from cgrpo.pipeline.configuration.run_specs import evaluation_spec, train_spec
from cgrpo.pipeline.configuration.specs import (
    EvaluationSpec,
    TrainSpec,
    calibration_seed,
    calibration_spec,
    format_delta,
    parse_delta,
    pool_samples,
    replay_spec,
)
from cgrpo.stopping import rule_names

CONFIG = yaml.safe_load((Path(__file__).parents[1] / "config" / "config.yaml").read_text())


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        (cgrpo_run_name(3, [2, 4, 8], "auto", 50), RunName("cgrpo", 3, (2, 4, 8), "auto", 50)),
        (cgrpo_run_name(0, [2, 4], 0.1, 0), RunName("cgrpo", 0, (2, 4), 0.1, 0)),
        (grpo_run_name(1, 32), RunName("grpo", 1, num_generations=32)),
        (grpo_run_name(2, 16, matched=True), RunName("grpo", 2, num_generations=16, compute_matched=True)),
        (dapo_run_name(4, 32), RunName("dapo", 4, num_generations=32)),
        (ablation_run_name("unanimous", 2, [2, 4]), RunName("unanimous", 2, (2, 4))),
        (ablation_run_name("share", 0, [2, 4, 8], 0.75), RunName("share", 0, (2, 4, 8), stop_setting=0.75)),
        ("base", RunName("base")),
    ],
)
def test_run_names_are_built_and_parsed_in_one_place(name, parsed):
    assert parse_run_name(name) == parsed


def test_run_name_spelling():
    assert cgrpo_run_name(3, [2, 4, 8], "auto", 50) == "cgrpo_s3_g2-4-8_dauto_r50"
    assert grpo_run_name(2, 16, matched=True) == "grpo_s2_G16_matched"
    assert dapo_run_name(1, 8) == "dapo_s1_G8"
    assert [format_delta(d) for d in ("auto", 0.1, 0.05, 1e-05)] == ["auto", "0.1", "0.05", "1e-05"]
    assert [parse_delta(format_delta(d)) for d in ("auto", 0.1, 1e-05)] == ["auto", 0.1, 1e-05]
    with pytest.raises(ValueError, match="not a run name"):
        parse_run_name("cgrpo_s0_g2-4")


def test_training_specs_carry_the_policy():
    cgrpo = train_spec(CONFIG, "cgrpo_s1_g2-4-8-16-32_d0.2_r80", "model", "splits", "cal.json")
    assert (cgrpo.seed, cgrpo.budget_grid, cgrpo.delta, cgrpo.recalibrate_every) == (1, [2, 4, 8, 16, 32], 0.2, 80)
    assert cgrpo.reference_budget == 32 and cgrpo.initial_calibration == "cal.json"
    assert cgrpo.cgrpo == CONFIG["cgrpo"]["options"]
    assert cgrpo.trainer == {**CONFIG["training"], **CONFIG["cgrpo"]["trainer"]}
    grpo = train_spec(CONFIG, "grpo_s2_G16_matched", "model", "splits")
    # Savings are measured against G = max(first grid), whatever the run's own G.
    assert (grpo.seed, grpo.num_generations, grpo.compute_matched, grpo.reference_budget) == (2, 16, True, 32)
    # Every baseline trains C-GRPO's prompts per step (64 rows of 32-wide groups: 2) at its own G, with the same
    # generation schedule.
    assert grpo.trainer["per_device_train_batch_size"] == 2 * 16
    dapo = train_spec(CONFIG, "dapo_s0_G8", "model", "splits")
    assert dapo.trainer["per_device_train_batch_size"] == 2 * 8
    assert {spec.trainer["steps_per_generation"] for spec in (cgrpo, grpo, dapo)} == {8}
    own = {**CONFIG, "grpo": {**CONFIG["grpo"], "trainer": {"per_device_train_batch_size": 12}}}
    assert train_spec(own, "grpo_s0_G4", "model", "splits").trainer["per_device_train_batch_size"] == 12
    # The ablations: C-GRPO's grid, options and trainer with another stopping rule, and nothing calibrated.
    share = train_spec(CONFIG, "share_s1_g2-4-8-16-32_t0.75", "model", "splits")
    assert (share.method, share.budget_grid, share.reference_budget, share.initial_calibration) == (
        "share",
        [2, 4, 8, 16, 32],
        32,
        None,
    )
    assert share.cgrpo == {
        **CONFIG["cgrpo"]["options"],
        "stopping_rule": "share",
        "stop_share": 0.75,
        "calibration_holdout": 0,
    }
    assert share.trainer == cgrpo.trainer
    # One initial calibration serves every seed, so it uses the split seed, unless each seed draws its own.
    assert calibration_seed(CONFIG, 2) == CONFIG["splits"]["seed"]
    assert calibration_seed({**CONFIG, "cgrpo": {**CONFIG["cgrpo"], "calibrate_per_seed": True}}, 2) == 2
    calibration = calibration_spec(CONFIG, "2-4-8-16-32", 2, "model", "splits")
    assert calibration.seed == 2 and calibration.budget_grid == [2, 4, 8, 16, 32]


def test_the_calibration_spec_holds_no_setting_of_the_optimizer_steps():
    # The calibration samples and never trains: editing the learning rate or the number of steps must not rerun it.
    calibration = calibration_spec(CONFIG, "2-4-8-16-32", 0, "model", "splits")
    assert {"learning_rate", "max_steps"} <= set(CONFIG["training"])
    assert not {"learning_rate", "max_steps", "beta", "loss_type"} & set(calibration.trainer)
    assert calibration.trainer["temperature"] == CONFIG["training"]["temperature"]
    edited = {**CONFIG, "training": {**CONFIG["training"], "learning_rate": 5.0e-5, "max_steps": 7}}
    assert calibration_spec(edited, "2-4-8-16-32", 0, "model", "splits") == calibration


def test_evaluation_specs_sample_as_training_unless_told_otherwise():
    run = evaluation_spec(CONFIG, "grpo_s2_G32", "model", "splits")
    assert run.seed == 2 and run.evaluation["budget_grid"] == CONFIG["cgrpo"]["budget_grids"][0]
    assert run.evaluation["temperature"] == CONFIG["training"]["temperature"]
    assert run.evaluation["max_new_tokens"] == CONFIG["training"]["max_completion_length"]
    assert run.evaluation["delta_margin"] == CONFIG["cgrpo"]["options"]["delta_margin"]
    base = evaluation_spec(CONFIG, "base", "model", "splits")
    assert base.seed == CONFIG["splits"]["seed"]
    told = {**CONFIG, "evaluation": {**CONFIG["evaluation"], "temperature": 0.3}}
    assert evaluation_spec(told, "base", "model", "splits").evaluation["temperature"] == 0.3
    # Evaluation gives up on a hung verifier as training does.
    options = {**CONFIG["cgrpo"]["options"], "verifier_timeout_s": 7.0}
    timed = {**CONFIG, "cgrpo": {**CONFIG["cgrpo"], "options": options}}
    assert evaluation_spec(timed, "base", "model", "splits").evaluation["verifier_timeout_s"] == 7.0


def test_a_replayed_model_draws_the_replay_grids_samples_and_the_rest_stays_as_it_was():
    cgrpo = {**CONFIG["cgrpo"], "budget_grids": [[2, 4, 8]], "deltas": [0.35]}
    replay = {**CONFIG["replay"], "models": ["base"], "budget_grid": [2, 4, 8, 16, 32]}
    config = {**CONFIG, "cgrpo": cgrpo, "replay": replay}
    assert pool_samples(config, "base") == 32 and pool_samples(config, "grpo_s0_G8") == 8
    assert evaluation_spec(config, "base", "model", "splits").evaluation["pool_samples"] == 32
    trained = evaluation_spec(config, "grpo_s0_G8", "model", "splits").evaluation
    assert "pool_samples" not in trained and trained["budget_grid"] == [2, 4, 8]
    spec = replay_spec(config, ["base.json"])
    assert spec["grid"] == [2, 4, 8, 16, 32] and spec["reference"] == 0.35
    # Unset, the specs are what they were, so that cached evaluations are not redone.
    assert "pool_samples" not in evaluation_spec(CONFIG, "base", "model", "splits").evaluation
    spec = replay_spec(CONFIG, ["base.json"])
    assert spec["grid"] == CONFIG["cgrpo"]["budget_grids"][0] and spec["reference"] is None


def test_specs_round_trip_through_plain_dicts_and_refuse_unknown_keys():
    spec = train_spec(CONFIG, "grpo_s0_G32", "model", "splits")
    assert TrainSpec.from_dict(spec.to_dict()) == spec
    evaluation = evaluation_spec(CONFIG, "base", "model", "splits")
    assert EvaluationSpec.from_dict(evaluation.to_dict()) == evaluation
    with pytest.raises(ValueError, match=r"unknown keys \['extra'\] and lacks \['seed'\]"):
        EvaluationSpec.from_dict({**{k: v for k, v in evaluation.to_dict().items() if k != "seed"}, "extra": 1})


def test_the_wildcard_pattern_accepts_exactly_the_run_names():
    import re

    from cgrpo.pipeline.configuration.methods import RUN_NAME_PATTERN

    names = [
        "base",
        cgrpo_run_name(0, [2, 4], 0.1, 80),
        grpo_run_name(1, 8, matched=True),
        grpo_run_name(2, 32),
        dapo_run_name(3, 16),
    ]
    assert all(re.fullmatch(RUN_NAME_PATTERN, name) for name in names)
    assert not any(re.fullmatch(RUN_NAME_PATTERN, name) for name in ["cgrpo_s0_g2-4", "grpo_s1_G8_other", "bases"])
    # The two training rules split the names: the calibrated methods' runs, and the rest.
    calibrated, rest = run_pattern(calibrated=True), run_pattern(calibrated=False)
    assert [bool(re.fullmatch(calibrated, name)) for name in names[1:]] == [True, False, False, False]
    assert [bool(re.fullmatch(rest, name)) for name in names[1:]] == [False, True, True, True]


def test_the_registry_lists_every_configured_run_and_refuses_a_calibrated_run_without_its_calibration():
    # The default leaves DAPO to its override; with it, the config asks for runs of every method.
    override = yaml.safe_load((Path(__file__).parents[1] / "config" / "overrides" / "with_dapo.yaml").read_text())
    config = {**CONFIG, "dapo": {**CONFIG["dapo"], **override["dapo"]}}
    # Every registered stopping rule but C-GRPO's own can run as an ablation.
    rules = [rule for rule in rule_names() if rule != "conformal"]
    config["cgrpo"] = {**CONFIG["cgrpo"], "ablations": {**CONFIG["cgrpo"]["ablations"], "rules": rules}}
    # And every registered prompt allocator.
    config["allocators"] = {"runs": allocator_names()}
    assert "dapo" not in {parse_run_name(run).method for run in static_runs(CONFIG)}
    runs = static_runs(config)
    seeds = len(config["seeds"])
    expected = seeds * (
        len(config["grpo"]["num_generations"])
        + len(config["dapo"]["num_generations"])
        + 1
        + len(config["cgrpo"]["ablations"]["rules"])
        + len(allocator_names())
    )
    assert len(runs) == len(set(runs)) == expected
    assert {parse_run_name(run).method for run in runs} == set(METHODS)
    with pytest.raises(ValueError, match="starts from an initial calibration"):
        train_spec(CONFIG, "cgrpo_s1_g2-4-8-16-32_d0.2_r80", "model", "splits")


def test_model_sources_are_checked_before_any_job_loads_them(tiny_model_dir, tmp_path, monkeypatch):
    from cgrpo.pipeline.configuration.specs import check_model_source

    check_model_source(tiny_model_dir)
    check_model_source("org/some-model", offline=False)
    for location, message in [
        (str(tmp_path / "missing"), "does not exist; fix the path or set base_model.bootstrap: true"),
        ("./models/missing", "does not exist"),
        (str(tmp_path), "has no config.json"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_model_source(location)
    # Offline, a hub id must already be in the local cache, which holds no "org/some-model".
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="not in the local cache, and HF_HUB_OFFLINE is set"):
        check_model_source("org/some-model")


def test_allocator_and_reinforce_ada_runs_carry_their_trainer_options():
    config = {**CONFIG, "allocators": {"options": {"greso": {"size": 4}}, "rollouts_per_prompt": {"knapsack": 4}}}
    ablations = {**CONFIG["cgrpo"]["ablations"], "options": {"balanced": {"balanced_group_size": 4}}}
    config["cgrpo"] = {**CONFIG["cgrpo"], "ablations": ablations}
    grid = CONFIG["cgrpo"]["budget_grids"][0]
    greso = train_spec(config, allocator_run_name("greso", 1, grid), "model", "splits").cgrpo
    assert greso["prompt_allocator"] == "greso" and greso["allocator_options"] == {"size": 4}
    # The fixed rule at the largest budget leaves the draws to the allocator; nothing is calibrated.
    assert greso["stopping_options"] == {"size": max(grid)} and greso["calibration_holdout"] == 0
    assert (
        train_spec(config, allocator_run_name("knapsack", 1, grid), "model", "splits").cgrpo[
            "allocation_rollouts_per_prompt"
        ]
        == 4
    )
    balanced = train_spec(config, ablation_run_name("balanced", 1, grid, 2), "model", "splits").cgrpo
    assert balanced["balanced_group_size"] == 4 and balanced["stopping_options"] == {"count": 2}
    # Another rule's runs stay as they were.
    assert (
        "balanced_group_size" not in train_spec(config, ablation_run_name("esc", 1, grid, 4), "model", "splits").cgrpo
    )
