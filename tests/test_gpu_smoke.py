"""The ten-minute GPU smoke run (scripts/gpu_smoke.py): its refusal on CPU, its plan, and its checks of a finished run.

No GPU here: the run itself is untested; what a CPU can check is that the script refuses before any work, that the
configs plan the jobs the docs promise, and that the checks catch a run whose generation fell back from vLLM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from snakemake.utils import update_config, validate
from test_workflow import job_counts, snakemake, workdir_like_repo

from cgrpo.costs import calibration_steps
from cgrpo.pipeline.analysis.gpu_smoke import VLLM_RATIO, gpu_run_problems, job_times, measured_throughput, plan_flags
from cgrpo.pipeline.planning.cost_plan import calibration_shares, plan_jobs

REPO = Path(__file__).resolve().parents[1]
CONFIGS = [REPO / "config" / "gsm8k_qwen.yaml", REPO / "config" / "overrides" / "gpu_smoke.yaml"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_on_cpu_the_smoke_refuses_in_one_sentence_before_any_work(tmp_path):
    results = REPO / "results" / "gpu_smoke"
    existed = results.exists()
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_smoke.py")],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
        check=False,
    )
    assert result.returncode == 2 and result.stdout == ""
    message = result.stderr.strip()
    assert message.startswith("gpu smoke: torch ") and "sees no CUDA device" in message
    assert message.count("\n") == 0 and message.endswith(".") and message.count(". ") == 0
    assert results.exists() == existed


def _smoke_config() -> dict:
    config = {}
    for path in CONFIGS:
        update_config(config, yaml.safe_load(path.read_text()))
    validate(config, schema=str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    return config


def test_the_smoke_plans_every_gpu_path_once(tmp_path):
    result = snakemake(workdir_like_repo(tmp_path), "-n", "--cores", "1", "--configfile", *map(str, CONFIGS))
    assert result.returncode == 0, result.stdout
    counts = job_counts(result.stdout)
    # The format check, one calibration, C-GRPO and GRPO at G = 4, and the evaluations of the base model and both.
    assert {rule: counts[rule] for rule in ("format_rate", "calibrate", "train_cgrpo", "train", "evaluate")} == {
        "format_rate": 1,
        "calibrate": 1,
        "train_cgrpo": 1,
        "train": 1,
        "evaluate": 3,
    }
    config = _smoke_config()
    training = config["training"]
    # vLLM colocated and evaluating, as in the GPU config it shrinks; a refit inside the training job at step 6.
    assert training["use_vllm"] and training["vllm_mode"] == "colocate" and not training["use_cpu"]
    assert config["evaluation"]["backend"] == "vllm" and config["experiment"] == "gpu_smoke"
    assert calibration_steps(training["max_steps"], 6, config["cgrpo"]["recalibrate_every"][0]) == [0, 6]
    assert calibration_shares(plan_jobs(config))["calibration_rollouts"].tolist() == [2 * 16 * 32]


# What each run's record says it generated and timed, and the tokens TRL counted through its update (num_tokens in
# steps.csv, cumulative), with the spec's num_iterations: (train tokens, calibration tokens, generation s, calibration
# s, update s, num_tokens at its last step, num_iterations).
TIMED = {
    "cgrpo_s0_g2-4-8-16-32_dauto_r6": (30_000, 10_000, 3.0, 1.0, 5.0, 50_000, 1),
    "grpo_s0_G4": (20_000, 0, 2.0, 0.0, 3.0, 40_000, 2),
}


def _finished_run(folder: Path, ratio: float, backend: str, calibrations: int = 2) -> Path:
    """A results folder as a finished smoke run leaves it, with the vLLM ratio and log lines given."""
    for run, (train, calibration, generation_s, calibration_s, update_s, num_tokens, epochs) in TIMED.items():
        (folder / "runs" / run).mkdir(parents=True)
        pd.DataFrame(
            {"step": [1, 2], VLLM_RATIO: [ratio, float("nan")], "num_tokens": [num_tokens // 2, num_tokens]}
        ).to_csv(folder / "runs" / run / "steps.csv", index=False)
        record = {
            "run": run,
            "calibrations": [{}] * (calibrations if run.startswith("cgrpo") else 0),
            "train_tokens_generated": train,
            "calibration_tokens_generated": calibration,
            "generation_wall_s": generation_s,
            "calibration_wall_s": calibration_s,
            "update_wall_s": update_s,
        }
        (folder / "runs" / run / "run.json").write_text(json.dumps(record))
        (folder / "specs" / "train").mkdir(parents=True, exist_ok=True)
        spec = {"run": run, "trainer": {"num_iterations": epochs} if epochs > 1 else {}}
        (folder / "specs" / "train" / f"{run}.json").write_text(json.dumps(spec))
    (folder / "base_model").mkdir()
    (folder / "base_model" / "source.json").write_text(json.dumps({"path": "Qwen/Qwen2.5-0.5B-Instruct"}))
    (folder / "logs" / "evaluate").mkdir(parents=True)
    for log in ("evaluate/base.log", "evaluate/grpo_s0_G4.log", "format_rate.log"):
        (folder / "logs" / log).write_text(f"sampling with the {backend} backend.\n")
    (folder / "benchmarks" / "train").mkdir(parents=True)
    pd.DataFrame({"s": [61.5], "max_rss": [9000.0]}).to_csv(folder / "benchmarks" / "train" / "x.tsv", sep="\t")
    return folder


def test_a_run_that_took_every_gpu_path_passes_the_checks(tmp_path):
    folder = _finished_run(tmp_path, ratio=1.02, backend="vllm")
    assert gpu_run_problems(folder) == []
    assert job_times(folder).to_dict("records") == [{"job": "train/x", "s": 61.5, "max_rss": 9000.0}]


def test_the_checks_name_every_fallback(tmp_path):
    folder = _finished_run(tmp_path, ratio=float("nan"), backend="hf", calibrations=1)
    problems = gpu_run_problems(folder)
    assert sum("logged no vLLM importance ratio" in line for line in problems) == 2
    assert sum("does not say it sampled with the vLLM backend" in line for line in problems) == 3
    assert any("calibrated 1 time(s): no refit" in line for line in problems)
    assert gpu_run_problems(tmp_path / "missing") == [f"{tmp_path / 'missing'} holds no training run."]


def test_the_measured_throughputs_are_printed_as_the_cost_plan_takes_them(tmp_path):
    folder = _finished_run(tmp_path / "results", ratio=1.02, backend="vllm")
    # Generation: (30,000 + 10,000 + 20,000) tokens in (3 + 1 + 2) s; update: (50,000 + 2 x 40,000) in (5 + 3) s.
    assert measured_throughput(folder) == (10_000, 16_250)
    flags = plan_flags(folder)
    assert flags == "--gen-tokens-per-s 10000 --train-tokens-per-s 16250 --measured-on Qwen/Qwen2.5-0.5B-Instruct"
    command = [sys.executable, str(REPO / "scripts" / "cost_plan.py"), "--configfile", str(CONFIGS[0]), *flags.split()]
    plan = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120
    )
    assert plan.returncode == 0, plan.stderr
    assert "at 10,000 generated and 16,250 trained tokens per second" in plan.stdout
    # A run whose training runs left no record has nothing to measure.
    for run in TIMED:
        (folder / "runs" / run / "run.json").unlink()
    with pytest.raises(ValueError, match="holds no training run that timed its generation and update"):
        measured_throughput(folder)
