"""A compute budget for any GRPO trainer: end training when the rollouts it generated (or the seconds it spent) reach a
number, and keep the model at rollout milestones along the way, so that methods are compared at equal cost.

`RolloutBudget` is a `transformers.TrainerCallback`. It works with TRL's `GRPOTrainer` and with the project's
trainers (`CGRPOTrainer`, `DynamicSamplingGRPOTrainer`), whose rollouts per generation batch vary:

    trainer = CGRPOTrainer(...)
    trainer.add_callback(RolloutBudget(trainer, max_rollouts=20_000, milestones=[5_000, 10_000, 20_000],
                                       save_milestones_to="milestones"))
    trainer.train()

Rollouts count when they are generated, every one of them (a stopped prompt's, a dropped group's, a throwaway
lockstep row's), and with `include_calibration` C-GRPO's calibration rollouts too, its initial calibration included.
A generation batch serves `steps_per_generation * num_iterations` micro-steps, so the budget is checked where one
ends: training stops at the first generation-batch boundary where the rollouts reach the budget, having generated at
most one generation batch more than it. A milestone is kept at the first boundary where the rollouts reach it (one
snapshot serves several milestones crossed by one batch), so that every snapshot's model has trained on every
rollout counted.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from trl import GRPOTrainer

from .costs import cpu_seconds, is_integer

logger = logging.getLogger(__name__)

__all__ = ["CLOCKS", "MILESTONES_FILE", "RolloutBudget", "rollouts_generated"]

CLOCKS = ("cpu", "wall")
# The record of the milestones kept, in `save_milestones_to`.
MILESTONES_FILE = "milestones.json"


def rollouts_generated(trainer: GRPOTrainer, include_calibration: bool = True, *, in_step: bool = False) -> int:
    """Rollouts `trainer` has generated in training (all processes), with its calibrations' if it has any and
    `include_calibration`.

    The project's trainers count them as they generate (`rollouts_generated`); TRL's `GRPOTrainer` generates
    `generation_batch_size` rows at the start of every generation batch, so its count follows from the steps taken:
    with `in_step`, read inside an optimizer step before the trainer counts it, that step's generation is included.
    """
    own = getattr(trainer, "rollouts_generated", None)
    if own is not None:
        return int(own(include_calibration))
    args = trainer.args
    micro_steps = (trainer.state.global_step + int(in_step)) * args.gradient_accumulation_steps
    return math.ceil(micro_steps / _generate_every(args)) * args.generation_batch_size


def _generate_every(args) -> int:
    """Micro-steps one generation batch serves (TRL's `generate_every`)."""
    return args.steps_per_generation * args.num_iterations


class RolloutBudget(TrainerCallback):
    """End training at a budget of generated rollouts or seconds, and keep the model at rollout milestones.

    Args:
        trainer: the GRPO trainer to budget (TRL's `GRPOTrainer` or a subclass); its counts are read at every step.
        max_rollouts: end training at the first generation-batch boundary where the rollouts generated reach this;
            None for no rollout budget.
        include_calibration: count C-GRPO's calibration rollouts (initial calibration included) in the budget and the
            milestones; False counts training rollouts only (a calibration amortized over a longer run).
        max_seconds: end training at the first optimizer step after this many seconds of `clock`; None for none.
        clock: `"cpu"` (CPU seconds of this process and its ended children, which neighbouring jobs do not move) or
            `"wall"`, both since training began, or a callable returning seconds (for a clock kept across resumes).
        milestones: rollout counts, increasing, at which to keep the model (at most `max_rollouts`).
        save_milestones_to: folder for the milestone snapshots (`<folder>/<milestone>/`, the model and its
            processing class) and their record (`milestones.json`); None keeps only the record in `milestones_kept`.

    Attributes:
        stopped_at_step (`int | None`): the optimizer step training was ended at by the budget, None if it was not.
        milestones_kept (`list[dict]`): per milestone reached: `milestone`, `step`, `rollouts` (as counted for the
            budget), `train_rollouts`, `learning_rate` (the scheduler's after the step: under `BudgetLRSchedule` the
            step's own), `cpu_s` and `wall_s` (CPU and wall-clock seconds since training began, snapshot saving
            excluded) and `path` (or None). A resumed run may set it to the milestones kept before.

    The stop is logged as `budget/stopped_at_step`, `budget/rollouts` and `budget/seconds`.
    """

    def __init__(
        self,
        trainer: GRPOTrainer,
        max_rollouts: int | None = None,
        *,
        include_calibration: bool = True,
        max_seconds: float | None = None,
        clock: str | Callable[[], float] = "cpu",
        milestones: Sequence[int] = (),
        save_milestones_to: str | Path | None = None,
    ):
        _check_budget(trainer, max_rollouts, max_seconds, clock, milestones)
        self.trainer = trainer
        self.max_rollouts, self.max_seconds = max_rollouts, max_seconds
        self.include_calibration = include_calibration
        self.milestones = [int(m) for m in milestones]
        self.folder = None if save_milestones_to is None else Path(save_milestones_to)
        # Every clock a milestone or the budget reads, with its reading when training began and the seconds spent
        # saving snapshots, which no clock counts.
        self._clocks = {"cpu_s": cpu_seconds, "wall_s": time.perf_counter}
        self._clocks["budget"] = self._clocks[f"{clock}_s"] if isinstance(clock, str) else clock
        self._started = dict.fromkeys(self._clocks, 0.0)
        self._saving = dict.fromkeys(self._clocks, 0.0)
        self._before = dict.fromkeys(self._clocks, 0.0)
        self.stopped_at_step: int | None = None
        self.milestones_kept: list[dict[str, Any]] = []

    def resume(self, milestones_kept: Sequence[Mapping[str, Any]], cpu_s: float, wall_s: float) -> None:
        """Continue a run resumed from a checkpoint: the milestones it had kept up to the checkpoint, and the CPU and
        wall seconds it had trained, which the milestones kept from now on count from."""
        self.milestones_kept = [dict(m) for m in milestones_kept]
        self._before.update(cpu_s=cpu_s, wall_s=wall_s)

    def _elapsed(self, clock: str) -> float:
        return self._before[clock] + self._clocks[clock]() - self._started[clock] - self._saving[clock]

    def seconds(self) -> float:
        """Seconds on the budget's clock since training began, snapshot saving excluded."""
        return self._elapsed("budget")

    def on_train_begin(self, args, state, control, **kwargs):
        self._started = {name: clock() for name, clock in self._clocks.items()}
        self._saving = dict.fromkeys(self._clocks, 0.0)

    def on_step_end(self, args, state, control, **kwargs):
        boundary = state.global_step * args.gradient_accumulation_steps % _generate_every(args) == 0
        out_of_time = self.max_seconds is not None and self.seconds() >= self.max_seconds
        if not (boundary or out_of_time):
            return control
        rollouts = rollouts_generated(self.trainer, self.include_calibration)
        if boundary:
            self._keep_milestones(state.global_step, rollouts)
        if out_of_time or (boundary and self.max_rollouts is not None and rollouts >= self.max_rollouts):
            self._stop(state, control, rollouts)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self.stopped_at_step is None and self.max_rollouts is not None and state.is_world_process_zero:
            rollouts = rollouts_generated(self.trainer, self.include_calibration)
            logger.warning(
                "Training ended at step %d with %d rollouts, before the budget of %d: raise max_steps (or "
                "num_train_epochs) so that the budget, not the step count, ends the run.",
                state.global_step,
                rollouts,
                self.max_rollouts,
            )
        return control

    def _stop(self, state, control, rollouts: int) -> None:
        control.should_training_stop = True
        self.stopped_at_step = state.global_step
        entry = {"budget/stopped_at_step": state.global_step, "budget/rollouts": rollouts}
        entry["budget/seconds"] = self.seconds()
        state.log_history.append({**entry, "step": state.global_step})
        if state.is_world_process_zero:
            logger.info("Budget reached: training ends at step %d (%s).", state.global_step, entry)

    def _keep_milestones(self, step: int, rollouts: int) -> None:
        reached = [m for m in self.milestones[len(self.milestones_kept) :] if rollouts >= m]
        if not reached:
            return
        record = {
            "step": step,
            "rollouts": rollouts,
            "train_rollouts": rollouts_generated(self.trainer, include_calibration=False),
            "learning_rate": _learning_rate(self.trainer),
            "cpu_s": self._elapsed("cpu_s"),
            "wall_s": self._elapsed("wall_s"),
            "path": None,
        }
        if self.folder is not None:
            before = {name: clock() for name, clock in self._clocks.items()}
            record["path"] = str(self.folder / str(reached[0]))
            self.trainer.save_model(record["path"])
            for name, clock in self._clocks.items():
                self._saving[name] += clock() - before[name]
        self.milestones_kept += [{"milestone": milestone, **record} for milestone in reached]
        if self.folder is not None and self.trainer.is_world_process_zero():
            (self.folder / MILESTONES_FILE).write_text(json.dumps(self.milestones_kept, indent=1) + "\n")


def _learning_rate(trainer: GRPOTrainer) -> float:
    """The trainer's learning rate as its scheduler left it after the step (under `BudgetLRSchedule`, the one the step's
    update used: both read the same share of the budget)."""
    scheduler = trainer.lr_scheduler
    return float(scheduler.get_last_lr()[0] if scheduler is not None else trainer.args.learning_rate)


def _check_budget(trainer, max_rollouts, max_seconds, clock, milestones) -> None:
    """One sentence per bad argument, before training starts."""
    if not isinstance(trainer, GRPOTrainer):
        raise TypeError(
            f"RolloutBudget counts a GRPO trainer's rollouts, got {type(trainer).__name__}; pass the GRPOTrainer (or "
            "subclass) it is added to."
        )
    if max_rollouts is None and max_seconds is None and not milestones:
        raise ValueError("RolloutBudget has nothing to do; give max_rollouts, max_seconds or milestones.")
    if max_rollouts is not None and (not is_integer(max_rollouts) or max_rollouts < 1):
        raise ValueError(f"max_rollouts must be a positive integer (rollouts generated), got {max_rollouts!r}.")
    if max_seconds is not None and (
        isinstance(max_seconds, bool) or not isinstance(max_seconds, int | float) or not max_seconds > 0
    ):
        raise ValueError(f"max_seconds must be a positive number of seconds, got {max_seconds!r}.")
    if not callable(clock) and clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)} or a callable returning seconds, got {clock!r}.")
    values = list(milestones)
    if not all(is_integer(m) and m > 0 for m in values) or values != sorted(set(values)):
        raise ValueError(f"milestones must be positive integers in increasing order, got {values!r}.")
    if values and max_rollouts is not None and values[-1] > max_rollouts:
        raise ValueError(
            f"The last milestone {values[-1]} lies beyond max_rollouts {max_rollouts}, where training ends; lower it."
        )
