"""One line for a job that Ctrl-C stops, instead of its traceback.

Ctrl-C sends SIGINT to Snakemake and to every job it runs. Snakemake says it is terminating and removes the jobs'
incomplete outputs; each job, left to Python, printed a KeyboardInterrupt traceback from wherever it was (most often
halfway through importing torch), and one interrupted before it opened its log made Snakemake add "Logfile ... not
found". Each job script calls :func:`report_interrupts` first: its log exists from then on, and SIGINT ends the job
with one line on the terminal naming it.

This module imports nothing heavy, so that the handler is in place before the job's imports start.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

__all__ = ["INTERRUPTED_STATUS", "report_interrupts"]

# The shell's status for a process ended by SIGINT (128 + 2), which Snakemake reads as a failed job.
INTERRUPTED_STATUS = 130


def report_interrupts(job: Any) -> None:
    """From now on, end this process on SIGINT with one line naming `job` (Snakemake's `snakemake` object of a script,
    whose rule, wildcards and log it reads) on the terminal's stderr, and create the job's log file."""
    name = job.rule + "".join(f" {key}={value}" for key, value in dict(job.wildcards.items()).items() if key != "exp")
    for log in job.log:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        Path(log).touch()
    # The job's own stderr goes to its log once the script starts logging; the line is for whoever pressed Ctrl-C.
    terminal = os.dup(2)
    line = f"{name}: interrupted (Ctrl-C); Snakemake removes its incomplete outputs.\n".encode()

    def stop(signum, frame):
        os.write(terminal, line)
        # No unwinding: a traceback, or an engine's or a trainer's cleanup, is what the one line replaces.
        os._exit(INTERRUPTED_STATUS)

    signal.signal(signal.SIGINT, stop)
