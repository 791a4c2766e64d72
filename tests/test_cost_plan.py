"""The cost plan (scripts/cost_plan.py): the GPU config's jobs, totals and calibration share, by hand."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config, validate
from test_workflow import job_counts, snakemake, workdir_like_repo

from cgrpo.costs import calibration_steps, generation_span
from cgrpo.pipeline.analysis.cost_plan import (
    CALIBRATION_SHARE_LIMIT,
    Throughput,
    TokenCounts,
    calibration_shares,
    method_totals,
    plan_jobs,
    plan_warnings,
)

REPO = Path(__file__).resolve().parents[1]
GPU_CONFIG = REPO / "config" / "gsm8k_qwen.yaml"
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
THROUGHPUT = Throughput(generation=20_000, training=40_000)
# The GPU config by hand: 480 steps x 3 prompts (32-row micro-batches, 3 accumulation steps) = 1,440 prompts a run;
# 96 calibration prompts x 32 samples a fit; 320 eval prompts, each evaluated model drawing 320 greedy and
# (320 + 96) x 32 sampled completions.
PROMPTS, FIT, EVALUATION = 1_440, 96 * 32, 320 + 416 * 32


def planned(overrides: dict | None = None) -> dict:
    config = copy.deepcopy(yaml.safe_load(GPU_CONFIG.read_text()))
    update_config(config, overrides or {})
    validate(config, schema=str(SCHEMA))
    return config


def test_the_gpu_configs_totals_per_method_by_hand():
    jobs = plan_jobs(planned(), TokenCounts(prompt=300))
    totals = method_totals(jobs, THROUGHPUT).set_index("method")
    seeds, completion = 3, 512
    grpo_training = seeds * PROMPTS * (4 + 8 + 16 + 32)
    # C-GRPO's training at the worst case: 2 deltas x 3 seeds, every prompt at 32.
    cgrpo_training = 2 * seeds * PROMPTS * 32
    # One calibrate job (a calibration shared by the seeds), and one refit (step 240) in each of the 6 runs.
    cgrpo_calibration = FIT + 6 * FIT
    assert totals.loc["grpo", "runs"] == 12 and totals.loc["cgrpo", "runs"] == 6
    assert totals.loc["grpo", "training_rollouts"] == grpo_training == 259_200
    assert totals.loc["cgrpo", "training_rollouts"] == cgrpo_training == 276_480
    assert totals.loc["cgrpo", "calibration_rollouts"] == cgrpo_calibration == 21_504
    assert totals.loc["grpo", "evaluation_completions"] == 12 * EVALUATION == 163_584
    # The base model: its evaluation and the format check's 32 prompts x 2 samples.
    assert totals.loc["base", "evaluation_completions"] == EVALUATION + 64
    assert totals.loc["grpo", "generated_tokens"] == (grpo_training + 12 * EVALUATION) * completion
    assert totals.loc["grpo", "trained_tokens"] == grpo_training * (completion + 300)
    hours = ((grpo_training + 12 * EVALUATION) * completion / 20_000 + grpo_training * 812 / 40_000) / 3600
    assert totals.loc["grpo", "gpu_hours"] == pytest.approx(hours)


def test_the_gpu_configs_calibration_is_at_most_15_percent_of_g32s_training():
    shares = calibration_shares(plan_jobs(planned()))
    # Two fits a run (steps 0 and 240) of 3,072 rollouts against G = 32's 1,440 x 32 = 46,080 training rollouts.
    assert len(shares) == 6
    assert set(shares["calibration_rollouts"]) == {2 * FIT}
    assert shares["share"].max() == pytest.approx(6_144 / 46_080)
    assert shares["share"].max() <= CALIBRATION_SHARE_LIMIT == 0.15


def test_the_calibration_schedule_is_the_trainers():
    # Generation batches start every 18 micro-batches / 3 per optimizer step = 6 steps; refits at the first start
    # 240 or more steps after the last calibration.
    assert generation_span(18, 1, 3) == 6
    assert calibration_steps(480, 6, 240) == [0, 240]
    # The former config: 500 steps, generation every 6, a refit every 48: 11 fits, as the issue counted.
    assert calibration_steps(500, 6, 48) == list(range(0, 500, 48))
    assert calibration_steps(48, 8, 0) == [0]
    # A refit waits for a generation batch to start: every 10 steps with batches every 8 refits at 16, 32, ...
    assert calibration_steps(40, 8, 10) == [0, 16, 32]


def test_the_former_config_warns_that_its_calibration_costs_more_than_training():
    former = planned(
        {
            "splits": {"sizes": {"calibration": 500, "eval": 1319}},
            "training": {
                "max_steps": 500,
                "per_device_train_batch_size": 96,
                "gradient_accumulation_steps": 1,
                "steps_per_generation": 6,
            },
            "cgrpo": {"recalibrate_every": [48], "options": {"num_calibration_samples": 200}},
        }
    )
    jobs = plan_jobs(former)
    shares = calibration_shares(jobs)
    # 11 fits of 200 x 32 against G = 32's 500 x 3 x 32 = 48,000 training rollouts: 1.47 times.
    assert set(shares["calibration_rollouts"]) == {11 * 6_400}
    assert shares["share"].iloc[0] == pytest.approx(70_400 / 48_000)
    warnings = plan_warnings(shares, method_totals(jobs, THROUGHPUT))
    assert len(warnings) == 2 and all("147% of G = max(grid)" in line for line in warnings)


def test_an_evaluation_costlier_than_all_training_is_a_warning():
    config = planned({"splits": {"sizes": {"eval": 1319}}, "training": {"max_steps": 48}})
    jobs = plan_jobs(config)
    warnings = plan_warnings(calibration_shares(jobs), method_totals(jobs, THROUGHPUT))
    assert any(line.startswith("The evaluations plan") and "splits.sizes.eval" in line for line in warnings)
    jobs = plan_jobs(planned())
    assert plan_warnings(calibration_shares(jobs), method_totals(jobs, THROUGHPUT)) == []


def test_expected_means_replace_the_worst_case():
    jobs = plan_jobs(planned(), TokenCounts(completion=250, prompt=300), mean_k=12).set_index("job")
    run = jobs.loc["cgrpo_s0_g2-4-8-16-32_dauto_r240"]
    assert run["rollouts"] == PROMPTS * 12 + FIT and run["basis"] == "mean k 12"
    assert run["generated_tokens"] == (PROMPTS * 12 + FIT) * 250
    # Calibration rollouts are drawn, not trained on.
    assert run["trained_tokens"] == PROMPTS * 12 * 550


def test_compute_matched_runs_are_planned_at_c_grpos_cost_unless_a_fixed_run_is_reused():
    jobs = plan_jobs(planned({"grpo": {"num_generations": [32, 4], "compute_matched": True}}))
    matched = jobs[jobs["job"].str.endswith("_matched") & (jobs["rule"] == "train")]
    # (46,080 worst-case training + 6,144 calibration) / 1,440 prompts = 36.3: G = 36, for each seed.
    assert set(matched["job"]) == {f"grpo_s{seed}_G36_matched" for seed in range(3)}
    assert set(matched["rollouts"]) == {36 * PROMPTS}
    assert (jobs["job"].str.endswith("_matched") & (jobs["rule"] == "evaluate")).sum() == 3
    # At an expected mean of 28 the matched G is 32, a configured run that the workflow copies: nothing to plan.
    jobs = plan_jobs(planned({"grpo": {"num_generations": [32, 4], "compute_matched": True}}), mean_k=28)
    assert not jobs["job"].str.endswith("_matched").any()


def test_a_null_eval_size_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="splits.sizes.eval is null .* set it to a number"):
        plan_jobs(planned({"splits": {"sizes": {"eval": None}}}))


@pytest.mark.parametrize(
    "configs",
    [
        ["gsm8k_qwen.yaml"],
        # Calibrations per seed, calibration-free rules and the signal rule, which calibrates itself.
        ["frontier.yaml"],
        # Compute matching (its runs come after the checkpoint, which a dry run cannot plan) and DAPO.
        ["config.yaml", "overrides/long.yaml", "overrides/with_dapo.yaml"],
    ],
    ids=["gsm8k_qwen", "frontier", "with_dapo"],
)
def test_the_plan_counts_the_jobs_a_dry_run_plans(tmp_path, configs):
    paths = [REPO / "config" / name for name in configs]
    result = snakemake(workdir_like_repo(tmp_path), "-n", "--cores", "1", "--configfile", *map(str, paths))
    assert result.returncode == 0, result.stdout
    config = {}
    for path in paths:
        update_config(config, yaml.safe_load(path.read_text()))
    validate(config, schema=str(SCHEMA))
    jobs = plan_jobs(config)
    planned_rules = jobs[~jobs["job"].str.endswith("_matched")]["rule"].value_counts().to_dict()
    dry_run = job_counts(result.stdout)
    assert planned_rules == {rule: dry_run[rule] for rule in planned_rules}
    assert set(dry_run) - set(planned_rules) <= {"base_model", "split", "match_compute", "replay", "aggregate"} | {
        "plots",
        "all",
        "total",
    }


def test_stopping_rules_dapo_and_calibrations_per_seed_by_hand():
    config = yaml.safe_load((REPO / "config" / "frontier.yaml").read_text())
    validate(config, schema=str(SCHEMA))
    jobs = plan_jobs(config).set_index("job")
    # 48 steps of 2 prompts; a calibration per seed of 32 prompts x 32; the signal rule fits itself once (its default
    # refit every 50 steps never comes in 48), ESC never.
    assert list(jobs.loc[jobs["rule"] == "calibrate", "rollouts"]) == [1_024] * 5
    assert jobs.loc["signal_s0_g2-4-8-16-32_t0.1", "calibration_rollouts"] == 1_024
    assert jobs.loc["esc_s0_g2-4-8-16-32_t2", "calibration_rollouts"] == 0
    assert jobs.loc["esc_s0_g2-4-8-16-32_t2", "rollouts"] == 96 * 32
    with_dapo = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    for name in ("overrides/long.yaml", "overrides/with_dapo.yaml"):
        update_config(with_dapo, yaml.safe_load((REPO / "config" / name).read_text()))
    validate(with_dapo, schema=str(SCHEMA))
    dapo = plan_jobs(with_dapo).set_index("job").loc["dapo_s0_G32"]
    # 160 steps of 2 prompts in generation batches of 8 steps: 20 batches, each at least one round of 3 x 16 prompts.
    assert dapo["rollouts"] == 20 * 48 * 32 and dapo["basis"].startswith("least")
    assert dapo["trained_tokens"] == 320 * 32 * 40


def test_the_script_prints_the_totals_per_method_and_refuses_bad_input():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, str(REPO / "scripts" / "cost_plan.py"), "--configfile", str(GPU_CONFIG)]
    rates = ["--gen-tokens-per-s", "20000", "--train-tokens-per-s", "40000"]
    result = subprocess.run([*command, *rates], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    per_method = result.stdout.split("## Per method")[1].split("##")[0]
    assert "| grpo     |     12 |             259,200 |" in per_method
    assert "Warnings\n\nNone." in result.stdout
    bad = subprocess.run(
        [*command, "--gen-tokens-per-s", "0", "--train-tokens-per-s", "1"], capture_output=True, text=True, env=env
    )
    assert bad.returncode == 2 and "throughputs must be positive" in bad.stderr
