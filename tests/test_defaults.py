"""A drop-in for `GRPOTrainer`: with the arguments a GRPO user passes, C-GRPO trains as many steps, never none."""

from __future__ import annotations

import math

import pytest
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from cgrpo import (
    CGRPOConfig,
    CGRPOTrainer,
    DynamicSamplingConfig,
    DynamicSamplingGRPOTrainer,
)

LOSS_TYPES = ["grpo", "dapo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo"]
# TRL's options of the loss types that need more than `loss_type`.
LOSS_OPTIONS = {"luspo": {"importance_sampling_level": "sequence"}}


def _data(n: int, offset: int = 0) -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [f"{i}+{i}=" for i in range(offset, offset + n)],
            "answer": [str(2 * i) for i in range(offset, offset + n)],
        }
    )


def _length_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def _first_character(text: str) -> str | None:
    return text[:1] or None


def _user_options(tmp_path, **overrides) -> dict:
    """The issue's case: 8 prompts, groups of 4, one prompt per step, 2 steps; the rest TRL's defaults."""
    options = {
        "output_dir": str(tmp_path),
        "use_cpu": True,
        "bf16": False,
        "report_to": [],
        "per_device_train_batch_size": 4,
        "max_steps": 2,
        "logging_steps": 1,
        "max_completion_length": 8,
    }
    return {**options, **overrides}


def _cgrpo(model_dir, tmp_path, train_size: int = 8, **overrides) -> CGRPOTrainer:
    args = CGRPOConfig(budget_grid=[2, 4], **_user_options(tmp_path, **overrides))
    return CGRPOTrainer(
        model=model_dir,
        reward_funcs=_length_reward,
        args=args,
        train_dataset=_data(train_size),
        calibration_dataset=_data(4, offset=100),
        answer_extractor=_first_character,
    )


def _budget_logs(trainer) -> list[dict]:
    return [entry for entry in trainer.state.log_history if "cgrpo/mean_k" in entry]


def test_grpo_users_arguments_train_every_step_with_budget_metrics(tiny_model_dir, tmp_path):
    grpo = GRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=_length_reward,
        train_dataset=_data(8),
        args=GRPOConfig(num_generations=4, **_user_options(tmp_path / "grpo")),
    )
    grpo.train()
    cgrpo = _cgrpo(tiny_model_dir, tmp_path / "cgrpo")
    assert cgrpo.args.steps_per_generation == grpo.args.steps_per_generation == 1
    cgrpo.train()
    assert cgrpo.state.global_step == grpo.state.global_step == 2
    logs = _budget_logs(cgrpo)
    assert [entry["step"] for entry in logs] == [1, 2]
    per_step = {
        "cgrpo/mean_k",
        "cgrpo/rollout_savings",
        "cgrpo/delta",
        "cgrpo/qhat_2",
        "cgrpo/qhat_4",
        "cgrpo/calibration_solve_rate",
        "cgrpo/calibration_rollouts_total",
    }
    assert all(per_step <= set(entry) for entry in logs)
    assert all(entry["cgrpo/mean_k"] in (2.0, 4.0) for entry in logs)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_trains_on_the_users_arguments(tiny_model_dir, tmp_path, loss_type):
    trainer = _cgrpo(tiny_model_dir, tmp_path, loss_type=loss_type, **LOSS_OPTIONS.get(loss_type, {}))
    trainer.train()
    assert trainer.state.global_step == 2
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert len(_budget_logs(trainer)) == 2


def test_a_generation_batch_larger_than_the_training_set_is_refused_before_training(tiny_model_dir, tmp_path):
    # 16 prompts per generation batch, 8 in the training set: TRL's sampler would yield no batch at all.
    with pytest.raises(
        ValueError,
        match=r"train_dataset holds 8 prompts but one generation batch needs 16 .* lower "
        r"min_generation_prompts",
    ):
        _cgrpo(tiny_model_dir, tmp_path, min_generation_prompts=16)
    args = DynamicSamplingConfig(num_generations=4, steps_per_generation=16, **_user_options(tmp_path))
    with pytest.raises(ValueError, match="needs 16 .* lower steps_per_generation or generation_batch_size"):
        DynamicSamplingGRPOTrainer(model=tiny_model_dir, reward_funcs=_length_reward, args=args, train_dataset=_data(8))


def test_a_shared_generation_batch_the_training_set_holds_trains(tiny_model_dir, tmp_path):
    # 4 prompts per generation batch of the 8: four steps share each and the budget metrics come once per batch.
    trainer = _cgrpo(tiny_model_dir, tmp_path, min_generation_prompts=4, max_steps=8, logging_steps=4)
    assert trainer.args.steps_per_generation == 4
    trainer.train()
    assert trainer.state.global_step == 8
    assert [entry["step"] for entry in _budget_logs(trainer)] == [4, 8]


def test_the_seeds_example_arguments_train(tiny_model_dir, tmp_path):
    # The README's arguments, CGRPOConfig(budget_grid=[2, 4, 8, 16, 32], recalibrate_every=50), TRL's defaults else,
    # but for 8-token completions: a random model rarely stops, and TRL's 256 tokens took 134 s on 2 busy cores.
    args = CGRPOConfig(
        budget_grid=[2, 4, 8, 16, 32],
        recalibrate_every=50,
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to=[],
        max_steps=2,
        logging_steps=1,
        max_completion_length=8,
    )
    trainer = CGRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=_length_reward,
        args=args,
        train_dataset=_data(4),
        calibration_dataset=_data(4, offset=100),
        answer_extractor=_first_character,
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert [record["step"] for record in trainer.calibration_history] == [0]
    assert trainer.cgrpo_totals["groups"] == 2
    assert len(_budget_logs(trainer)) == 2
