"""cgrpo.pipeline.jobs.runs: the cost record of a run, the config's options reaching the trainers, and the copy that stands
in for a compute-matched run equal to a fixed-G run."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from conftest import REPO

from cgrpo.calibration import Thresholds
from cgrpo.dapo.sampler import TOTALS_KEYS
from cgrpo.pipeline.configuration import run_specs
from cgrpo.pipeline.configuration.methods import setting_label
from cgrpo.pipeline.configuration.specs import TrainSpec
from cgrpo.pipeline.jobs import runs, trainers
from cgrpo.pipeline.jobs.runs import _run_record, reuse_compute_matched
from cgrpo.pipeline.logs import quiet_known_warnings
from cgrpo.pipeline.tasks import get_task
from cgrpo.pipeline.tasks.splits import make_splits


def _cgrpo_record(dynamic_totals: dict | None = None) -> dict:
    """The record of a C-GRPO run that sampled 10 groups of width 8 (40 real rows), plus 6 throwaway rows that kept two
    processes in lockstep, after an initial calibration of 32 rollouts."""
    totals = {"train_rollouts": 40, "train_tokens": 400, "groups": 10, "lockstep_rollouts": 6, "generation_s": 1.5}
    trainer = SimpleNamespace(
        cgrpo_totals=totals,
        generation_totals=totals,
        calibration_history=[],
        budget_histogram=Counter({2: 8, 8: 3}),
        args=SimpleNamespace(
            num_generations=8, steps_per_generation=1, stopping_rule="conformal", stop_share=0.75, learning_rate=1e-4
        ),
        state=SimpleNamespace(global_step=5),
        dynamic_totals=dynamic_totals,
    )
    thresholds = Thresholds(delta=0.2, qhat={2: 1.0, 8: 0.9}, solve_rate=0.8, n_calibration=4)
    initial = {
        "thresholds": thresholds,
        "rollouts": 32,
        "tokens": 320,
        "wall_s": 1.0,
        "cpu_s": 0.75,
        "holdout": {"coverage": {"2": 1.0, "8": 0.75}, "n": 4},
    }
    spec = _grid_spec("cgrpo_s0_g2-8_dauto_r0", "cgrpo", delta="auto", recalibrate_every=0)
    return _run_record(spec, trainer, wall=3.0, cpu=2.5, initial=initial)


def _grid_spec(run: str, method: str, **fields) -> TrainSpec:
    """The spec of a run `run` of `method` sampling along the grid [2, 8], seed 0."""
    return TrainSpec(
        run=run,
        method=method,
        model="m",
        splits="s",
        task={"name": "arithmetic", "options": {"num_examples": 10, "chat": True, "worked_examples": 1}},
        seed=0,
        trainer={},
        peft=None,
        reference_budget=8,
        budget_grid=[2, 8],
        **fields,
    )


def test_cgrpo_costs_count_the_lockstep_rows_and_report_them_apart():
    record = _cgrpo_record()
    assert record["train_rollouts_generated"] == 46 and record["lockstep_rollouts_generated"] == 6
    assert record["train_rollout_savings"] == pytest.approx(1 - 46 / 80)
    assert record["train_rollout_savings_with_calibration"] == pytest.approx(1 - (46 + 32) / 80)
    assert record["generation_wall_s"] == 1.5 and record["update_wall_s"] == pytest.approx(3.0 - 1.5)
    # Wall clock and CPU time each add the initial calibration, which ran in its own rule.
    assert record["total_wall_s"] == 4.0 and (record["train_cpu_s"], record["total_cpu_s"]) == (2.5, 3.25)
    # The automatic thresholds' held-out coverage, measured by the calibrate rule, stays with the initial calibration.
    assert record["calibrations"][0]["holdout"] == {"coverage": {"2": 1.0, "8": 0.75}, "n": 4}
    assert record["groups"] == 10 and record["drop_unanimous"] is False and record["dynamic"] is None
    # What every prompt showed besides its question.
    shown = get_task("arithmetic", num_examples=10, worked_examples=1).examples
    assert record["prompt"] == {
        "chat": True,
        "system_prompt": None,
        "worked_examples": [{"question": shown[0][0], "answer": shown[0][1]}],
    }


def test_cgrpo_with_drop_unanimous_counts_its_rollouts_per_prompt_trained_on():
    # Of the 10 groups sampled, 6 were dropped; 3 informative ones and 1 zero-variance one were trained on.
    dynamic = {
        **dict.fromkeys(TOTALS_KEYS, 0.0),
        "groups_sampled": 10,
        "groups_kept": 3,
        "groups_dropped": 6,
        "groups_zero_variance_trained": 1,
        "train_rollouts": 40,
    }
    record = _cgrpo_record(dynamic)
    assert record["groups"] == 4 and record["drop_unanimous"] is True and record["dynamic"] == dynamic
    assert record["train_rollouts_generated"] == 46
    assert record["rollouts_per_prompt"] == pytest.approx((46 + 32) / 4)
    assert record["train_rollout_savings"] == pytest.approx(1 - 46 / (4 * 8))
    assert setting_label(record) == "grid 2-8, delta auto, recal 0, drop unanimous"


def test_a_rule_that_calibrates_in_the_trainer_counts_its_calibration():
    # The signal rule has no initial calibration of the pipeline's; it fits itself when training starts, inside `train`.
    totals = {"train_rollouts": 40, "train_tokens": 400, "groups": 10, "generation_s": 1.5}
    fit = {"step": 0, "delta": 0.1, "lambda": {"2": 0.5}, "rollouts": 64, "tokens": 640, "wall_s": 0.5}
    trainer = SimpleNamespace(
        generation_totals=totals,
        calibration_history=[fit],
        budget_histogram=Counter({2: 8, 8: 2}),
        args=SimpleNamespace(
            num_generations=8, steps_per_generation=1, stopping_rule="signal", stop_share=0.75, learning_rate=1e-4
        ),
        stopping_rule=SimpleNamespace(setting=lambda: 0.1),
        state=SimpleNamespace(global_step=5),
    )
    record = _run_record(_grid_spec("signal_s0_g2-8_t0.1", "signal"), trainer, wall=3.0, cpu=2.5, initial=None)
    assert record["calibration_rollouts_generated"] == 64 and record["calibration_tokens_generated"] == 640
    assert record["rollouts_per_prompt"] == pytest.approx((40 + 64) / 10)
    assert record["train_rollout_savings_with_calibration"] == pytest.approx(1 - (40 + 64) / 80)
    # Its seconds are inside training's: counted once, and not as the policy update's.
    assert record["total_wall_s"] == 3.0 and record["total_cpu_s"] == 2.5 and record["calibration_wall_s"] == 0.5
    assert record["update_wall_s"] == pytest.approx(3.0 - 1.5 - 0.5)
    assert record["delta"] is None and record["stop_setting"] == 0.1


def test_the_configs_dynamic_sampling_options_reach_the_trainers(tiny_model_dir, tmp_path):
    config = yaml.safe_load((REPO / "config" / "cgrpo_drop.yaml").read_text())
    config["cgrpo"]["options"]["max_sampling_rounds"] = 2
    config["dapo"].update(prompts_per_round=32, max_sampling_rounds=3)
    splits = tmp_path / "splits"
    make_splits(
        get_task("arithmetic", num_examples=200).load(),
        splits,
        sizes={"train": 32, "calibration": 32, "eval": 8},
        seed=0,
    )

    spec = run_specs.train_spec(config, "cgrpo_s0_g2-4-8-16-32_dauto_r80", tiny_model_dir, str(splits), "unused")
    cgrpo = trainers.cgrpo_trainer(spec, tmp_path / "cgrpo", initial=None)
    assert cgrpo.args.drop_unanimous and cgrpo.args.max_sampling_rounds == 2 == cgrpo._dynamic.max_rounds

    spec = run_specs.train_spec(config, "dapo_s0_G8", tiny_model_dir, str(splits))
    dapo = trainers.dapo_trainer(spec, tmp_path / "dapo")
    assert (dapo.args.prompts_per_round, dapo.args.max_sampling_rounds) == (32, 3)
    assert (dapo._sampler.prompts_per_round, dapo._sampler.max_rounds) == (32, 3)
    # The pipeline's `correctness` filter is the task's correctness reward, as TRL names it.
    assert dapo.args.filter_metric == "correctness_reward" and not dapo.args.allow_short_batch


@pytest.mark.parametrize("builder", ["cgrpo_trainer", "ablation_trainer", "grpo_trainer", "dapo_trainer"])
def test_every_trainer_takes_the_policy_as_loaded_for_its_checkpoint(builder, tiny_model_dir, tmp_path, monkeypatch):
    # A GGUF checkpoint reaches TRL as a loaded model, since TRL cannot load one by name; an ablation run once
    # passed the bare path and failed on SmolLM2 ("not a valid JSON file").
    from transformers import AutoModelForCausalLM

    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["cgrpo"]["ablations"].update(rules=["esc"], settings={"esc": [2]})
    config["dapo"]["num_generations"] = [8]
    splits = tmp_path / "splits"
    sizes = {"train": 16, "calibration": 48, "eval": 4}
    make_splits(get_task("arithmetic", num_examples=100).load(), splits, sizes=sizes, seed=0)
    names = {
        "cgrpo_trainer": "cgrpo_s0_g2-4-8-16-32_dauto_r0",
        "ablation_trainer": "esc_s0_g2-4-8-16-32_t2",
        "grpo_trainer": "grpo_s0_G8",
        "dapo_trainer": "dapo_s0_G8",
    }
    # The initial calibration's file is read by the training job, not by the trainer.
    spec = run_specs.train_spec(config, names[builder], tiny_model_dir, str(splits), "unused")
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    monkeypatch.setattr(trainers, "_policy", lambda spec: {"model": policy})
    trainer = getattr(trainers, builder)(spec, tmp_path / "out", None)
    assert trainer.model is policy


def _fixed_run(root, name="grpo_s1_G32", **overrides):
    run = root / name
    (run / "model").mkdir(parents=True)
    (run / "model" / "model.safetensors").write_bytes(b"weights")
    (run / "steps.csv").write_text("step,loss\n1,0.5\n")
    record = {
        "run": name,
        "method": "grpo",
        "seed": 1,
        "num_generations": 32,
        "compute_matched": False,
        "train_wall_s": 12.5,
        **overrides,
    }
    (run / "run.json").write_text(json.dumps(record))
    return run


def test_a_run_that_logged_no_step_writes_an_empty_steps_table(tmp_path):
    # logging_steps > max_steps: only the end-of-training summary is logged.
    table = runs._steps_table([{"train_runtime": 1.0, "train_loss": 0.5, "step": 2}])
    table.to_csv(tmp_path / "steps.csv", index=False)
    assert list(pd.read_csv(tmp_path / "steps.csv").columns) == ["step"] and table.empty


def test_copy_is_relabelled_and_keeps_the_measurements(tmp_path):
    source = _fixed_run(tmp_path)
    target = tmp_path / "grpo_s1_G32_matched"
    reuse_compute_matched(source, target)
    record = json.loads((target / "run.json").read_text())
    assert record == {
        "run": "grpo_s1_G32_matched",
        "method": "grpo",
        "seed": 1,
        "num_generations": 32,
        "compute_matched": True,
        "train_wall_s": 12.5,
        "reused_from": "grpo_s1_G32",
    }
    assert (target / "model" / "model.safetensors").read_bytes() == b"weights"
    assert (target / "steps.csv").read_text() == (source / "steps.csv").read_text()


@pytest.mark.parametrize("overrides", [{"method": "cgrpo"}, {"compute_matched": True}])
def test_refuses_anything_but_a_fixed_group_run(tmp_path, overrides):
    source = _fixed_run(tmp_path, **overrides)
    target = tmp_path / "copy"
    with pytest.raises(ValueError, match="not a fixed-G GRPO run"):
        reuse_compute_matched(source, target)
    assert not target.exists()


def test_timed_grpo_trainer_counts_training_generation_only(tiny_model_dir, tmp_path):
    from test_trainer import _data, _length_reward
    from trl import GRPOConfig

    from cgrpo.pipeline.jobs.timing import TimedGRPOTrainer, generation_seconds

    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        num_generations=4,
        max_completion_length=5,
        per_device_train_batch_size=8,
        max_steps=3,
        report_to=[],
        save_strategy="no",
        seed=0,
    )
    trainer = TimedGRPOTrainer(model=tiny_model_dir, reward_funcs=_length_reward, args=args, train_dataset=_data(32))
    trainer.train()
    totals = trainer.generation_totals
    # 3 steps of 2 prompts x 4 completions.
    assert totals["train_rollouts"] == 3 * 8
    assert 3 * 8 <= totals["train_tokens"] <= 3 * 8 * 5
    assert generation_seconds(trainer) == totals["generation_s"] > 0
    trainer.model.eval()
    trainer._generate(["1+1="] * 4)
    assert totals["train_rollouts"] == 3 * 8


def test_a_tracker_keeps_its_files_and_the_model_gets_its_card(tiny_model_dir, tmp_path):
    # The run's output_dir is its checkpoints folder, removed when the run ends; TensorBoard writes its event files
    # there by default, and TRL its model card.
    config = yaml.safe_load((REPO / "config" / "smoke.yaml").read_text())
    config["training"]["report_to"] = "tensorboard"
    splits = tmp_path / "splits"
    make_splits(
        get_task("arithmetic", num_examples=200).load(),
        splits,
        sizes={"train": 32, "calibration": 8, "eval": 8},
        seed=0,
    )
    run = tmp_path / "runs" / "unanimous_s0_g2-4-8"
    runs.train_run(run_specs.train_spec(config, run.name, tiny_model_dir, str(splits)), run)
    assert not (run / "checkpoints").exists()
    events = list((run / "logs").rglob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    card = (run / "model" / "README.md").read_text()
    assert f"fine-tuned version of `{tiny_model_dir}`" in card
    assert "trained with C-GRPO" in card and "budget grid 2, 4, 8" in card and "Stopping rule: `unanimous`." in card


def _renamed_checkpointing_warnings(model_dir: str, tmp_path, quiet: bool) -> list[str]:
    """The FutureWarnings of one job's calls to transformers' renamed gradient checkpointing names, as TRL makes them."""
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if quiet:
            quiet_known_warnings()
        GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[])
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        model.gradient_checkpointing_enable()
        assert model.is_gradient_checkpointing
        model.gradient_checkpointing_disable()
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def test_job_logs_leave_out_trls_use_of_renamed_transformers_names(tiny_model_dir, tmp_path):
    noisy = _renamed_checkpointing_warnings(tiny_model_dir, tmp_path, quiet=False)
    assert len(noisy) == 4 and all("gradient_checkpointing" in message for message in noisy)
    assert _renamed_checkpointing_warnings(tiny_model_dir, tmp_path, quiet=True) == []


def test_allocator_and_reinforce_ada_options_reach_the_trainer_and_the_record(tiny_model_dir, tmp_path):
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["allocators"] = {"runs": ["knapsack"], "rollouts_per_prompt": {"knapsack": 4}}
    config["cgrpo"]["ablations"].update(
        rules=["balanced"], options={"balanced": {"balanced_group_size": 4, "scale_rewards": "none"}}
    )
    splits = tmp_path / "splits"
    make_splits(
        get_task("arithmetic", num_examples=100).load(),
        splits,
        sizes={"train": 16, "calibration": 48, "eval": 4},
        seed=0,
    )
    spec = run_specs.train_spec(config, "knapsack_s0_g2-4-8-16-32", tiny_model_dir, str(splits))
    knapsack = trainers.ablation_trainer(spec, tmp_path / "knapsack")
    assert knapsack._allocation.allocator.name == "knapsack" and knapsack._allocation.rollouts_per_prompt == 4
    spec = run_specs.train_spec(config, "balanced_s0_g2-4-8-16-32_t2", tiny_model_dir, str(splits))
    balanced = trainers.ablation_trainer(spec, tmp_path / "balanced")
    assert balanced.args.balanced_group_size == 4 and balanced.stopping_rule.setting() == 2
    # The record of an allocator's run says what it planned and skipped; other runs' records keep their fields.
    knapsack._allocation.totals.update(skipped_prompts=3, planned_rollouts=64)
    fields = runs._allocation_fields(knapsack)
    assert fields["prompt_allocator"] == "knapsack" and fields["allocation"]["skipped_prompts"] == 3
    assert runs._allocation_fields(balanced) == {}
    record = {"method": "knapsack", "budget_grid": "2-4-8-16-32", **fields}
    assert setting_label(record) == "grid 2-4-8-16-32, 4 rollouts per prompt"
