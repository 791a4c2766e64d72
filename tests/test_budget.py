"""`RolloutBudget`: training ends within one generation batch of a rollout budget, for TRL's `GRPOTrainer` and for
`CGRPOTrainer` (calibration included or not), milestones keep the model where they are reached, and bad values are
refused with one sentence."""

from __future__ import annotations

import json
import random

import pytest
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from cgrpo import CGRPOConfig, CGRPOTrainer, DynamicSamplingConfig, DynamicSamplingGRPOTrainer
from cgrpo.budget import MILESTONES_FILE, RolloutBudget, rollouts_generated

COMMON = dict(
    use_cpu=True,
    bf16=False,
    max_completion_length=4,
    max_steps=200,
    logging_steps=1,
    report_to=[],
    save_strategy="no",
    seed=0,
)


def _data(n: int, offset: int = 0) -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [f"{i}+{i}=" for i in range(offset, offset + n)],
            "answer": [str(2 * i) for i in range(offset, offset + n)],
        }
    )


class CountingReward:
    """A reward that counts the completions it scores: every rollout generated in training passes through it once."""

    __name__ = "counting"

    def __init__(self):
        self.scored = 0

    def __call__(self, completions, **kwargs):
        self.scored += len(completions)
        return [random.Random(c).random() for c in completions]


def _grpo(model_dir, tmp_path, reward) -> GRPOTrainer:
    # Two steps per generation batch of 4 prompts x 4 completions: 16 rollouts a batch.
    args = GRPOConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=8, steps_per_generation=2, num_generations=4, **COMMON
    )
    return GRPOTrainer(model=model_dir, reward_funcs=reward, args=args, train_dataset=_data(64))


def _cgrpo(model_dir, tmp_path, reward, **overrides) -> CGRPOTrainer:
    args = CGRPOConfig(
        output_dir=str(tmp_path),
        budget_grid=[2, 4, 8],
        per_device_train_batch_size=16,
        min_generation_prompts=4,
        recalibrate_every=0,
        num_calibration_samples=4,
        **{**COMMON, **overrides},
    )
    return CGRPOTrainer(
        model=model_dir,
        reward_funcs=reward,
        args=args,
        train_dataset=_data(64),
        calibration_dataset=_data(8, offset=100),
        answer_extractor=lambda text: text.strip()[:1] or None,
    )


def test_grpo_trainer_stops_within_one_generation_batch_of_the_budget(tiny_model_dir, tmp_path):
    reward = CountingReward()
    trainer = _grpo(tiny_model_dir, tmp_path, reward)
    budget = RolloutBudget(trainer, max_rollouts=50, milestones=[20, 40])
    trainer.add_callback(budget)
    trainer.train()
    batch = trainer.args.generation_batch_size
    assert batch == 16
    # The reward functions scored every rollout TRL generated: the count the budget read from the schedule.
    assert reward.scored == rollouts_generated(trainer) == 64
    assert 50 <= reward.scored < 50 + batch
    assert budget.stopped_at_step == trainer.state.global_step == 8
    [stop] = [entry for entry in trainer.state.log_history if "budget/stopped_at_step" in entry]
    assert (stop["budget/stopped_at_step"], stop["budget/rollouts"], stop["step"]) == (8, 64, 8)
    assert [(m["milestone"], m["step"], m["rollouts"]) for m in budget.milestones_kept] == [(20, 4, 32), (40, 6, 48)]


def test_cgrpo_trainer_stops_within_one_generation_batch_counting_its_calibration(tiny_model_dir, tmp_path):
    reward = CountingReward()
    trainer = _cgrpo(tiny_model_dir, tmp_path, reward)
    budget = RolloutBudget(trainer, max_rollouts=120)
    trainer.add_callback(budget)
    trainer.train()
    calibration = trainer.cgrpo_totals["calibration_rollouts"]
    assert calibration == 4 * 8  # num_calibration_samples x max(grid)
    # Every training rollout passed through the reward functions (padded rows never do), after the one empty
    # completion the trainer probes them with before its first calibration.
    assert reward.scored == trainer.cgrpo_totals["train_rollouts"] + 1
    used = reward.scored - 1 + calibration
    assert used == rollouts_generated(trainer) and budget.stopped_at_step == trainer.state.global_step
    # One generation batch of 4 prompts draws at most 4 x 8 rollouts.
    assert 120 <= used < 120 + 4 * 8


def test_excluding_the_calibration_budgets_training_rollouts_alone(tiny_model_dir, tmp_path):
    reward = CountingReward()
    trainer = _cgrpo(tiny_model_dir, tmp_path, reward)
    trainer.add_callback(RolloutBudget(trainer, max_rollouts=120, include_calibration=False))
    trainer.train()
    trained = reward.scored - 1  # less the probe's empty completion
    assert 120 <= trained < 120 + 4 * 8
    assert rollouts_generated(trainer, include_calibration=False) == trained


def test_the_dapo_trainer_counts_every_sampled_group(tiny_model_dir, tmp_path):
    reward = CountingReward()
    args = DynamicSamplingConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        steps_per_generation=1,
        num_generations=4,
        max_sampling_rounds=3,
        allow_short_batch=True,
        **COMMON,
    )
    trainer = DynamicSamplingGRPOTrainer(model=tiny_model_dir, reward_funcs=reward, args=args, train_dataset=_data(64))
    trainer.add_callback(RolloutBudget(trainer, max_rollouts=100))
    trainer.train()
    # Dropped groups were generated and scored too; a generation batch's rounds draw at most 3 x 6 prompts x 4.
    assert reward.scored == rollouts_generated(trainer)
    assert 100 <= reward.scored < 100 + 3 * 6 * 4


def test_milestones_keep_a_loadable_model_and_their_record(tiny_model_dir, tmp_path):
    trainer = _grpo(tiny_model_dir, tmp_path / "out", CountingReward())
    folder = tmp_path / "milestones"
    budget = RolloutBudget(trainer, max_rollouts=32, milestones=[10, 16, 32], save_milestones_to=folder)
    trainer.add_callback(budget)
    trainer.train()
    kept = json.loads((folder / MILESTONES_FILE).read_text())
    assert kept == budget.milestones_kept
    # 10 and 16 are both first reached after the first batch: one snapshot serves both.
    assert [(m["milestone"], m["rollouts"], m["path"]) for m in kept] == [
        (10, 16, str(folder / "10")),
        (16, 16, str(folder / "10")),
        (32, 32, str(folder / "32")),
    ]
    assert all(0 <= m["cpu_s"] and 0 <= m["wall_s"] for m in kept)
    assert kept[0]["cpu_s"] <= kept[-1]["cpu_s"] and kept[0]["wall_s"] < kept[-1]["wall_s"]
    assert (folder / "32" / "config.json").is_file() and not (folder / "16").exists()


def test_a_seconds_budget_ends_training_at_the_next_step(tiny_model_dir, tmp_path):
    trainer = _grpo(tiny_model_dir, tmp_path, CountingReward())
    ticks = iter(range(1000))
    budget = RolloutBudget(trainer, max_seconds=3, clock=lambda: float(next(ticks)))
    trainer.add_callback(budget)
    trainer.train()
    # The clock ticks a second a read: once when training begins, once at each step's end; the stop reads it again.
    assert budget.stopped_at_step == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "nothing to do"),
        ({"max_rollouts": 0}, "max_rollouts must be a positive integer"),
        ({"max_rollouts": 10.5}, "max_rollouts must be a positive integer"),
        ({"max_seconds": -1}, "max_seconds must be a positive number"),
        ({"max_rollouts": 10, "clock": "gpu"}, "clock must be one of cpu, wall"),
        ({"milestones": [20, 10]}, "increasing order"),
        ({"max_rollouts": 10, "milestones": [5, 20]}, "beyond max_rollouts"),
    ],
)
def test_bad_budgets_are_refused_with_one_sentence(tiny_model_dir, tmp_path, options, message):
    trainer = _grpo(tiny_model_dir, tmp_path, CountingReward())
    with pytest.raises(ValueError, match=message):
        RolloutBudget(trainer, **options)


def test_a_budget_needs_the_trainer_it_counts():
    with pytest.raises(TypeError, match="counts a GRPO trainer's rollouts"):
        RolloutBudget(object(), max_rollouts=10)
