"""C-GRPO's own state in a training checkpoint, so that a preempted run resumes where it stopped.

TRL's checkpoint holds the model, optimizer, scheduler, trainer state and RNG states. C-GRPO adds, per process, what
decides the rest of the run and what its costs add up from: the thresholds in force, the step of the last calibration,
the calibration history, the cost totals and budget histogram, the calibration rollouts still to be logged, and the
state of the stopping RNG.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .calibration import Thresholds

if TYPE_CHECKING:
    from .trainer import CGRPOTrainer


def state_file(folder: str | Path, process_index: int) -> Path:
    """Where process `process_index` keeps its C-GRPO state inside checkpoint `folder`."""
    return Path(folder) / f"cgrpo_state_{process_index}.json"


def save_state(trainer: CGRPOTrainer, folder: str | Path) -> None:
    """Write this process's C-GRPO state into checkpoint `folder`."""
    version, internal, gauss = trainer._rng.getstate()
    state = {
        "thresholds": None if trainer.thresholds is None else trainer.thresholds.to_dict(),
        "last_calibration_step": trainer._last_calibration_step,
        "calibration_history": trainer.calibration_history,
        "totals": trainer.cgrpo_totals,
        "budget_histogram": {str(k): n for k, n in trainer.budget_histogram.items()},
        "unlogged_calibration_rollouts": trainer._unlogged_calibration_rollouts,
        "stopping_rng": [version, list(internal), gauss],
    }
    path = state_file(folder, trainer.accelerator.process_index)
    path.write_text(json.dumps(state, indent=1) + "\n")


def load_state(trainer: CGRPOTrainer, folder: str | Path) -> None:
    """Restore this process's C-GRPO state from checkpoint `folder`, written by :func:`save_state`."""
    path = state_file(folder, trainer.accelerator.process_index)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing, so the checkpoint holds no C-GRPO state; resume from a checkpoint a CGRPOTrainer "
            "saved with save_only_model=False, or start the run afresh."
        )
    state = json.loads(path.read_text())
    trainer.thresholds = None if state["thresholds"] is None else Thresholds.from_dict(state["thresholds"])
    trainer._last_calibration_step = state["last_calibration_step"]
    trainer.calibration_history = [_history_record(record) for record in state["calibration_history"]]
    trainer.cgrpo_totals.update(state["totals"])
    trainer.budget_histogram.clear()
    trainer.budget_histogram.update({int(k): n for k, n in state["budget_histogram"].items()})
    trainer._unlogged_calibration_rollouts = state["unlogged_calibration_rollouts"]
    version, internal, gauss = state["stopping_rng"]
    trainer._rng.setstate((version, tuple(internal), gauss))


def _history_record(record: dict[str, Any]) -> dict[str, Any]:
    # JSON turned the budgets into strings; the live history keys them by int, as Thresholds.to_dict does.
    return {**record, "qhat": {int(k): v for k, v in record["qhat"].items()}}
