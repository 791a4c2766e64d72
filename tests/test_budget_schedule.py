"""`BudgetLRSchedule`: the learning rate follows the share of a rollout budget spent, not the step count, so trainers
whose steps draw different numbers of rollouts train at the same learning rate at the same share, and every run ends at
`end_factor` times the peak at the budget; bad values are refused with one sentence."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_budget import _data
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from cgrpo import BudgetLRSchedule, CGRPOConfig, CGRPOTrainer, RolloutBudget
from cgrpo.budget import rollouts_generated
from cgrpo.budget_schedule import budget_lr_factor

PEAK = 1e-3
BUDGET = 96


def _reward(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


def _common(tmp_path) -> dict:
    return dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        max_completion_length=4,
        max_steps=500,
        learning_rate=PEAK,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
    )


class LearningRates(TrainerCallback):
    """The learning rate of every update, beside the budget share the update trained at."""

    def __init__(self, budget: RolloutBudget):
        self.budget, self.points = budget, []

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        spent = rollouts_generated(self.budget.trainer, self.budget.include_calibration, in_step=True)
        self.points.append((spent / self.budget.max_rollouts, optimizer.param_groups[0]["lr"]))


def _train(trainer, **schedule) -> tuple[list[tuple[float, float]], float]:
    """Train `trainer` to the budget under the schedule; the (share, learning rate) of every update and the rollouts of
    one generation batch."""
    budget = RolloutBudget(trainer, max_rollouts=BUDGET)
    rates = LearningRates(budget)
    for callback in (budget, BudgetLRSchedule(budget, **schedule), rates):
        trainer.add_callback(callback)
    trainer.train()
    assert budget.stopped_at_step is not None
    return rates.points, trainer.args.generation_batch_size


def _grpo(model_dir, tmp_path, num_generations: int) -> GRPOTrainer:
    # Four prompts a generation batch: 8 rollouts a batch at G = 2, 16 at G = 4, so G = 2 takes twice the steps.
    args = GRPOConfig(
        per_device_train_batch_size=2 * num_generations,
        steps_per_generation=2,
        num_generations=num_generations,
        **_common(tmp_path),
    )
    return GRPOTrainer(model=model_dir, reward_funcs=_reward, args=args, train_dataset=_data(64))


@pytest.mark.slow
def test_two_group_sizes_train_at_the_same_learning_rate_at_the_same_budget_share(tiny_model_dir, tmp_path):
    small, small_batch = _train(_grpo(tiny_model_dir, tmp_path / "g2", 2))
    large, large_batch = _train(_grpo(tiny_model_dir, tmp_path / "g4", 4))
    assert len(small) == 2 * len(large)
    # The rate is a function of the share alone: both runs' updates lie on one linear decay from the peak...
    for share, rate in small + large:
        assert rate == pytest.approx(PEAK * (1 - min(share, 1.0)), rel=1e-6)
    # ...so at any share G = 4 reaches, G = 2 trains at the same rate within one generation batch's share of decay.
    shares, rates = zip(*small)
    tolerance = PEAK * max(small_batch, large_batch) / BUDGET
    for share, rate in large:
        assert abs(np.interp(share, shares, rates) - rate) <= tolerance
    # Both end at the budget at end_factor (0 here) times the peak, where a decay over max_steps would not.
    assert small[-1][1] == large[-1][1] == 0.0


@pytest.mark.slow
def test_a_stopping_rule_counts_its_calibration_in_the_share_and_ends_at_the_end_factor(tiny_model_dir, tmp_path):
    args = CGRPOConfig(
        budget_grid=[2, 4],
        per_device_train_batch_size=8,
        min_generation_prompts=2,
        recalibrate_every=0,
        num_calibration_samples=4,
        **_common(tmp_path),
    )
    trainer = CGRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=_reward,
        args=args,
        train_dataset=_data(64),
        calibration_dataset=_data(8, offset=100),
        answer_extractor=lambda text: text.strip()[:1] or None,
    )
    points, _ = _train(trainer, shape="cosine", warmup_share=0.0, end_factor=0.1)
    # The calibration's 4 prompts x 4 samples count before the first update.
    assert points[0][0] > 16 / BUDGET
    for share, rate in points:
        expected = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(share, 1.0)))
        assert rate == pytest.approx(PEAK * expected, rel=1e-6)
    assert points[-1][0] >= 1.0 and points[-1][1] == pytest.approx(0.1 * PEAK)


@pytest.mark.slow
def test_a_run_resumed_from_a_checkpoint_trains_at_the_learning_rates_of_an_uninterrupted_one(tiny_model_dir, tmp_path):
    # Checkpoints save the scheduler's state (the share is read from the trainer, which must not be pickled with it),
    # and a resumed run reads its share from the rollouts its checkpoint restores.
    def trainer(folder, **overrides):
        args = GRPOConfig(
            per_device_train_batch_size=4,
            steps_per_generation=2,
            num_generations=2,
            **{**_common(tmp_path / folder), "save_strategy": "steps", "save_steps": 4, **overrides},
        )
        return GRPOTrainer(model=tiny_model_dir, reward_funcs=_reward, args=args, train_dataset=_data(64))

    def scheduled(run) -> LearningRates:
        budget = RolloutBudget(run, max_rollouts=BUDGET)
        rates = LearningRates(budget)
        for callback in (budget, BudgetLRSchedule(budget), rates):
            run.add_callback(callback)
        return rates

    whole, _ = _train(trainer("whole"))
    stopped = trainer("stopped", max_steps=4)
    scheduled(stopped)
    stopped.train()
    resumed = trainer("resumed")
    rates = scheduled(resumed)
    resumed.train(resume_from_checkpoint=str(tmp_path / "stopped" / "checkpoint-4"))
    assert len(whole) > 4 and rates.points == pytest.approx(whole[4:])


@pytest.mark.parametrize(
    ("share", "shape", "warmup", "end", "expected"),
    [
        (0.05, "linear", 0.1, 0.0, 0.5),
        (0.1, "linear", 0.1, 0.0, 1.0),
        (0.55, "linear", 0.1, 0.0, 0.5),
        (1.4, "linear", 0.1, 0.2, 0.2),
        (0.5, "cosine", 0.0, 0.0, 0.5),
        (1.0, "cosine", 0.0, 0.3, 0.3),
        (0.9, "constant", 0.0, 0.0, 1.0),
    ],
)
def test_the_factor_warms_up_then_follows_its_shape_to_the_end_factor(share, shape, warmup, end, expected):
    assert budget_lr_factor(share, shape, warmup, end) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shape": "step"}, "shape must be one of"),
        ({"warmup_share": 1.0}, "warmup_share must lie in"),
        ({"end_factor": 1.5}, "end_factor must lie in"),
    ],
)
def test_bad_schedules_are_refused_in_one_sentence(tiny_model_dir, tmp_path, kwargs, message):
    budget = RolloutBudget(_grpo(tiny_model_dir, tmp_path, 2), max_rollouts=BUDGET)
    with pytest.raises(ValueError, match=message):
        BudgetLRSchedule(budget, **kwargs)


def test_a_budget_without_a_rollout_total_is_refused(tiny_model_dir, tmp_path):
    budget = RolloutBudget(_grpo(tiny_model_dir, tmp_path, 2), max_seconds=10.0)
    with pytest.raises(ValueError, match="max_rollouts set"):
        BudgetLRSchedule(budget)
