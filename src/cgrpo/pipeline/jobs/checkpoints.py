"""Checkpoints of a pipeline training run: a killed job resumes from its last one, never from another config's.

A run's checkpoints live in `<run>/checkpoints/`, outside the rule's outputs, so that Snakemake's cleanup of a failed
or incomplete job keeps them. `spec.json` there records the spec they were trained with; checkpoints of any other spec
are discarded. A checkpoint is complete once `run_totals.json`, written after everything TRL and C-GRPO save, is in
it. The folder is removed when the run has finished.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from ...costs import cpu_seconds, generation_span
from ..configuration.specs import TrainSpec

logger = logging.getLogger(__name__)

SPEC_FILE = "spec.json"
TOTALS_FILE = "run_totals.json"


def resume_point(folder: str | Path, spec: TrainSpec) -> str | None:
    """The latest complete checkpoint in `folder` trained with `spec`, or None to start afresh.

    Checkpoints recorded for another spec (a changed config under the same run name) are deleted first.
    """
    folder = Path(folder)
    wanted = json.dumps(spec.to_dict(), sort_keys=True)
    if folder.exists() and _recorded_spec(folder) != wanted:
        logger.info("Discarding the checkpoints in %s: they were trained with another configuration.", folder)
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SPEC_FILE).write_text(wanted + "\n")
    complete = [path for path in folder.glob("checkpoint-*") if (path / TOTALS_FILE).is_file()]
    if not complete:
        return None
    latest = max(complete, key=lambda path: int(path.name.rsplit("-", 1)[1]))
    logger.info("Run %s resumes from %s.", spec.run, latest)
    return str(latest)


def _recorded_spec(folder: Path) -> str | None:
    recorded = folder / SPEC_FILE
    return json.dumps(json.loads(recorded.read_text()), sort_keys=True) if recorded.is_file() else None


def align_save_steps(args) -> None:
    """Round `args.save_steps` up to whole generation batches, so that every checkpoint is a point a run can resume at.

    TRL generates one batch for `steps_per_generation * num_iterations` micro-steps and keeps it in memory only; a run
    resumed inside that span would draw a different batch than the uninterrupted run did. An optimizer step is
    `gradient_accumulation_steps` micro-steps, and only CGRPOConfig makes one span a whole number of them.
    """
    if args.save_strategy != "steps" or args.save_steps < 1:
        return
    span = generation_span(args.steps_per_generation, args.num_iterations, args.gradient_accumulation_steps)
    aligned = math.ceil(args.save_steps / span) * span
    if aligned != args.save_steps:
        logger.info(
            "Checkpoints every %d steps (save_steps %d rounded up to a multiple of %d, whole generation batches).",
            aligned,
            args.save_steps,
            span,
        )
        args.save_steps = aligned


class ResumableTotals(TrainerCallback):
    """Training seconds (wall clock and CPU), and the baseline's generation totals, carried across a resume in every
    checkpoint.

    A run resumed from a checkpoint reports the seconds trained up to that checkpoint plus the seconds after it; the
    work lost between the checkpoint and the kill is not counted, as it is not part of the finished run.
    """

    def __init__(self, trainer, resume_from: str | None):
        self.trainer = trainer
        self.before, self.cpu_before = 0.0, 0.0
        if resume_from is not None:
            saved = json.loads((Path(resume_from) / TOTALS_FILE).read_text())
            self.before, self.cpu_before = saved["train_wall_s"], saved["train_cpu_s"]
            if saved["generation_totals"] is not None:
                trainer.generation_totals.update(saved["generation_totals"])
        self.started, self.cpu_started = time.perf_counter(), cpu_seconds()

    def elapsed(self) -> float:
        """Seconds of training in this run, across resumes."""
        # This run's part first: added to `before` it is never below it, which (before + now) - started can be.
        return self.before + (time.perf_counter() - self.started)

    def cpu_elapsed(self) -> float:
        """CPU seconds of training in this run (this process and its ended children), across resumes."""
        return self.cpu_before + (cpu_seconds() - self.cpu_started)

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            totals: dict[str, Any] = {
                "train_wall_s": self.elapsed(),
                "train_cpu_s": self.cpu_elapsed(),
                "generation_totals": getattr(self.trainer, "generation_totals", None),
            }
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}" / TOTALS_FILE
            path.write_text(json.dumps(totals, indent=1) + "\n")
        return control
