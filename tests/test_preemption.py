"""A training job killed mid-run (SIGKILL, as a preempted job is) resumes when the workflow is rerun.

The smoke config, trained for more steps with a checkpoint every two: the C-GRPO job is killed once its checkpoint at
step 4 is complete (a later one may complete before the kill lands), the workflow is rerun, and the resumed run must repeat no step and end as an uninterrupted run of
the same job does (`--forcerun`), wall-clock figures aside.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RUN = "cgrpo_s0_g2-4-8_dauto_r1"
STEPS, SAVE_EVERY, KILL_AFTER = 16, 2, 4
TIMEOUT_S = 600


def _command(workdir: Path, config: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "snakemake",
        "--workflow-profile",
        "none",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--cores",
        "1",
        "--configfile",
        str(REPO / "config" / "smoke.yaml"),
        str(config),
        "--rerun-incomplete",
        f"results/smoke/runs/{RUN}/run.json",
        *args,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _kill_training_job_when(snakemake: subprocess.Popen, ready: Path) -> None:
    """SIGKILL the training job (not Snakemake) as soon as `ready` exists."""
    deadline = time.monotonic() + TIMEOUT_S
    while not ready.exists():
        if snakemake.poll() is not None or time.monotonic() > deadline:
            snakemake.kill()
            pytest.fail(f"the training job never wrote {ready}: {snakemake.stdout.read()}")
        time.sleep(0.05)
    jobs = [p for p in psutil.Process(snakemake.pid).children(recursive=True) if "train.py" in " ".join(p.cmdline())]
    assert jobs, "no training job process found under Snakemake"
    for job in jobs:
        job.send_signal(signal.SIGKILL)


def _without_wall_clock(value):
    # Wall clock and CPU seconds are measured, so they differ between any two runs.
    if isinstance(value, dict):
        return {k: _without_wall_clock(v) for k, v in value.items() if not k.endswith(("wall_s", "cpu_s"))}
    if isinstance(value, list):
        return [_without_wall_clock(v) for v in value]
    return value


def _finished(run_dir: Path) -> tuple[dict, pd.DataFrame]:
    record = _without_wall_clock(json.loads((run_dir / "run.json").read_text()))
    steps = pd.read_csv(run_dir / "steps.csv")
    return record, steps.drop(columns=[c for c in steps.columns if "time" in c or "runtime" in c])


@pytest.mark.slow
@pytest.mark.long
def test_killed_training_job_resumes_from_its_checkpoint(tmp_path):
    config = tmp_path / "longer.yaml"
    config.write_text(yaml.safe_dump({"training": {"max_steps": STEPS, "save_steps": SAVE_EVERY}}))
    run_dir = tmp_path / "results" / "smoke" / "runs" / RUN
    checkpoint = run_dir / "checkpoints" / f"checkpoint-{KILL_AFTER}"

    first = subprocess.Popen(
        _command(tmp_path, config), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env()
    )
    _kill_training_job_when(first, checkpoint / "run_totals.json")
    output, _ = first.communicate(timeout=TIMEOUT_S)
    assert first.returncode != 0, output
    # Nothing a later rule would take for a result: no run.json, and Snakemake removed the job's outputs.
    assert not (run_dir / "run.json").exists() and not (run_dir / "model").exists()
    latest = max(
        int(path.parent.name.split("-")[1]) for path in run_dir.glob("checkpoints/checkpoint-*/run_totals.json")
    )
    assert KILL_AFTER <= latest < STEPS

    rerun = subprocess.run(_command(tmp_path, config), capture_output=True, text=True, env=_env(), timeout=TIMEOUT_S)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    log = (tmp_path / "results" / "smoke" / "logs" / "train" / f"{RUN}.log").read_text()
    assert f"resumes from results/smoke/runs/{RUN}/checkpoints/checkpoint-{latest}." in log
    assert not (run_dir / "checkpoints").exists()
    resumed, resumed_steps = _finished(run_dir)
    assert resumed_steps["step"].tolist() == list(range(1, STEPS + 1))

    again = subprocess.run(
        _command(tmp_path, config, "--forcerun", "train_cgrpo"),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=TIMEOUT_S,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumes from" not in (tmp_path / "results" / "smoke" / "logs" / "train" / f"{RUN}.log").read_text()
    uninterrupted, uninterrupted_steps = _finished(run_dir)
    assert resumed == uninterrupted
    pd.testing.assert_frame_equal(resumed_steps, uninterrupted_steps)
