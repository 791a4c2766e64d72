"""What a batch offers the policy gradient (`signal/*`), and equal group weights in the loss (`group_weighting`)."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset

from cgrpo import CGRPOConfig, CGRPOTrainer
from cgrpo.support.learning_signal import equal_group_scales, record_learning_signal, signal_summary


class OneProcess:
    """The accelerator of a single process: gathering returns what it is given."""

    def gather(self, tensor):
        return tensor


def _batch():
    # Three groups: rows 0-1 (3 and 1 tokens, advantages +-1), rows 2-3 (2 + 2 tokens, rewards that agree: the same
    # float32 remainder of TRL's normalization on both rows) and row 4 (4 tokens, a lone row whose advantage no other
    # reward can make informative); row 5 is a padded row (one token).
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    advantages = torch.tensor([1.0, -1.0, -1.5e-4, -1.5e-4, 0.5, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, -1])
    return {"advantages": advantages, "completion_mask": mask}, groups


def test_equal_scales_give_every_group_the_batch_tokens_per_group():
    output, groups = _batch()
    scales = equal_group_scales(output["completion_mask"], groups, OneProcess())
    tokens = output["completion_mask"].sum(dim=1).double() * scales
    # 12 tokens in 3 groups: every group weighs 4 tokens; the padded row is left as it is.
    assert [tokens[:2].sum().item(), tokens[2:4].sum().item(), tokens[4].item()] == pytest.approx([4.0, 4.0, 4.0])
    assert scales[5].item() == 1.0


def test_the_signal_of_a_batch_is_counted_and_logged():
    output, groups = _batch()
    trainer = SimpleNamespace(accelerator=OneProcess(), generation_totals={}, _metrics={"train": defaultdict(list)})
    record_learning_signal(trainer, output, groups, rollouts=10)
    metrics = trainer._metrics["train"]
    assert metrics["signal/informative_group_share"] == [pytest.approx(1 / 3)]
    assert metrics["signal/signal_rows_per_rollout"] == [pytest.approx(2 / 10)]
    # Token weights 4, 4, 4: no group outweighs an equal share.
    assert metrics["signal/max_prompt_weight"] == [pytest.approx(1.0)]
    record_learning_signal(
        trainer, {**output, "completion_mask": output["completion_mask"][[0, 0, 1, 1, 1, 5]]}, groups, 6
    )
    # Token weights 6, 2, 1 of 9: the heaviest group weighs 2 equal shares.
    assert trainer._metrics["train"]["signal/max_prompt_weight"][-1] == pytest.approx(2.0)
    assert signal_summary(trainer.generation_totals) == pytest.approx(
        {"informative_group_share": 2 / 6, "signal_rows_per_rollout": 4 / 16, "max_prompt_weight": 1.5}
    )


@pytest.mark.parametrize("size", [2, 4, 8, 16, 32])
def test_agreeing_rewards_are_no_signal_through_float32_normalization(size):
    # TRL's advantages in float32: eight rewards of 0.2 less their mean leave -1.5e-8 on every row, -1.5e-4 once
    # divided by the std plus 1e-4; only a group whose rewards differ is informative, and then on every row.
    rewards = torch.full((2, size), 0.2)
    rewards[1, 0] = 1.2
    advantages = (rewards - rewards.mean(dim=1, keepdim=True)) / (rewards.std(dim=1, keepdim=True) + 1e-4)
    trainer = SimpleNamespace(accelerator=OneProcess(), generation_totals={}, _metrics={"train": defaultdict(list)})
    output = {"advantages": advantages.flatten(), "completion_mask": torch.ones(2 * size, 3)}
    record_learning_signal(trainer, output, torch.arange(2 * size) // size, rollouts=2 * size)
    metrics = trainer._metrics["train"]
    assert metrics["signal/informative_group_share"] == [0.5]
    assert metrics["signal/signal_rows_per_rollout"] == [0.5]


def _trainer(model_dir, tmp_path, **overrides) -> CGRPOTrainer:
    data = Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(32)], "answer": [str(2 * i) for i in range(32)]})
    args = CGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        budget_grid=[2, 4, 8],
        per_device_train_batch_size=16,
        max_completion_length=6,
        max_steps=1,
        report_to=[],
        save_strategy="no",
        recalibrate_every=0,
        seed=0,
        min_generation_prompts=1,
        stopping_rule="unanimous",
        **overrides,
    )
    return CGRPOTrainer(
        model=model_dir,
        reward_funcs=lambda completions, **kwargs: [float(len(c) % 2) for c in completions],
        args=args,
        train_dataset=data,
        answer_extractor=lambda text: text.strip()[:1] or None,
    )


def _scored(trainer: CGRPOTrainer) -> dict:
    trainer.model.train()
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(2)]
    return trainer._generate_and_score_completions([row for row in rows for _ in range(8)])


def test_equal_weighting_scales_the_advantages_of_the_same_draws(tiny_model_dir, tmp_path):
    # Each trainer seeds the draws when it is built: the second is built after the first has drawn.
    plain = _trainer(tiny_model_dir, tmp_path)
    tokens_weighted = _scored(plain)
    equal = _trainer(tiny_model_dir, tmp_path, group_weighting="equal")
    equally_weighted = _scored(equal)
    assert torch.equal(tokens_weighted["completion_ids"], equally_weighted["completion_ids"])
    # The scaled advantages make each group's share of the token mean equal; TRL's unscaled ones do not.
    assert equal._metrics["train"]["signal/max_prompt_weight"] == [pytest.approx(1.0)]
    assert plain._metrics["train"]["signal/max_prompt_weight"][0] >= 1.0
    ratio = equally_weighted["advantages"] / tokens_weighted["advantages"]
    moving = tokens_weighted["advantages"] != 0
    assert moving.any() and torch.all(ratio[moving] > 0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"group_weighting": "prompts"}, "group_weighting must be one of tokens, equal"),
        ({"group_weighting": "equal", "loss_type": "grpo"}, "loss_type 'grpo' is not"),
    ],
)
def test_bad_group_weightings_are_refused(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        CGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, budget_grid=[2, 4], **overrides)
