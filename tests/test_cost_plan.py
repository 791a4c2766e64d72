"""The cost plan (scripts/cost_plan.py): the GPU config's jobs, totals and calibration share, by hand."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from snakemake.utils import update_config, validate
from test_workflow import job_counts, snakemake, workdir_like_repo

from cgrpo.costs import calibration_steps, generation_span
from cgrpo.pipeline.planning.cost_plan import (
    CALIBRATION_SHARE_LIMIT,
    Throughput,
    TokenCounts,
    calibration_shares,
    method_totals,
    plan_jobs,
    plan_report,
    plan_warnings,
)
from cgrpo.pipeline.planning.memory_plan import memory_jobs, memory_warnings
from cgrpo.pipeline.planning.model_size import PUBLISHED, find_model_size, size_from_config

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


# --------------------------------------------------------------------------- model sizes, memory and engine start-ups

SMALL, LARGE = (find_model_size(name) for name in ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct"))
LARGE_OVERRIDE = REPO / "config" / "overrides" / "qwen_1_5b.yaml"


def large_config(overrides: dict | None = None) -> dict:
    config = planned(yaml.safe_load(LARGE_OVERRIDE.read_text()))
    update_config(config, overrides or {})
    return config


def test_the_shipped_models_sizes_are_their_published_ones():
    # The model cards: 0.49B (0.36B without the embeddings) and 1.54B (1.31B), tied embeddings of 151,936 x hidden.
    assert SMALL.params == 494_032_768 and SMALL.params - 151_936 * 896 == 357_898_112
    assert LARGE.params == 1_543_714_304 and LARGE.params - 151_936 * 1536 == 1_310_340_608
    # KV cache per token: 2 x layers x KV heads x head size x 2 bytes; the larger model's is 2.3 times the smaller's.
    assert SMALL.kv_bytes_per_token() == 2 * 24 * 2 * 64 * 2 == 12_288
    assert LARGE.kv_bytes_per_token() == 2 * 28 * 2 * 128 * 2 == 28_672
    # LoRA r = 16 on the seven projections: 16 x (in + out) each, per layer.
    per_layer = 16 * (2 * (896 + 896) + 2 * (896 + 128) + 3 * (896 + 4864))
    assert SMALL.lora_params(16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]) == (
        24 * per_layer
    )
    with pytest.raises(ValueError, match="peft.target_modules names lm_head, whose shape the cost plan does not know"):
        SMALL.lora_params(16, ["q_proj", "lm_head"])


@pytest.mark.parametrize(
    "architecture",
    [
        {"model_type": "qwen2", "tie_word_embeddings": True},
        {"model_type": "llama", "tie_word_embeddings": False, "head_dim": 8},
        {"model_type": "llama", "attention_bias": True, "mlp_bias": True},
    ],
)
def test_the_parameter_count_is_the_one_transformers_builds(architecture):
    from transformers import AutoConfig, AutoModelForCausalLM

    shapes = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 300,
    }
    config = AutoConfig.for_model(**architecture, **shapes)
    built = AutoModelForCausalLM.from_config(config).num_parameters()
    assert size_from_config(config.to_dict(), "tiny", "test").params == built


def test_a_models_size_is_read_from_its_folder_the_published_table_or_a_number(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({**PUBLISHED["Qwen/Qwen2.5-0.5B-Instruct"], "num_hidden_layers": 2})
    )
    from_folder = find_model_size(str(tmp_path))
    assert from_folder.layers == 2 and from_folder.source == str(tmp_path / "config.json")
    assert find_model_size("Qwen/Qwen2.5-1.5B-Instruct").params == LARGE.params
    # A count alone: weights and optimizer state without the shapes; nothing known at all: None.
    counted = find_model_size("org/unknown-model", params=7_000_000_000)
    assert counted.params == 7_000_000_000 and not counted.has_shapes
    assert find_model_size("org/unknown-model") is None
    assert find_model_size("Qwen/Qwen2.5-1.5B-Instruct", config_file=tmp_path).layers == 2


def test_engine_start_ups_are_counted_once_per_job_that_starts_an_engine():
    jobs = plan_jobs(planned())
    # Every job of the GPU config starts one: colocated in the calibration and training jobs, vLLM's evaluation.
    assert jobs["engine_starts"].tolist() == [1] * len(jobs) and len(jobs) == 1 + 1 + 18 + 19
    starting = Throughput(generation=20_000, training=40_000, startup_s=60)
    difference = method_totals(jobs, starting)["gpu_hours"].sum() - method_totals(jobs, THROUGHPUT)["gpu_hours"].sum()
    assert difference == pytest.approx(len(jobs) * 60 / 3600)
    hf = plan_jobs(planned({"training": {"use_vllm": False}, "evaluation": {"backend": "hf"}}))
    assert hf["engine_starts"].sum() == 0


def test_the_plans_of_the_small_and_the_large_model_differ():
    small, large = planned(), large_config()
    # Throughputs measured on the small model (as the GPU smoke run prints them) are a third on the large one.
    small_report = plan_report(small, THROUGHPUT, model=SMALL, measured_on=SMALL)
    large_report = plan_report(large, THROUGHPUT, model=LARGE, measured_on=SMALL)
    hours = [
        float(re.search(r"jobs that load the policy, ([\d.,]+) GPU-hours", r).group(1))
        for r in (small_report, large_report)
    ]
    assert hours[1] == pytest.approx(hours[0] * LARGE.params / SMALL.params, rel=0.02)
    scaled = THROUGHPUT.scaled(SMALL, LARGE)
    assert scaled.generation == pytest.approx(20_000 * 494_032_768 / 1_543_714_304)
    # Memory: every job holds more of the large model; both fit an 80 GiB GPU, the large one with the override's
    # larger vLLM share.
    small_memory, large_memory = (memory_jobs(config, size, 80) for config, size in ((small, SMALL), (large, LARGE)))
    assert all(a.rule == b.rule and a.peak_gib < b.peak_gib for a, b in zip(small_memory, large_memory))
    assert memory_warnings(small_memory, 80) == [] and memory_warnings(large_memory, 80) == []
    assert "Warnings\n\nNone." in small_report and "Warnings\n\nNone." in large_report


def test_the_memory_of_a_training_job_by_hand():
    trains = [job for job in memory_jobs(large_config(), LARGE, 80) if job.rule == "train"]
    # GRPO's micro-batch holds C-GRPO's one prompt per micro-batch at its own G (G rows), so each G is a kind of job
    # of its own: the three seeds of G = 32 hold the most.
    assert [job.jobs for job in trains] == [3] * 4
    train = max(trains, key=lambda job: job.peak_gib)
    gib, rows, tokens = 2**30, 32, 2048
    assert train.row_tokens == tokens
    assert train.weights_gib == pytest.approx(LARGE.params * 2 / gib)
    assert train.training_state_gib == pytest.approx(18_464_768 * 16 / gib)
    logits = 3 * rows * 512 * 151_936 * 2
    checkpointed = 28 * rows * tokens * 1536 * 2 + 34 * rows * tokens * 1536
    assert train.activations_gib == pytest.approx((logits + checkpointed) / gib)
    # The engine: 0.5 x 80 GiB for its weights and 576 rows of 2,048 tokens at 28 KiB.
    assert train.vllm_share_gib == 40
    assert train.vllm_needs_gib == pytest.approx((LARGE.params * 2 + 576 * tokens * 28_672) / gib)
    assert train.peak_gib == pytest.approx(40 + train.weights_gib + train.training_state_gib + train.activations_gib)
    # Measured prompts shorten the rows: 600 prompt and 512 completion tokens.
    short = max(memory_jobs(large_config(), LARGE, 80, prompt_tokens=600), key=lambda job: job.peak_gib)
    assert short.row_tokens == 1112 and short.vllm_needs_gib < train.vllm_needs_gib


def test_a_model_that_does_not_fit_the_stated_gpu_warns_naming_the_fixes():
    warnings = memory_warnings(memory_jobs(large_config(), LARGE, 16), 16)
    assert any("more than the GPU's 16 GiB: use a GPU with more memory" in line for line in warnings)
    assert any("so they run in waves" in line and "raise vllm_gpu_memory_utilization" in line for line in warnings)
    # The large model at the small model's vLLM share (0.3 of 80 GiB) fits the GPU, but not a generation batch:
    # (24 - 2.9 GiB of weights) / (2,048 x 28 KiB) = 386 of its 576 rows, in every job with an engine.
    at_small_share = large_config({"training": {"vllm_gpu_memory_utilization": 0.3}})
    waves = memory_warnings(memory_jobs(at_small_share, LARGE, 80), 80)
    assert len(waves) == 3 and all("so they run in waves" in line for line in waves)
    assert waves[0].startswith("calibrate (1 job): vLLM's share of 24.0 GiB holds the KV cache of 386 of the 576 rows")
    tiny_share = large_config({"training": {"vllm_gpu_memory_utilization": 0.03}})
    assert any(
        "so the engine will not start" in line for line in memory_warnings(memory_jobs(tiny_share, LARGE, 80), 80)
    )
    # Without a dtype TRL loads float32: twice the weights, and a warning that names the key.
    unset = planned()
    del unset["training"]["model_init_kwargs"]
    jobs = memory_jobs(unset, SMALL, 80)
    assert jobs[0].weights_gib == pytest.approx(SMALL.params * 4 / 2**30)
    assert memory_warnings(jobs, 80)[0].startswith("training.model_init_kwargs.dtype is unset, so TRL loads the policy")
    for line in warnings + memory_warnings(jobs, 80):
        assert line.count(". ") == 0 and line.endswith(".")


def test_the_script_plans_the_large_model_on_a_small_gpu_with_warnings():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    configs = ["--configfile", str(GPU_CONFIG), str(LARGE_OVERRIDE)]
    rates = ["--gen-tokens-per-s", "20000", "--train-tokens-per-s", "40000", "--gpu-memory-gib", "16"]
    command = [sys.executable, str(REPO / "scripts" / "cost_plan.py"), *configs, *rates]
    result = subprocess.run(
        [*command, "--measured-on", "Qwen/Qwen2.5-0.5B-Instruct"], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "Throughputs measured on Qwen/Qwen2.5-0.5B-Instruct (494,032,768 parameters), scaled to" in result.stdout
    assert "## GPU memory per job (GiB, on a GPU of 16 GiB)" in result.stdout
    assert "more than the GPU's 16 GiB" in result.stdout.split("## Warnings")[1]
    unknown = subprocess.run([*command, "--measured-on", "org/unknown"], capture_output=True, text=True, env=env)
    assert unknown.returncode == 2 and unknown.stderr.startswith("cost plan: --measured-on org/unknown: no config.json")
