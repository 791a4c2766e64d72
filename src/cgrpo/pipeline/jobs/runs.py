"""Pipeline steps around training: the initial calibration and one C-GRPO, fixed-group GRPO or DAPO training run.

Each step takes its typed spec from `cgrpo.pipeline.configuration.specs` (or the same as a plain dict, as Snakemake hands it over)
and writes its outputs into a folder; both load models, data and reward functions exactly as a user's script would.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import pandas as pd
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ...budget import MILESTONES_FILE, RolloutBudget
from ...budget_schedule import BudgetLRSchedule
from ...calibration import fit_thresholds
from ...costs import (
    cpu_seconds,
    rollout_savings,
    rollout_savings_with_calibration,
    rollouts_per_prompt,
)
from ...support.learning_signal import signal_summary
from ..configuration.methods import METHODS, parse_run_name
from ..configuration.specs import CalibrationSpec, TrainSpec, format_grid
from . import trainers
from .checkpoints import SPEC_FILE, ResumableTotals, align_save_steps, resume_point
from .timing import generation_seconds

logger = logging.getLogger(__name__)

# The folder of a budgeted run's milestone models, in the run's folder.
MILESTONES = "milestones"
# Logged by TRL at the end of training rather than per step; kept out of the per-step table.
_SUMMARY_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss", "total_flos")


def calibrate_initial(spec: CalibrationSpec | dict[str, Any], out_dir: str | Path) -> None:
    """Score the calibration split with the initial policy for one budget grid and fit its thresholds.

    Writes `thresholds.json` (the per-budget scores, so training can refit them for any delta, the automatic-delta
    thresholds, and the cost) and `thresholds.csv` (one row per budget).
    """
    spec = CalibrationSpec.from_dict(spec)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    trainer = trainers.calibration_trainer(spec, out_dir / "trainer")
    trainer.model.train()
    # Timed like a calibration inside training: loading the model is this rule's overhead, not calibration cost.
    start, cpu_start = time.perf_counter(), cpu_seconds()
    scores, rollouts, tokens = trainer.score_calibration_set()
    args = trainer.args
    auto = fit_thresholds(scores, None, args.delta_margin, args.split_delta)
    # A diagnostic after the timed calibration: the automatic thresholds' coverage on held-out prompts.
    holdout = trainer.holdout_coverage(auto) if args.calibration_holdout else None
    record = {
        "budget_grid": args.budget_grid,
        "scores": {str(k): v for k, v in scores.items()},
        "auto": auto.to_dict(),
        "rollouts": rollouts,
        "tokens": tokens,
        "wall_s": time.perf_counter() - start,
        "cpu_s": cpu_seconds() - cpu_start,
        "holdout": holdout,
        "prompt_set": trainer.calibration_prompt_set,
    }
    (out_dir / "thresholds.json").write_text(json.dumps(record, indent=1) + "\n")
    pd.DataFrame(
        {
            "k": list(auto.qhat),
            "qhat": list(auto.qhat.values()),
            "delta": auto.delta,
            "solve_rate": auto.solve_rate,
            "mean_score": [sum(scores[k]) / len(scores[k]) for k in auto.qhat],
        }
    ).to_csv(out_dir / "thresholds.csv", index=False)


def train_run(spec: TrainSpec | dict[str, Any], out_dir: str | Path) -> None:
    """Train one run (`spec.method` names one of `cgrpo.pipeline.configuration.methods.METHODS`) and write `model/`, `steps.csv` and `run.json`."""
    spec = TrainSpec.from_dict(spec)
    out_dir = Path(out_dir)
    if spec.method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {spec.method!r}.")
    method = METHODS[spec.method]
    initial = _initial_calibration(spec) if method.calibrated else None
    checkpoints = out_dir / "checkpoints"
    resume = resume_point(checkpoints, spec)
    trainer = getattr(trainers, method.trainer)(spec, checkpoints, initial)
    align_save_steps(trainer.args)
    totals = ResumableTotals(trainer, resume)
    trainer.add_callback(totals)
    budget = _rollout_budget(trainer, spec, out_dir / MILESTONES, resume, totals) if spec.budget else None
    trainer.train(resume_from_checkpoint=resume)
    wall, cpu = totals.elapsed(), totals.cpu_elapsed()
    trainer.save_model(str(out_dir / "model"))
    trainer.create_model_card(model_name=spec.run)
    shutil.move(checkpoints / "README.md", out_dir / "model" / "README.md")
    _steps_table(trainer.state.log_history).to_csv(out_dir / "steps.csv", index=False)
    record = _run_record(spec, trainer, wall, cpu, initial)
    if budget is not None:
        record["budget"] = _budget_record(spec, budget, out_dir)
    # run.json last: it is what marks the run finished; its checkpoints are then of no further use.
    (out_dir / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    _keep_tracker_files(checkpoints, out_dir / "logs")
    shutil.rmtree(checkpoints)
    logger.info("Run %s: %s", spec.run, {k: v for k, v in record.items() if k != "calibrations"})


def _rollout_budget(trainer, spec: TrainSpec, folder: Path, resume: str | None, totals) -> RolloutBudget:
    """The run's rollout budget and milestone snapshots in `folder`; resumed, the milestones kept up to the
    checkpoint (the steps after it are trained again, the same way) and the seconds trained before it."""
    budget = RolloutBudget(
        trainer,
        spec.budget["rollouts"],
        include_calibration=spec.budget["include_calibration"],
        milestones=spec.budget["milestones"],
        save_milestones_to=folder,
    )
    # Every method anneals over the share of the budget it spent, not over its max_steps (which only bounds it).
    trainer.add_callback(BudgetLRSchedule(budget, **spec.budget["lr_schedule"]))
    if resume is None:
        shutil.rmtree(folder, ignore_errors=True)
    elif (folder / MILESTONES_FILE).is_file():
        step = int(Path(resume).name.rpartition("-")[2])
        kept = json.loads((folder / MILESTONES_FILE).read_text())
        budget.resume([m for m in kept if m["step"] <= step], totals.cpu_before, totals.before)
    trainer.add_callback(budget)
    return budget


def _budget_record(spec: TrainSpec, budget: RolloutBudget, out_dir: Path) -> dict[str, Any]:
    """The budget, where training stopped, and every milestone kept: its step, rollouts (as budgeted, and training
    alone), the training's CPU and wall seconds up to it (across a resume) and its model folder in the run."""
    milestones = [
        {
            **{key: value for key, value in kept.items() if key != "path"},
            "model": str(Path(kept["path"]).relative_to(out_dir)),
        }
        for kept in budget.milestones_kept
    ]
    return {**spec.budget, "stopped_at_step": budget.stopped_at_step, "milestones": milestones}


def reuse_compute_matched(source_dir: str | Path, out_dir: str | Path) -> None:
    """Write a compute-matched GRPO run as a copy of the finished fixed-G run with the same group size.

    Training is deterministic and the two runs' specs differ only in their names, so training again would
    reproduce `source_dir` exactly; the copy's `run.json` says it is compute-matched and where it came from.
    """
    source_dir, out_dir = Path(source_dir), Path(out_dir)
    record = json.loads((source_dir / "run.json").read_text())
    if record["method"] != "grpo" or record["compute_matched"]:
        raise ValueError(
            f"{source_dir} is not a fixed-G GRPO run; reuse only copies one of the configured fixed-G runs."
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source_dir / "model", out_dir / "model", dirs_exist_ok=True)
    shutil.copyfile(source_dir / "steps.csv", out_dir / "steps.csv")
    record.update(run=out_dir.name, compute_matched=True, reused_from=record["run"])
    # run.json last: it is what marks the run finished.
    (out_dir / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    logger.info("Run %s reuses %s: same group size, same deterministic training.", out_dir.name, source_dir.name)


def _keep_tracker_files(checkpoints: Path, logs: Path) -> None:
    """Copy what the trainer wrote beside its checkpoints into `logs`, before the checkpoints folder goes.

    That is where `report_to` trackers write by default (TensorBoard's `runs/<date>_<host>/` event files: a resumed run
    adds a folder); the checkpoints, the spec they were trained with and the model card (already in `model/`) stay
    behind.
    """
    for entry in checkpoints.iterdir():
        if entry.name.startswith(PREFIX_CHECKPOINT_DIR) or entry.name in (SPEC_FILE, "README.md"):
            continue
        logs.mkdir(exist_ok=True)
        if entry.is_dir():
            shutil.copytree(entry, logs / entry.name, dirs_exist_ok=True)
        else:
            shutil.copy2(entry, logs / entry.name)


# ---------------------------------------------------------------------- initial calibration
def _initial_calibration(spec: TrainSpec) -> dict[str, Any]:
    """Thresholds for this run's delta, refitted from the initial policy's calibration scores."""
    record = json.loads(Path(spec.initial_calibration).read_text())
    if record["budget_grid"] != sorted(spec.budget_grid):
        raise ValueError(
            f"{spec.initial_calibration} was fitted for grid {record['budget_grid']}, not {spec.budget_grid}; "
            "point initial_calibration at the calibration of the same grid."
        )
    scores = {int(k): v for k, v in record["scores"].items()}
    delta = None if spec.delta == "auto" else float(spec.delta)
    thresholds = fit_thresholds(scores, delta, spec.cgrpo["delta_margin"], spec.cgrpo["split_delta"])
    return {"thresholds": thresholds, **record}


# ---------------------------------------------------------------------- accounting
def _steps_table(log_history: list[dict[str, Any]]) -> pd.DataFrame:
    rows = [entry for entry in log_history if "loss" in entry and not any(key in entry for key in _SUMMARY_KEYS)]
    if not rows:
        # No step was logged (logging_steps > max_steps); the header keeps steps.csv readable.
        return pd.DataFrame(columns=["step"])
    table = pd.DataFrame(rows)
    # Sorted columns: a resumed run's early entries come back from its checkpoint with their keys sorted.
    return table[["step", *sorted(c for c in table.columns if c != "step")]]


def _run_record(spec: TrainSpec, trainer, wall: float, cpu: float, initial: dict | None) -> dict[str, Any]:
    # C-GRPO and its ablations sample along a grid; C-GRPO starts from the pipeline's initial calibration.
    budgeted, calibrated = spec.budget_grid is not None, initial is not None
    width = trainer.args.num_generations
    reference = int(spec.reference_budget)
    # DAPO's, and C-GRPO's with drop_unanimous; None for the others.
    dynamic = getattr(trainer, "dynamic_totals", None)
    totals = trainer.generation_totals
    # The held-out coverage check of in-run calibrations (C-GRPO's `calibration_holdout`) is a diagnostic, not a cost.
    wall, cpu = wall - totals.get("holdout_s", 0.0), cpu - totals.get("holdout_cpu_s", 0.0)
    # Throwaway rows that keep processes in lockstep are generated compute too.
    lockstep = int(totals.get("lockstep_rollouts", 0))
    rollouts, tokens = int(totals["train_rollouts"]) + lockstep, int(totals["train_tokens"])
    groups = int(totals["groups"]) if budgeted else rollouts // width
    # Every calibration is a cost: C-GRPO's initial one (its own rule, before `train`), and those the trainer ran, C-GRPO's
    # recalibrations or a calibrated stopping rule's own (the signal rule fits itself when training starts).
    initial_records = [_initial_record(initial, spec.delta)] if calibrated else []
    calibrations = [*initial_records, *trainer.calibration_history] if budgeted else []
    if dynamic is not None:
        # Per trained prompt: the groups dynamic sampling dropped were generated for the ones it trained on.
        groups = int(dynamic["groups_kept"] + dynamic["groups_zero_variance_trained"])
    calibration_rollouts = sum(c["rollouts"] for c in calibrations)
    calibration_wall = sum(c["wall_s"] for c in calibrations)
    in_run_calibration = sum(c["wall_s"] for c in calibrations[len(initial_records) :])
    # The pipeline's initial calibration runs in its own rule, before `train`: it is part of the run's cost.
    initial_calibration = sum(c["wall_s"] for c in initial_records)
    initial_calibration_cpu = sum(c["cpu_s"] for c in initial_records)
    return {
        "run": spec.run,
        "method": spec.method,
        "seed": spec.seed,
        "num_generations": width,
        "budget_grid": format_grid(spec.budget_grid) if budgeted else None,
        "delta": spec.delta if calibrated else None,
        "recalibrate_every": spec.recalibrate_every if calibrated else None,
        "stopping_rule": trainer.args.stopping_rule if budgeted else None,
        "stop_share": trainer.args.stop_share if budgeted and trainer.args.stopping_rule == "share" else None,
        "stop_setting": trainer.stopping_rule.setting()
        if budgeted and trainer.args.stopping_rule != "conformal"
        else None,
        "drop_unanimous": dynamic is not None if budgeted else None,
        "compute_matched": spec.compute_matched,
        # The peak learning rate, and its multiple of the method's own in a learning-rate sweep.
        "learning_rate": trainer.args.learning_rate,
        "learning_rate_factor": parse_run_name(spec.run).lr_factor,
        "reference_budget": reference,
        "steps": trainer.state.global_step,
        "groups": groups,
        "steps_per_generation": trainer.args.steps_per_generation,
        "train_budget_histogram": _budget_histogram(trainer) if budgeted else {str(width): groups},
        "train_rollouts_generated": rollouts,
        "lockstep_rollouts_generated": lockstep,
        "train_tokens_generated": tokens,
        "calibration_rollouts_generated": calibration_rollouts,
        "calibration_tokens_generated": sum(c["tokens"] for c in calibrations),
        "train_mean_k": rollouts / groups,
        "train_rollout_savings": rollout_savings(rollouts, groups, reference),
        "train_rollout_savings_with_calibration": rollout_savings_with_calibration(
            rollouts, calibration_rollouts, groups, reference
        ),
        "rollouts_per_prompt": rollouts_per_prompt(rollouts, calibration_rollouts, groups),
        "train_wall_s": wall,
        "generation_wall_s": generation_seconds(trainer),
        "update_wall_s": wall - generation_seconds(trainer) - in_run_calibration,
        "calibration_wall_s": calibration_wall,
        "total_wall_s": wall + initial_calibration,
        # The wall clock's twin that the neighbouring jobs do not move: training (in-run calibrations included) and
        # the initial calibration, in CPU seconds of the job's process and its children.
        "train_cpu_s": cpu,
        "total_cpu_s": cpu + initial_calibration_cpu,
        "calibrations": calibrations,
        # Dynamic sampling: every group sampled counts above; what it kept, dropped and how many rounds it took.
        "dynamic": None if dynamic is None else dict(dynamic),
        "group_weighting": getattr(trainer.args, "group_weighting", "tokens"),
        # A prompt allocator's settings and what it did (prompts skipped, refilled, skipped prompts drawn again).
        **_allocation_fields(trainer),
        # What the batches offered the policy gradient (`cgrpo.support.learning_signal`).
        **signal_summary(totals),
        # The system message and worked examples every prompt showed, as trained on.
        "prompt": trainers.task_of(spec).prompt_record(),
    }


def _allocation_fields(trainer) -> dict[str, Any]:
    """The record's allocator fields, only for a run with a prompt allocator (other records stay as they were)."""
    totals = getattr(trainer, "allocation_totals", None)
    if totals is None:
        return {}
    args = trainer.args
    return {
        "prompt_allocator": args.prompt_allocator,
        "allocator_options": dict(args.allocator_options or {}),
        "allocation_rollouts_per_prompt": args.allocation_rollouts_per_prompt,
        "allocation": dict(totals),
    }


def _budget_histogram(trainer) -> dict[str, int]:
    return {str(k): trainer.budget_histogram[k] for k in sorted(trainer.budget_histogram)}


def _initial_record(initial: dict[str, Any], delta) -> dict[str, Any]:
    # The calibrate rule checked the automatic thresholds on held-out prompts; a fixed delta's are others.
    holdout = initial["holdout"] if delta == "auto" else None
    return {
        "step": 0,
        **initial["thresholds"].to_dict(),
        "rollouts": initial["rollouts"],
        "tokens": initial["tokens"],
        "wall_s": initial["wall_s"],
        "cpu_s": initial["cpu_s"],
        "prompt_set": initial.get("prompt_set"),
        "initial": True,
        **({"holdout": holdout} if holdout else {}),
    }
