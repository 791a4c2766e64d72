"""A learning-rate schedule driven by a rollout budget: the learning rate of every optimizer step is a function of the
share of the budget spent, not of the step's place among `max_steps`.

transformers' schedules decay over `max_steps`. Under a rollout budget the steps a run takes depend on how many
rollouts each step draws: GRPO at G = 4 takes half the steps of G = 2, and a stopping rule an unknown number, so a
schedule over `max_steps` anneals one method to zero at the budget and leaves another near its peak.
`BudgetLRSchedule` reads the rollouts the budget counts (`RolloutBudget`, calibration included where the budget
includes it) before every optimizer step, so two runs that spent the same share of the budget train at the same
learning rate, however their steps drew it:

    budget = RolloutBudget(trainer, max_rollouts=4_096)
    trainer.add_callback(budget)
    trainer.add_callback(BudgetLRSchedule(budget, shape="cosine", warmup_share=0.05))
    trainer.train()

It works with TRL's `GRPOTrainer` and every subclass, and replaces the trainer's own scheduler when training begins
(`lr_scheduler_type` is then unused). The share is read where the update is about to be made, so an update trains at
the share of the rollouts it learns from; TRL generates once per generation batch, so the learning rate moves in steps
of one generation batch's share. It keeps no state of its own: a run resumed from a checkpoint restores its rollout
count, and with it the learning rate.
"""

from __future__ import annotations

import math
from typing import Any

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from transformers import TrainerCallback

from .budget import RolloutBudget, rollouts_generated

__all__ = ["SHAPES", "BudgetLRSchedule", "budget_lr_factor"]

SHAPES = ("linear", "cosine", "constant")


def budget_lr_factor(share: float, shape: str = "linear", warmup_share: float = 0.0, end_factor: float = 0.0) -> float:
    """The learning rate's multiple of its peak once `share` of the budget is spent.

    A linear warmup from 0 to 1 over the first `warmup_share` (below 1), then `shape` from 1 down to `end_factor` at the
    budget: ``linear``, ``cosine`` (half a cosine wave) or ``constant`` (1 throughout, `end_factor` unused). Shares past
    the budget (a run ends at the first generation-batch boundary past it) keep the budget's value.
    """
    share = min(max(share, 0.0), 1.0)
    if share < warmup_share:
        return share / warmup_share
    if shape == "constant":
        return 1.0
    progress = (share - warmup_share) / (1.0 - warmup_share)
    if shape == "linear":
        return 1.0 - (1.0 - end_factor) * progress
    return end_factor + (1.0 - end_factor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class _ShareScheduler(LRScheduler):
    """Each parameter group's peak learning rate times `factor()`, whatever the step counter says."""

    def __init__(self, optimizer: Optimizer, factor):
        self._factor = factor
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        return [base * self._factor() for base in self.base_lrs]

    def state_dict(self) -> dict[str, Any]:
        # What a checkpoint saves: not the factor, which holds the trainer (and its hooks, which do not pickle); the
        # rollouts a resumed run restores give the learning rate back. A resume loads it into the scheduler the trainer
        # builds first, transformers' LambdaLR, which expects its (here empty) lambdas' state.
        state = {key: value for key, value in super().state_dict().items() if key != "_factor"}
        return {**state, "lr_lambdas": [None] * len(self.base_lrs)}

    def refresh(self) -> None:
        """Set every group's learning rate from the share now, without a step (which, before the optimizer's first,
        PyTorch would take for a schedule stepped out of order)."""
        self._last_lr = self.get_lr()
        for group, rate in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = rate


class BudgetLRSchedule(TrainerCallback):
    """Set the learning rate from the share of `budget.max_rollouts` spent, before every optimizer step.

    Args:
        budget: the run's `RolloutBudget` (added to the same trainer), whose `max_rollouts` and `include_calibration`
            define the share: rollouts counted as the budget counts them, over its total.
        shape: ``linear``, ``cosine`` or ``constant`` after the warmup.
        warmup_share: the share of the budget over which the learning rate rises linearly from 0 to its peak.
        end_factor: the learning rate at the budget, as a multiple of the peak (0 anneals to zero).

    The peak is the trainer's `learning_rate`. The learning rate of each update is logged as TRL logs it
    (`learning_rate`).
    """

    def __init__(
        self, budget: RolloutBudget, shape: str = "linear", warmup_share: float = 0.0, end_factor: float = 0.0
    ):
        _check_schedule(budget, shape, warmup_share, end_factor)
        self.budget, self.shape = budget, shape
        self.warmup_share, self.end_factor = float(warmup_share), float(end_factor)

    def share(self) -> float:
        """The share of the budget spent so far, as the budget counts rollouts."""
        # Read inside an optimizer step (or as training begins, before the first): the step's rollouts count.
        spent = rollouts_generated(self.budget.trainer, self.budget.include_calibration, in_step=True)
        return spent / self.budget.max_rollouts

    def factor(self) -> float:
        """The learning rate's multiple of its peak now."""
        return budget_lr_factor(self.share(), self.shape, self.warmup_share, self.end_factor)

    def on_train_begin(self, args, state, control, **kwargs):
        # The trainer built its scheduler over max_steps before this event; the budget's replaces it for every step
        # from here on (the training loop reads `trainer.lr_scheduler` at each step).
        trainer = self.budget.trainer
        trainer.lr_scheduler = _ShareScheduler(trainer.optimizer, self.factor)
        return control

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        # The step's generation has happened by now, so the update trains at the share that includes its rollouts;
        # the trainer's own scheduler step after the update reads the same share.
        self.budget.trainer.lr_scheduler.refresh()
        return control


def _check_schedule(budget, shape, warmup_share, end_factor) -> None:
    """One sentence per bad argument, before training starts."""
    if not isinstance(budget, RolloutBudget) or budget.max_rollouts is None:
        raise ValueError(
            "BudgetLRSchedule spreads the learning rate over a rollout budget: pass the RolloutBudget (with "
            "max_rollouts set) that ends the same trainer's training."
        )
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}.")
    if not 0.0 <= warmup_share < 1.0:
        raise ValueError(f"warmup_share must lie in [0, 1), a share of the budget, got {warmup_share!r}.")
    if not 0.0 <= end_factor <= 1.0:
        raise ValueError(f"end_factor must lie in [0, 1], a multiple of the peak learning rate, got {end_factor!r}.")
