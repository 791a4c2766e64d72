"""Per-process JSON state in a training checkpoint, so that a preempted run resumes where it stopped.

TRL's checkpoint holds the model, optimizer, scheduler, trainer state and RNG states. Each of the project's trainers
adds, per process, what else decides the rest of its run, as a dict its owner builds and reads (`CGRPOState` for
C-GRPO, `DynamicSampler.state_dict` for dynamic sampling); this module only writes and reads the files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def state_file(folder: str | Path, name: str, process_index: int) -> Path:
    """Where process `process_index` keeps its `name` state inside checkpoint `folder`."""
    return Path(folder) / f"{name}_state_{process_index}.json"


def write_state(folder: str | Path, name: str, process_index: int, state: dict[str, Any]) -> None:
    """Write one process's `name` state into checkpoint `folder`."""
    state_file(folder, name, process_index).write_text(json.dumps(state, indent=1) + "\n")


def read_state(folder: str | Path, name: str, process_index: int, what: str) -> dict[str, Any]:
    """One process's `name` state from checkpoint `folder`; `what` names it in the error when it is missing."""
    path = state_file(folder, name, process_index)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing, so the checkpoint holds no {what}; resume from a checkpoint saved by the same kind of "
            "run with save_only_model=False, or start the run afresh."
        )
    return json.loads(path.read_text())
