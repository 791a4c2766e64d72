"""What a finished GPU smoke run (scripts/gpu_smoke.py) must show beyond having finished: the generation went through
vLLM where the config says so, and C-GRPO refitted inside its training job, paths a silent fallback would skip; and
the throughputs it measured, as the cost plan (scripts/cost_plan.py) takes them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

__all__ = ["gpu_run_problems", "job_times", "measured_throughput", "plan_flags"]

# TRL logs the sampler's importance ratio only for completions vLLM generated.
VLLM_RATIO = "sampling/importance_sampling_ratio/mean"
VLLM_LOG_LINE = "with the vllm backend"


def gpu_run_problems(results: str | Path) -> list[str]:
    """One sentence per GPU path the finished run in `results` (results/<experiment>/) did not take."""
    results = Path(results)
    records = sorted(results.glob("runs/*/run.json"))
    if not records:
        return [f"{results} holds no training run."]
    problems = []
    for record in records:
        run = record.parent.name
        steps = pd.read_csv(record.parent / "steps.csv")
        if VLLM_RATIO not in steps or not steps[VLLM_RATIO].map(math.isfinite).any():
            problems.append(f"{run} logged no vLLM importance ratio: its training did not generate with vLLM.")
        calibrations = json.loads(record.read_text())["calibrations"]
        if run.startswith("cgrpo_") and len(calibrations) < 2:
            problems.append(f"{run} calibrated {len(calibrations)} time(s): no refit ran inside its training job.")
    for log in [*sorted(results.glob("logs/evaluate/*.log")), results / "logs" / "format_rate.log"]:
        if not log.is_file() or VLLM_LOG_LINE not in log.read_text():
            problems.append(f"{log.relative_to(results)} does not say it sampled with the vLLM backend.")
    return problems


def job_times(results: str | Path) -> pd.DataFrame:
    """Every job's wall-clock seconds and peak resident memory (Snakemake's benchmark files), longest first."""
    rows = [
        {
            "job": str(path.relative_to(Path(results) / "benchmarks").with_suffix("")),
            **pd.read_csv(path, sep="\t").iloc[0],
        }
        for path in sorted(Path(results).glob("benchmarks/**/*.tsv"))
    ]
    table = pd.DataFrame(rows, columns=["job", "s", "max_rss"])
    return table.sort_values("s", ascending=False).reset_index(drop=True)


def measured_throughput(results: str | Path) -> tuple[float, float]:
    """Tokens generated per second of generation, and tokens (prompt and completion) through the update per second
    of update, over every training run of the finished run in `results`, as their records count them: generation is
    the training's and its calibrations', the initial one's included (`run.json`); the update is what the rest of the
    training took, and trained what TRL counts (`num_tokens` in `steps.csv`, every trained row's prompt and
    completion) times its `num_iterations` (the run's spec)."""
    results = Path(results)
    generated = generating = trained = updating = 0.0
    for record_path in sorted(results.glob("runs/*/run.json")):
        record = json.loads(record_path.read_text())
        spec = json.loads((results / "specs" / "train" / f"{record_path.parent.name}.json").read_text())
        epochs = int(spec["trainer"].get("num_iterations", 1))
        generated += record["train_tokens_generated"] + record["calibration_tokens_generated"]
        generating += record["generation_wall_s"] + record["calibration_wall_s"]
        steps = pd.read_csv(record_path.parent / "steps.csv")
        trained += steps["num_tokens"].max() * epochs
        updating += record["update_wall_s"]
    if not (generated and generating and trained and updating):
        raise ValueError(
            f"{results} holds no training run that timed its generation and update, so no throughput can be "
            "measured: rerun the smoke run (python scripts/gpu_smoke.py)."
        )
    return generated / generating, trained / updating


def plan_flags(results: str | Path) -> str:
    """The cost plan's throughput flags as the finished run in `results` measured them, on the model it trained."""
    generation, training = measured_throughput(results)
    model = json.loads((Path(results) / "base_model" / "source.json").read_text())["path"]
    return f"--gen-tokens-per-s {generation:.0f} --train-tokens-per-s {training:.0f} --measured-on {model}"
