"""Dynamic sampling (DAPO): the zero-variance filter, refill rounds, accounting, every loss type, C-GRPO's
`drop_unanimous`, checkpoints, two processes, and a tiny run that learns."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
from conftest import run_two_ranks
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from cgrpo import CGRPOConfig, CGRPOTrainer, DynamicSamplingConfig, DynamicSamplingGRPOTrainer
from cgrpo.dapo.groups import PromptStream, informative_groups, share_plan

G = 4
LOSS_TYPES = ["grpo", "dapo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo"]


def _data(n: int = 32) -> Dataset:
    """Prompts whose odd indices are informative (their groups' rewards vary) and even ones are not."""
    return Dataset.from_dict(
        {
            "prompt": [f"{i}+{i}=" for i in range(n)],
            "index": list(range(n)),
            "informative": [i % 2 == 1 for i in range(n)],
        }
    )


class RecordingReward:
    """Alternating rewards over the rows of an informative prompt's group, 1.0 for every row of the others.

    The rows of a group are consecutive in a reward call, so with an even group width every informative group has
    rewards 0, 1, 0, 1, ... Records the dataset indices of the rows of every call.
    """

    __name__ = "parity"

    def __init__(self, informative: bool | None = None):
        self.calls: list[list[int]] = []
        self.informative = informative

    def __call__(self, completions, index, informative, **kwargs):
        self.calls.append(list(index))
        flags = informative if self.informative is None else [self.informative] * len(completions)
        return [float(j % 2) if flag else 1.0 for j, flag in enumerate(flags)]

    def groups(self) -> list[list[int]]:
        """The dataset index of each group scored, per call."""
        return [call[::G] for call in self.calls]


def _config(tmp_path, **overrides) -> DynamicSamplingConfig:
    # One generation batch of prompts per round and short batches allowed, so each test controls its rounds; the
    # recipe's defaults have tests of their own.
    options = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        num_generations=G,
        per_device_train_batch_size=4 * G,
        max_completion_length=6,
        max_steps=2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
        max_sampling_rounds=3,
        prompts_per_round=4,
        allow_short_batch=True,
    )
    options.update(overrides)
    return DynamicSamplingConfig(**options)


def _trainer(model_dir, tmp_path, reward=None, data=None, **overrides) -> DynamicSamplingGRPOTrainer:
    return DynamicSamplingGRPOTrainer(
        model=model_dir,
        reward_funcs=reward or RecordingReward(),
        args=_config(tmp_path, **overrides),
        train_dataset=data or _data(),
    )


def _rows(indices: list[int], data: Dataset | None = None, width: int = G) -> list[dict]:
    data = data or _data()
    return [dict(data[i]) for i in indices for _ in range(width)]


def _score(trainer, indices: list[int], width: int = G) -> dict:
    trainer.model.train()
    return trainer._generate_and_score_completions(_rows(indices, width=width))


# ---------------------------------------------------------------------- the filter, without a model
def test_the_filter_keeps_exactly_the_groups_whose_rewards_vary():
    nan = math.nan
    rewards = torch.tensor(
        [
            [1.0, 1.0, 1.0, 1.0],  # all agree: dropped
            [0.0, 1.0, 0.0, 0.0],  # one differs: kept
            [1.0, 1.0, nan, nan],  # C-GRPO padding (NaN) after two agreeing rows: dropped
            [0.0, 1.0, nan, nan],  # padding after two differing rows: kept
            [0.5, nan, nan, nan],  # a single scorable row: dropped
            [nan, nan, nan, nan],  # nothing scorable: dropped
            [0.3, 0.3 + 1e-12, 0.3, 0.3],  # differences far below TRL's zero-std tolerance: dropped
            [0.3, 0.3001, 0.3, 0.3],  # a small but real difference: kept
        ]
    ).reshape(-1, 1)
    kept = informative_groups(rewards, torch.ones(1), group_size=4)
    assert kept.tolist() == [False, True, False, True, False, False, False, True]


@pytest.mark.parametrize("size", [2, 7, 8, 32])
def test_equal_weighted_rewards_are_zero_variance_whatever_the_rounding(size):
    # Correct and well formed under weights 1.0 and 0.2: 1.2 in float32, whose float32 mean misses it by a rounding
    # error (a standard deviation of 1e-7, which torch.isclose does not call zero); found in the default experiment.
    agreeing = torch.tensor([[1.0, 1.0]] * size)
    assert informative_groups(agreeing, torch.tensor([1.0, 0.2]), size).tolist() == [False]
    one_wrong = torch.tensor([[1.0, 1.0]] * (size - 1) + [[0.0, 1.0]])
    assert informative_groups(one_wrong, torch.tensor([1.0, 0.2]), size).tolist() == [True]


def test_the_filter_tests_the_weighted_sum_of_the_reward_functions():
    # Two functions that vary in opposite directions: their sum agrees across the group.
    opposite = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    assert informative_groups(opposite, torch.tensor([1.0, 1.0]), 4).tolist() == [False]
    assert informative_groups(opposite, torch.tensor([1.0, 0.5]), 4).tolist() == [True]
    # A weight of zero silences a varying function; a function returning None for a row leaves the others.
    assert informative_groups(opposite, torch.tensor([1.0, 0.0]), 4).tolist() == [True]
    assert informative_groups(opposite, torch.tensor([0.0, 0.0]), 4).tolist() == [False]
    partial = torch.tensor([[1.0, math.nan], [1.0, 2.0], [1.0, math.nan], [1.0, math.nan]])
    assert informative_groups(partial, torch.tensor([1.0, 1.0]), 4).tolist() == [True]


def test_normalize_then_sum_tests_the_sum_of_group_normalised_rewards():
    # The second function is twice the first: with weights 2 and -1 their raw sum agrees across the group, but
    # normalised within the group both vary alike, and 2 z - z = z still varies.
    rewards = torch.tensor([[0.0, 0.0], [1.0, 2.0], [0.0, 0.0], [1.0, 2.0]])
    weights = torch.tensor([2.0, -1.0])
    assert informative_groups(rewards, weights, 4, "sum_then_normalize").tolist() == [False]
    assert informative_groups(rewards, weights, 4, "normalize_then_sum").tolist() == [True]
    agreeing = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    assert informative_groups(agreeing, weights, 4, "normalize_then_sum").tolist() == [False]


@pytest.mark.parametrize(
    ("counts", "local_target", "unit", "share", "moves", "zero_variance", "kept"),
    [
        ([2, 2], 2, 1, 2, [], [0, 0], 4),  # every process has its share
        ([5, 1], 2, 1, 2, [(0, 2, 1)], [0, 0], 4),  # rank 0's surplus fills rank 1
        ([3, 0], 2, 1, 1, [(0, 1, 1)], [0, 0], 2),  # too few for the target: an even share of what there is
        ([3, 0, 0], 4, 1, 1, [(0, 1, 1), (0, 2, 2)], [0, 0, 0], 3),
        ([3, 2], 4, 2, 2, [], [0, 0], 4),  # cut to a multiple of the unit: one group is surplus
        ([1, 0], 2, 2, 2, [], [1, 2], 1),  # none left after the cut: zero-variance groups fill
        ([0], 4, 1, 1, [], [1], 0),
    ],
)
def test_share_plan_gives_every_process_as_many_groups(counts, local_target, unit, share, moves, zero_variance, kept):
    plan = share_plan(counts, local_target, unit)
    assert (plan.share, plan.moves, plan.zero_variance, plan.kept) == (share, moves, zero_variance, kept)
    # Every process ends with `share` groups: its own informative ones, arrivals and zero-variance fill.
    for k, count in enumerate(counts):
        arrivals = sum(1 for *_, dst in plan.moves if dst == k)
        assert min(count, plan.share) + arrivals + plan.zero_variance[k] == plan.share
    assert plan.share % unit == 0 and plan.share <= local_target


def test_prompt_stream_is_seeded_covers_each_pass_and_resumes_from_its_position():
    first = PromptStream(10, seed=0, purpose="dynamic-sampling")
    drawn = first.take(7) + first.take(13)
    assert sorted(drawn[:10]) == list(range(10)) and sorted(drawn[10:]) == list(range(10))
    assert drawn[:10] != drawn[10:]  # a new permutation per pass
    assert PromptStream(10, seed=0, purpose="dynamic-sampling").take(20) == drawn
    assert PromptStream(10, seed=1, purpose="dynamic-sampling").take(10) != drawn[:10]
    resumed = PromptStream(10, seed=0, purpose="dynamic-sampling")
    resumed.position = 7
    assert resumed.take(13) == drawn[7:]
    # A prompt allocator's refills share the run's seed but not dynamic sampling's order.
    assert PromptStream(10, seed=0, purpose="allocation-refills").take(10) != drawn[:10]


def test_prompt_stream_rows_give_each_process_its_slice_with_the_batch_columns():
    dataset = [{"prompt": f"p{i}", "answer": str(i), "unused": i} for i in range(6)]
    order = PromptStream(6, seed=3, purpose="dynamic-sampling").take(4)
    rows = [
        PromptStream(6, seed=3, purpose="dynamic-sampling").rows(dataset, 2, 2, rank, ["prompt", "answer", "x"])
        for rank in (0, 1)
    ]
    assert rows == [
        [{"prompt": f"p{i}", "answer": str(i)} for i in order[:2]],
        [{"prompt": f"p{i}", "answer": str(i)} for i in order[2:]],
    ]


# ---------------------------------------------------------------------- config and arguments
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_sampling_rounds": 0}, "max_sampling_rounds must be a positive integer"),
        ({"prompts_per_round": 3}, r"prompts_per_round \(3\) must be at least the prompts of one generation batch"),
        ({"filter_metric": ""}, "filter_metric must be a reward function's name or None"),
        ({"ignore_data_skip": True}, "ignore_data_skip=True would resume without dynamic sampling's saved state"),
    ],
)
def test_invalid_config_values_raise(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **overrides)


def test_config_defaults_are_the_dapo_recipes(tmp_path):
    # The recipe: gen_batch_size = 3 x train batch, max_num_gen_batches = 10, an error when the rounds run out.
    config = DynamicSamplingConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, num_generations=G, per_device_train_batch_size=4 * G
    )
    assert (config.prompts_per_round, config.max_sampling_rounds) == (3 * 4, 10)
    assert config.filter_metric is None and config.allow_short_batch is False
    # C-GRPO's drop_unanimous shares the rounds and the error, but not the over-sampling (see CGRPOConfig).
    cgrpo = CGRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        budget_grid=[2, 4],
        per_device_train_batch_size=8,
        drop_unanimous=True,
    )
    assert (cgrpo.prompts_per_round, cgrpo.max_sampling_rounds, cgrpo.allow_short_batch) == (2, 10, False)
    with pytest.raises(ValueError, match="max_sampling_rounds"):
        CGRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            bf16=False,
            budget_grid=[2, 4],
            drop_unanimous=True,
            max_sampling_rounds=0,
        )
    with pytest.raises(ValueError, match=r"prompts_per_round \(1\) must be at least"):
        CGRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            bf16=False,
            budget_grid=[2, 4],
            per_device_train_batch_size=8,
            drop_unanimous=True,
            prompts_per_round=1,
        )


def test_invalid_trainer_arguments_raise(tiny_model_dir, tmp_path):
    with pytest.raises(TypeError, match="DynamicSamplingConfig"):
        DynamicSamplingGRPOTrainer(
            model=tiny_model_dir,
            reward_funcs=RecordingReward(),
            train_dataset=_data(),
            args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False),
        )
    with pytest.raises(NotImplementedError, match="tools"):
        DynamicSamplingGRPOTrainer(
            model=tiny_model_dir,
            reward_funcs=RecordingReward(),
            args=_config(tmp_path),
            train_dataset=_data(),
            tools=[len],
        )
    stream = _data().to_iterable_dataset()
    with pytest.raises(NotImplementedError, match="iterable dataset"):
        _trainer(tiny_model_dir, tmp_path, data=stream)
    # Without refill rounds an iterable dataset is fine.
    assert _trainer(tiny_model_dir, tmp_path, data=stream, max_sampling_rounds=1)._sampler.stream is None


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        (lambda completions, **kw: [1.0], "returned 1 rewards for 16 completions"),
        (lambda completions, **kw: ["good"] * len(completions), "returned 'good', not a number"),
    ],
)
def test_a_reward_function_must_return_one_number_per_completion(tiny_model_dir, tmp_path, reward, message):
    with pytest.raises(ValueError, match=message):
        _score(_trainer(tiny_model_dir, tmp_path, reward=reward), [0, 1, 2, 3])


# ---------------------------------------------------------------------- rounds on a tiny model
def test_rounds_keep_exactly_the_informative_groups_and_stop_once_the_batch_is_full(tiny_model_dir, tmp_path):
    reward = RecordingReward()
    trainer = _trainer(tiny_model_dir, tmp_path, reward=reward, max_sampling_rounds=10)
    output = _score(trainer, [0, 2, 4, 1])  # one informative prompt of four
    rounds = reward.groups()
    found = [sum(i % 2 for i in call) for call in rounds]
    # Rounds go on until four informative groups are found, and not one round longer.
    assert sum(found) >= 4 and sum(found[:-1]) < 4
    assert rounds[0] == [0, 2, 4, 1] and all(len(call) == 4 for call in rounds)
    kept = [int(p.split("+")[0]) for p in list(trainer._logs["prompt"])[::G]]
    informative_seen = [i for call in rounds for i in call if i % 2]
    assert len(kept) == 4 and kept == informative_seen[:4]  # first found, first kept
    assert output["completion_ids"].size(0) == 4 * G
    assert torch.all(output["advantages"] != 0)
    assert trainer._metrics["train"]["frac_reward_zero_std"] == [0.0]
    totals = trainer.dynamic_totals
    assert totals["rounds"] == len(rounds) and totals["groups_sampled"] == 4 * len(rounds)
    assert totals["groups_dropped"] == sum(4 - f for f in found)
    assert totals["groups_kept"] == 4 and totals["groups_surplus"] == sum(found) - 4
    assert totals["train_rollouts"] == 4 * G * len(rounds) == sum(len(call) for call in reward.calls)
    assert totals["refill_prompts"] == 4 * (len(rounds) - 1) and totals["short_batches"] == 0


def test_refill_rounds_stop_at_the_maximum_and_say_so(tiny_model_dir, tmp_path, caplog):
    reward = RecordingReward(informative=False)  # no group ever varies
    trainer = _trainer(tiny_model_dir, tmp_path, reward=reward, max_sampling_rounds=3)
    with caplog.at_level(logging.WARNING, logger="cgrpo.dapo.sampler"):
        output = _score(trainer, [1, 3, 5, 7])
    assert len(reward.calls) == 3
    assert "0 informative groups of the 4 the batch needs after 3 rounds (max_sampling_rounds=3" in caplog.text
    assert "12 groups sampled, 11 dropped" in caplog.text
    # No informative group: the batch is the fewest groups TRL can split (one), and it carries no advantage.
    assert output["completion_ids"].size(0) == G and torch.all(output["advantages"] == 0)
    totals = trainer.dynamic_totals
    assert totals["short_batches"] == 1 and totals["groups_zero_variance_trained"] == 1
    assert totals["groups_dropped"] == 11 and totals["groups_kept"] == 0
    assert trainer._metrics["train"]["dynamic/short_batch"] == [1.0]


def test_a_short_batch_trains_on_the_informative_groups_found(tiny_model_dir, tmp_path, caplog):
    trainer = _trainer(tiny_model_dir, tmp_path, max_sampling_rounds=1)
    with caplog.at_level(logging.WARNING, logger="cgrpo.dapo.sampler"):
        output = _score(trainer, [1, 0, 3, 2])
    assert output["completion_ids"].size(0) == 2 * G
    assert "2 informative groups of the 4" in caplog.text and "training on 2 informative groups" in caplog.text
    assert trainer._sampler.stream is None  # one round: nothing to refill from


def test_a_batch_still_short_after_the_last_round_is_an_error_naming_the_options(tiny_model_dir, tmp_path):
    reward = RecordingReward(informative=False)
    trainer = _trainer(tiny_model_dir, tmp_path, reward=reward, max_sampling_rounds=2, allow_short_batch=False)
    with pytest.raises(
        RuntimeError,
        match="found 0 informative groups of the 4 the batch needs after 2 rounds.*set allow_short_batch=True",
    ):
        _score(trainer, [1, 3, 5, 7])
    assert len(reward.calls) == 2


def _always_varying(completions, **kwargs):
    return [float(j % 2) for j in range(len(completions))]


def test_filter_metric_lets_one_reward_function_decide_which_groups_are_informative(tiny_model_dir, tmp_path):
    # A second reward that varies in every group makes every group informative on the combined reward.
    rewards = [RecordingReward(), _always_varying]
    combined = _trainer(tiny_model_dir, tmp_path / "combined", reward=rewards, max_sampling_rounds=1)
    _score(combined, [0, 2, 4, 1])
    assert combined.dynamic_totals["groups_kept"] == 4
    parity = _trainer(
        tiny_model_dir, tmp_path / "parity", reward=rewards, max_sampling_rounds=1, filter_metric="parity"
    )
    output = _score(parity, [0, 2, 4, 1])
    assert parity.dynamic_totals["groups_kept"] == 1 and parity.dynamic_totals["groups_dropped"] == 3
    assert {int(p.split("+")[0]) for p in parity._logs["prompt"]} == {1}
    assert output["completion_ids"].size(0) == G


def test_an_unknown_filter_metric_is_an_error_listing_the_reward_functions(tiny_model_dir, tmp_path):
    with pytest.raises(
        ValueError,
        match=r"filter_metric 'acc' names no reward function; set it to one of "
        r"'parity', '_always_varying'",
    ):
        _trainer(tiny_model_dir, tmp_path, reward=[RecordingReward(), _always_varying], filter_metric="acc")
    with pytest.raises(ValueError, match="filter_metric 'acc' names no reward function"):
        _cgrpo(tiny_model_dir, tmp_path, RecordingReward(), filter_metric="acc")


def test_kept_rows_split_evenly_into_micro_batches(tiny_model_dir, tmp_path):
    # Groups of 2 and 4 micro-batches per generation: kept groups come in pairs, so three informative ones keep two.
    trainer = _trainer(
        tiny_model_dir,
        tmp_path,
        num_generations=2,
        per_device_train_batch_size=2,
        steps_per_generation=4,
        max_sampling_rounds=1,
    )
    output = _score(trainer, [1, 3, 5, 0], width=2)
    assert output["completion_ids"].size(0) == 4
    assert trainer.dynamic_totals["groups_kept"] == 2 and trainer.dynamic_totals["groups_surplus"] == 1


def test_over_sampling_tops_up_the_first_round(tiny_model_dir, tmp_path):
    reward = RecordingReward()
    trainer = _trainer(tiny_model_dir, tmp_path, reward=reward, prompts_per_round=8, max_sampling_rounds=1)
    _score(trainer, [0, 2, 4, 1])
    assert [len(call) for call in reward.groups()] == [8]
    assert reward.groups()[0][:4] == [0, 2, 4, 1]
    assert trainer.dynamic_totals["refill_prompts"] == 4 and trainer.dynamic_totals["groups_sampled"] == 8


def test_reward_functions_score_every_sampled_completion_once_and_log_the_kept_rows(tiny_model_dir, tmp_path):
    def reward(completions, informative, log_extra=None, **kwargs):
        log_extra("flag", list(informative))
        return [float(j % 2) if flag else 1.0 for j, flag in enumerate(informative)]

    trainer = _trainer(tiny_model_dir, tmp_path, reward=reward, max_sampling_rounds=1)
    _score(trainer, [1, 0, 3, 2])
    # The completion table holds the kept rows only, their logged column aligned with them.
    assert list(trainer._logs["extra"]["flag"]) == [True] * 2 * G
    assert len(trainer._logs["completion"]) == 2 * G


def test_batch_scaled_advantages_use_the_kept_groups_standard_deviation(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, scale_rewards="batch", max_sampling_rounds=1)
    output = _score(trainer, [1, 0, 3, 2])
    # Kept: two groups rewarded 0, 1, 0, 1. Their 8 rewards have sample std sqrt(2/7); the dropped groups' 8 rows
    # of 1.0 would have given the whole round's std instead.
    expected = 0.5 / (math.sqrt(2 / 7) + 1e-4)
    torch.testing.assert_close(output["advantages"].abs(), torch.full((2 * G,), expected))


def test_training_totals_add_up_to_the_logged_metrics(tiny_model_dir, tmp_path):
    reward = RecordingReward()
    trainer = _trainer(tiny_model_dir, tmp_path, reward=reward, max_steps=3)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "dynamic/rounds" in entry]
    totals = trainer.dynamic_totals
    assert len(logs) == 3
    pairs = [
        ("rounds", "rounds"),
        ("groups_dropped", "groups_dropped"),
        ("groups_sampled", "groups_sampled"),
        ("informative_groups", "groups_kept"),
        ("rollouts_generated", "train_rollouts"),
    ]
    for metric, total in pairs:
        assert sum(entry[f"dynamic/{metric}"] for entry in logs) == totals[total]
    groups = [i for call in reward.groups() for i in call]
    assert totals["groups_sampled"] == len(groups) and totals["rounds"] == len(reward.calls)
    assert totals["groups_dropped"] == sum(1 for i in groups if i % 2 == 0)
    assert totals["groups_kept"] + totals["groups_surplus"] == sum(1 for i in groups if i % 2)
    assert totals["train_tokens"] > 0 and totals["generation_s"] > 0


def test_same_seed_same_rounds(tiny_model_dir, tmp_path):
    runs = []
    for name in ("a", "b"):
        trainer = _trainer(tiny_model_dir, tmp_path / name, max_steps=2)
        trainer.train()
        runs.append([{k: v for k, v in e.items() if k.startswith("dynamic/")} for e in trainer.state.log_history])
    assert runs[0] == runs[1]


# ---------------------------------------------------------------------- every loss type
@pytest.fixture(scope="module", params=[0.0, 0.04], ids=["beta0", "beta0.04"])
def kept_and_trl_batches(request, tiny_model_dir, tmp_path_factory):
    """The dynamic sampler's batch of one round, and TRL's own batch over the whole round, from the same completions.

    Prompts 1 and 3 are informative, 0 and 2 are not; one round, so the kept batch holds two groups.
    """
    trainer = _trainer(
        tiny_model_dir,
        tmp_path_factory.mktemp("loss"),
        beta=request.param,
        max_sampling_rounds=1,
        max_completion_length=8,
    )
    trainer.current_gradient_accumulation_steps = 1
    rounds = []
    generate_round = trainer._generate_round

    def recording(examples):
        generated, pad = generate_round(examples)
        rounds.append((examples, generated))
        return generated, pad

    trainer._generate_round = recording
    kept = _score(trainer, [1, 0, 3, 2])
    examples, generated = rounds[0]
    trainer._generate = lambda prompts: generated  # TRL's pass over the whole round, same completions
    try:
        full = GRPOTrainer._generate_and_score_completions(trainer, [dict(e) for e in examples])
    finally:
        del trainer._generate
    rows = torch.tensor([i for i, example in enumerate(examples) if example["informative"]])
    alone = {key: value[rows] if torch.is_tensor(value) and value.dim() > 0 else value for key, value in full.items()}
    alone["num_items_in_batch"] = alone["completion_mask"].sum()
    return trainer, kept, full, alone


def _gradient(trainer, batch: dict) -> torch.Tensor:
    trainer.model.zero_grad()
    GRPOTrainer.compute_loss(trainer, trainer.model, batch).backward()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


def test_the_kept_batch_is_trls_batch_of_the_kept_groups(kept_and_trl_batches):
    _, kept, _, alone = kept_and_trl_batches
    width = kept["completion_ids"].size(1)
    assert torch.equal(kept["completion_ids"], alone["completion_ids"][:, :width])
    assert torch.equal(kept["completion_mask"], alone["completion_mask"][:, :width])
    assert not alone["completion_mask"][:, width:].any()
    torch.testing.assert_close(kept["advantages"], alone["advantages"], rtol=0, atol=0)
    assert kept["num_items_in_batch"] == alone["num_items_in_batch"]
    if "ref_per_token_logps" in kept:
        mask = kept["completion_mask"].bool()
        torch.testing.assert_close(kept["ref_per_token_logps"][mask], alone["ref_per_token_logps"][:, :width][mask])


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_gradient_equals_trls_gradient_on_the_kept_groups_alone(kept_and_trl_batches, loss_type):
    trainer, kept, full, alone = kept_and_trl_batches
    trainer.loss_type = loss_type
    ours = _gradient(trainer, kept)
    reference = _gradient(trainer, alone)
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)
    assert reference.abs().sum() > 0
    # TRL on the whole round would dilute the update with the dropped groups' rows: for grpo exactly by half.
    diluted = _gradient(trainer, full)
    assert not torch.allclose(diluted, reference, rtol=0, atol=1e-6)
    if loss_type == "grpo" and trainer.beta == 0.0:
        torch.testing.assert_close(diluted, reference / 2, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_trains(tiny_model_dir, tmp_path, loss_type):
    # Two steps per generation batch (old-policy log-probs are scored) and a KL term (reference log-probs).
    trainer = _trainer(
        tiny_model_dir,
        tmp_path,
        loss_type=loss_type,
        per_device_train_batch_size=2 * G,
        steps_per_generation=2,
        beta=0.04,
        max_steps=2,
    )
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert trainer.dynamic_totals["groups_kept"] > 0


# ---------------------------------------------------------------------- C-GRPO with drop_unanimous
def _cgrpo(model_dir, tmp_path, reward, **overrides) -> CGRPOTrainer:
    # Easy prompts (even indices) pass the verifier, so they stop at the first budget with agreeing rewards.
    options = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        budget_grid=[2, 4, 8],
        per_device_train_batch_size=16,
        max_completion_length=6,
        max_steps=2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        seed=0,
        score="first_success",
        recalibrate_every=0,
        min_generation_prompts=1,
        drop_unanimous=True,
        max_sampling_rounds=4,
    )
    options.update(overrides)
    calibration = Dataset.from_dict({"prompt": [f"{i}*2=" for i in range(4)], "informative": [False] * 4})
    return CGRPOTrainer(
        model=model_dir,
        reward_funcs=reward,
        args=CGRPOConfig(**options),
        train_dataset=_data(),
        calibration_dataset=calibration,
        verifier=lambda completions, informative, **kw: [not informative] * len(completions),
    )


def test_cgrpo_drop_unanimous_drops_the_groups_stopped_at_unanimity_and_refills(tiny_model_dir, tmp_path):
    reward = RecordingReward()
    trainer = _cgrpo(tiny_model_dir, tmp_path, reward)
    trainer.model.train()
    output = trainer._generate_and_score_completions(_rows([0, 1], width=8))
    # The reward function's first call is the probe before the calibration, on the first prompt's empty completion.
    probe, *calls = reward.calls
    assert probe == [0]
    # Prompt 0 stops at k=2 with agreeing rewards and is dropped; refill rounds find a second informative group.
    scored = [call[0] for call in calls]  # each call's first row
    assert scored[0] == 0
    totals = trainer.dynamic_totals
    assert totals["groups_kept"] == 2 and totals["rounds"] == len(calls) >= 2
    kept = {int(p.split("+")[0]) for p in trainer._logs["prompt"]}
    assert kept <= {i for i in range(32) if i % 2} and len(kept) == 2
    # Only real rows of informative groups are trained on: 2 groups x 8 rows, all with an advantage.
    assert output["completion_ids"].size(0) == 16 and torch.all(output["advantages"] != 0)
    # Every completion C-GRPO generated was scored once, and both ledgers count the dropped groups' rollouts.
    assert sum(len(call) for call in calls) == totals["train_rollouts"] == trainer.cgrpo_totals["train_rollouts"]
    assert trainer.cgrpo_totals["groups"] == totals["groups_sampled"]
    assert 2 in trainer.budget_histogram  # the dropped easy groups stopped at the first budget


def test_cgrpo_drop_unanimous_trains_and_checkpoints_its_sampling_state(tiny_model_dir, tmp_path):
    trainer = _cgrpo(tiny_model_dir, tmp_path, RecordingReward(), max_steps=2)
    trainer.train()
    assert all(math.isfinite(e.get("loss", 0.0)) for e in trainer.state.log_history)
    assert trainer.dynamic_totals["groups_dropped"] > 0
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    trainer._save_rng_state(str(folder))
    assert json.loads((folder / "dynamic_sampling_state_0.json").read_text())["totals"] == trainer.dynamic_totals
    resumed = _cgrpo(tiny_model_dir, tmp_path / "resumed", RecordingReward())
    resumed._load_rng_state(str(folder))
    assert resumed.dynamic_totals == trainer.dynamic_totals and resumed.cgrpo_totals == trainer.cgrpo_totals
    assert resumed._dynamic.stream.position == trainer._dynamic.stream.position > 0


def test_cgrpo_without_drop_unanimous_is_unchanged(tiny_model_dir, tmp_path):
    trainer = _cgrpo(tiny_model_dir, tmp_path, RecordingReward(), drop_unanimous=False)
    assert trainer.dynamic_totals is None and trainer._dynamic is None


# ---------------------------------------------------------------------- checkpoints
def test_checkpoint_carries_totals_and_the_refill_stream_position(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path / "run", max_steps=2)
    trainer.train()
    assert trainer._sampler.stream.position > 0
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    trainer._save_rng_state(str(folder))
    resumed = _trainer(tiny_model_dir, tmp_path / "resumed")
    resumed._load_rng_state(str(folder))
    assert resumed.dynamic_totals == trainer.dynamic_totals
    assert resumed._sampler.stream.position == trainer._sampler.stream.position
    assert resumed._sampler.stream.take(8) == trainer._sampler.stream.take(8)
    (folder / "dynamic_sampling_state_0.json").unlink()
    with pytest.raises(FileNotFoundError, match="no dynamic sampling state"):
        resumed._load_rng_state(str(folder))


# ---------------------------------------------------------------------- a run that learns
def test_a_tiny_run_learns_to_start_with_a_digit(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    def digit_first(completions, **kwargs):
        return [1.0 if c[:1].isdigit() else 0.0 for c in completions]

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    digits = tokenizer.convert_tokens_to_ids(list("0123456789"))

    def p_digit(model) -> float:
        held_out = tokenizer(
            [f"{i}+{i}=" for i in range(64, 96)], return_tensors="pt", padding=True, padding_side="left"
        )
        with torch.no_grad():
            logits = model(**held_out).logits[:, -1]
        return logits.softmax(-1)[:, digits].sum(-1).mean().item()

    data = Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(64)]})
    trainer = DynamicSamplingGRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=digit_first,
        train_dataset=data,
        args=_config(tmp_path, max_completion_length=2, max_steps=8, learning_rate=3e-2),
    )
    before = p_digit(trainer.model)
    trainer.train()
    after = p_digit(trainer.model)
    # A random model starts with a digit about 10 times in 83; GRPO on the informative groups more than doubles it.
    assert before < 0.2 and after > 2 * before, (before, after)
    assert trainer.dynamic_totals["groups_dropped"] > 0 and trainer.dynamic_totals["refill_prompts"] > 0


# ---------------------------------------------------------------------- two processes
SCRIPT = Path(__file__).parent / "distributed" / "dynamic_two_ranks.py"


@pytest.fixture(scope="module")
def ranks(tiny_model_dir, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("dynamic-two-ranks")
    return run_two_ranks(SCRIPT, tiny_model_dir, out)


def _without_timing(totals: dict) -> dict:
    return {key: value for key, value in totals.items() if not key.endswith("_s")}


@pytest.mark.long
@pytest.mark.parametrize("trainer", ["dynamic", "cgrpo"])
def test_two_processes_train_equal_batches_of_informative_groups_and_agree_on_totals(ranks, trainer):
    runs = [rank if trainer == "dynamic" else rank["cgrpo"] for rank in ranks]
    assert [rank["world_size"] for rank in ranks] == [2, 2] and [run["steps"] for run in runs] == [3, 3]
    assert _without_timing(runs[0]["totals"]) == _without_timing(runs[1]["totals"])
    for batch0, batch1 in zip(runs[0]["batches"], runs[1]["batches"]):
        assert len(batch0) == len(batch1) == 2  # the target, on both ranks
        assert all(i % 4 < 2 for i in batch0 + batch1)  # informative prompts only
    # Rank 1's dataloader prompts are never informative: the informative groups had to be shared out.
    totals = runs[0]["totals"]
    assert totals["groups_moved"] > 0 and totals["groups_kept"] == 2 * 2 * 3
    assert totals["groups_sampled"] == totals["groups_kept"] + totals["groups_dropped"] + totals["groups_surplus"]
    if trainer == "dynamic":
        logged = [entry for entry in ranks[0]["logged"] if "dynamic/informative_groups" in entry]
        assert [entry["dynamic/informative_groups"] for entry in logged] == [4.0, 4.0, 4.0]
    else:
        assert runs[0]["cgrpo_totals"]["groups"] == totals["groups_sampled"]
        assert runs[0]["cgrpo_totals"]["verifier_errors"] == 0
