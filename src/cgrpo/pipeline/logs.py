"""Logging set-up shared by the pipeline's scripts."""

from __future__ import annotations

import logging
import os
import sys
import warnings

from ..support.renames import TRL_RENAME_WARNING


def log_to_file(path: str, threads: int | None = None) -> None:
    """Send this process's output and logging to `path`, and cap torch's threads for `--cores N` scheduling.

    The file descriptors are redirected, not only `sys.stderr`, so that libraries which kept a handle on stderr at
    import time, and native code, write to the log too. With one thread per job, `--cores N` runs N jobs side by
    side without oversubscribing the CPU.
    """
    with open(path, "w") as log:
        os.dup2(log.fileno(), sys.stdout.fileno())
        os.dup2(log.fileno(), sys.stderr.fileno())
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    quiet_known_warnings()
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def quiet_known_warnings() -> None:
    """Silence the warnings that libraries raise in every job about code the job does not control (`TRL_RENAME_WARNING`)."""
    warnings.filterwarnings("ignore", message=TRL_RENAME_WARNING, category=FutureWarning)
