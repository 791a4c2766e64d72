"""Ctrl-C during a run: each interrupted job prints one line naming it, no traceback, and leaves a log Snakemake finds;
every workflow script sets this up before its heavy imports."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = """
from cgrpo.pipeline.interrupts import report_interrupts

report_interrupts(snakemake)
import time

open(snakemake.log[0], "a").write("started\\n")
time.sleep(120)
"""
SNAKEFILE = """
rule all:
    input: expand("out/{n}.txt", n=[1, 2])

rule slow:
    output: "out/{n}.txt"
    log: "logs/slow/{n}.log"
    script: "slow.py"
"""


def test_ctrl_c_prints_one_line_per_interrupted_job_and_no_traceback(tmp_path):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    (tmp_path / "slow.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    # Its own process group, as a terminal's foreground job: Ctrl-C signals every process in it.
    run = subprocess.Popen(
        [sys.executable, "-m", "snakemake", "--cores", "2", "--show-failed-logs"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    logs = [tmp_path / "logs" / "slow" / f"{n}.log" for n in (1, 2)]
    deadline = time.monotonic() + 120
    while not all(log.is_file() and "started" in log.read_text() for log in logs):
        assert time.monotonic() < deadline and run.poll() is None, "the jobs did not start"
        time.sleep(0.5)
    os.killpg(run.pid, signal.SIGINT)
    output, _ = run.communicate(timeout=120)
    assert run.returncode != 0
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    lines = [line for line in output.splitlines() if "interrupted (Ctrl-C)" in line]
    assert sorted(lines) == [
        f"slow n={n}: interrupted (Ctrl-C); Snakemake removes its incomplete outputs." for n in (1, 2)
    ]
    assert "not found" not in output
    assert not list((tmp_path / "out").glob("*.txt"))


def test_every_workflow_script_sets_up_interrupts_before_any_other_import():
    for script in sorted((REPO / "workflow" / "scripts").glob("*.py")):
        body = ast.parse(script.read_text()).body[1:]
        first, call = body[0], body[1]
        assert isinstance(first, ast.ImportFrom) and first.module == "cgrpo.pipeline.interrupts", script.name
        assert isinstance(call, ast.Expr) and ast.unparse(call) == "report_interrupts(snakemake)", script.name
