"""What a finished GPU smoke run (scripts/gpu_smoke.py) must show beyond having finished: the generation went through
vLLM where the config says so, and C-GRPO refitted inside its training job, paths a silent fallback would skip."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

__all__ = ["gpu_run_problems", "job_times"]

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
