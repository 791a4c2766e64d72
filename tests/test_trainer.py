"""CGRPOTrainer on a tiny random model: stopping, padding, calibration schedule, metrics and argument checks."""

from __future__ import annotations

import random
import threading

import pytest
import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from cgrpo import CGRPOConfig, CGRPOTrainer

GRID = [2, 4, 8]


def _data(n: int, offset: int = 0) -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [f"{i}+{i}=" for i in range(offset, offset + n)],
            "answer": [str(2 * i) for i in range(offset, offset + n)],
        }
    )


def _length_reward(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def _config(tmp_path, **overrides) -> CGRPOConfig:
    # One generation per optimizer step (min_generation_prompts=1), so each test controls its batch; the default
    # generation schedule has tests of its own.
    options = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        budget_grid=GRID,
        per_device_train_batch_size=16,
        max_completion_length=6,
        max_steps=2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        recalibrate_every=0,
        seed=0,
        min_generation_prompts=1,
    )
    options.update(overrides)
    return CGRPOConfig(**options)


def _trainer(model_dir, tmp_path, extractor=lambda text: "1", reward=_length_reward, **overrides) -> CGRPOTrainer:
    score = overrides.get("score", "aps")
    scoring = {"answer_extractor": extractor} if score == "aps" else {"verifier": overrides.pop("verifier")}
    return CGRPOTrainer(
        model=model_dir,
        reward_funcs=reward,
        args=_config(tmp_path, **overrides),
        train_dataset=_data(32),
        calibration_dataset=_data(4, offset=100),
        **scoring,
    )


def _generation_batch(trainer: CGRPOTrainer, prompts: int = 2) -> list[dict]:
    rows = [dict(row) for row in _data(prompts)]
    return [row for row in rows for _ in range(trainer.args.max_budget)]


def _score_batch(trainer: CGRPOTrainer, prompts: int = 2) -> dict:
    trainer.model.train()
    return trainer._generate_and_score_completions(_generation_batch(trainer, prompts))


def test_agreeing_answers_stop_at_first_budget_and_padding_leaves_the_batch(tiny_model_dir, tmp_path):
    seen_rows = []

    def reward(completions, **kwargs):
        seen_rows.append(len(completions))
        return [1.0] * len(completions)

    trainer = _trainer(tiny_model_dir, tmp_path, reward=reward)
    output = _score_batch(trainer, prompts=2)
    assert trainer.thresholds.qhat[2] <= 1.0
    # Two prompts stop at k=2: four real rows survive; the 12 padded rows never reach the reward function, which saw
    # one empty completion first, the probe before the calibration.
    assert output["completion_ids"].size(0) == 4
    assert seen_rows == [1, 4]
    assert output["num_items_in_batch"].item() == output["completion_mask"].sum().item()
    assert trainer._metrics["train"]["cgrpo/mean_k"] == [2.0]
    assert trainer._metrics["train"]["cgrpo/rollout_savings"] == [pytest.approx(0.75)]
    assert len(trainer._logs["completion"]) == 4


def test_filler_rows_are_masked_and_have_zero_advantage(tiny_model_dir, tmp_path):
    # Three prompts stopping at k=2 leave 6 real rows; a 4-way micro-batch split needs 2 masked fillers.
    trainer = _trainer(tiny_model_dir, tmp_path, per_device_train_batch_size=6, steps_per_generation=4)
    output = _score_batch(trainer, prompts=3)
    assert output["completion_ids"].size(0) == 8
    assert output["completion_mask"][6:].sum().item() == 0
    assert torch.all(output["advantages"][6:] == 0)
    assert output["num_items_in_batch"].item() == output["completion_mask"][:6].sum().item()


def test_failed_extractions_give_unit_thresholds_and_full_budgets(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, extractor=lambda text: None)
    output = _score_batch(trainer, prompts=2)
    assert trainer.thresholds.qhat == {2: 1.0, 4: 1.0, 8: 1.0}
    assert output["completion_ids"].size(0) == 16
    assert trainer._metrics["train"]["cgrpo/mean_k"] == [8.0]
    assert trainer._metrics["train"]["cgrpo/rollout_savings"] == [0.0]


def test_always_passing_verifier_gives_one_over_k_thresholds(tiny_model_dir, tmp_path):
    calls = []

    def verifier(completions, answer):
        calls.append(answer)
        return [True] * len(completions)

    trainer = _trainer(tiny_model_dir, tmp_path, score="first_success", verifier=verifier)
    output = _score_batch(trainer, prompts=2)
    assert trainer.thresholds.qhat == {k: pytest.approx(1 / k) for k in GRID}
    assert output["completion_ids"].size(0) == 4
    assert calls[:4] == ["200", "202", "204", "206"]  # calibration examples first, with their own columns


@pytest.fixture
def call_sizes(monkeypatch) -> list[int]:
    """The rows of every TRL generation call made while the test runs."""
    sizes = []
    original = GRPOTrainer._generate

    def spy(self, prompts):
        sizes.append(len(prompts))
        return original(self, prompts)

    monkeypatch.setattr(GRPOTrainer, "_generate", spy)
    return sizes


def test_each_increment_is_one_generation_call(tiny_model_dir, tmp_path, call_sizes):
    sizes = call_sizes
    trainer = _trainer(
        tiny_model_dir,
        tmp_path,
        extractor=lambda text: None,
        num_calibration_samples=2,
        calibration_batch_size=2,
        skip_impossible_budgets=False,
    )
    _score_batch(trainer, prompts=2)
    # One calibration call (2 prompts x 8), then increments of 2, 2 and 4 completions for both prompts.
    assert sizes == [16, 4, 4, 8]
    assert trainer.cgrpo_totals["generation_rounds"] == 3


def test_a_round_draws_past_budgets_where_the_rule_cannot_stop(tiny_model_dir, tmp_path, call_sizes):
    sizes = call_sizes
    trainer = _trainer(
        tiny_model_dir, tmp_path, extractor=lambda text: None, num_calibration_samples=2, calibration_batch_size=2
    )
    _score_batch(trainer, prompts=2)
    # No answer is ever extracted, so every threshold is 1 and, after two failures, no budget below 8 can stop:
    # the second round draws the remaining 6 of each group at once.
    assert trainer.thresholds.qhat[4] == 1.0
    assert sizes == [16, 4, 12]
    assert trainer.cgrpo_totals["generation_rounds"] == 2


@pytest.mark.parametrize(
    "rule", [{}, {"stopping_rule": "unanimous"}, {"stopping_rule": "esc", "stopping_options": {"window": 2}}]
)
def test_a_skipping_trainer_stops_each_prompt_where_its_rule_stepping_through_the_grid_would(
    tiny_model_dir, tmp_path, monkeypatch, rule
):
    from cgrpo.calibration import Thresholds
    from cgrpo.stopping import sampling_path

    drawn: dict[str, list] = {}
    original = CGRPOTrainer._outcomes

    def record(self, completions, example):
        outcomes = original(self, completions, example)
        drawn.setdefault(example["prompt"], []).extend(outcomes)
        return outcomes

    monkeypatch.setattr(CGRPOTrainer, "_outcomes", record)
    trainer = CGRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=_length_reward,
        args=_config(tmp_path, **rule),
        train_dataset=_data(32),
        calibration_dataset=_data(4, offset=100),
        # Two answers by the completion's length: groups that agree, and groups that split.
        answer_extractor=lambda text: str(len(text) % 2),
        # After two different answers no budget below 8 can stop: 4 of 4 would have to agree.
        initial_thresholds=None
        if rule
        else Thresholds(delta=0.2, qhat={2: 1.0, 4: 0.8, 8: 1.0}, solve_rate=0.9, n_calibration=4),
    )
    _score_batch(trainer, prompts=8)
    stopping = trainer.stopping_rule
    rounds = []
    for prompt, outcomes in drawn.items():
        padded = outcomes + [None] * (GRID[-1] - len(outcomes))
        stepwise = sampling_path(stopping, trainer.stopping_fit, GRID, padded, None, random.Random(0), skip=False)
        assert stepwise[-1] == len(outcomes), prompt
        rounds.append(len(sampling_path(stopping, trainer.stopping_fit, GRID, padded, None, random.Random(0))))
    assert sorted(trainer.budget_histogram.elements()) == sorted(len(o) for o in drawn.values())
    assert trainer.cgrpo_totals["generation_rounds"] == max(rounds)
    # Only the window rule can stop a split prompt at 4 (its last two draws agree); the others skip 4.
    if rule.get("stopping_rule") != "esc":
        assert set(trainer.budget_histogram) <= {2, 8}


def test_recalibrates_exactly_at_configured_steps_and_logs_every_metric(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, recalibrate_every=2, max_steps=5)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert [record["step"] for record in trainer.calibration_history] == [0, 2, 4]
    logged = set().union(*(entry.keys() for entry in trainer.state.log_history))
    expected = {
        "cgrpo/mean_k",
        "cgrpo/rollout_savings",
        "cgrpo/delta",
        "cgrpo/calibration_solve_rate",
        "cgrpo/calibration_rollouts",
        "cgrpo/calibration_rollouts_total",
        "cgrpo/generation_rounds",
        *(f"cgrpo/qhat_{k}" for k in GRID),
    }
    assert expected <= logged
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))
    assert trainer.cgrpo_totals["calibration_rollouts"] == 3 * 4 * 8
    # Each calibration's own cost (4 prompts x 8) at the step it ran; the running total under its own name.
    steps = [entry for entry in trainer.state.log_history if "cgrpo/mean_k" in entry]
    assert [entry.get("cgrpo/calibration_rollouts") for entry in steps] == [32, None, 32, None, 32]
    assert [entry["cgrpo/calibration_rollouts_total"] for entry in steps] == [32, 32, 64, 64, 96]


def test_shared_generation_batches_recalibrate_at_the_first_batch_due(tiny_model_dir, tmp_path):
    # 2 prompts per step and 4 per generation batch: batches start at steps 0, 2 and 4, so a refit due at step 3
    # waits for step 4, and the budget metrics are logged once per batch, at its first step.
    trainer = _trainer(tiny_model_dir, tmp_path, min_generation_prompts=4, recalibrate_every=3, max_steps=6)
    assert trainer.args.steps_per_generation == 2
    trainer.train()
    assert [record["step"] for record in trainer.calibration_history] == [0, 4]
    assert trainer.cgrpo_totals["groups"] == 12 and sum(trainer.budget_histogram.values()) == 12
    budget_logs = [entry["step"] for entry in trainer.state.log_history if "cgrpo/mean_k" in entry]
    assert budget_logs == [1, 3, 5]


def test_calibrates_once_when_recalibrate_every_is_zero(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, recalibrate_every=0, max_steps=3)
    trainer.train()
    assert [record["step"] for record in trainer.calibration_history] == [0]


def test_same_seed_same_training_metrics(tiny_model_dir, tmp_path):
    runs = []
    for name in ("a", "b"):
        trainer = _trainer(tiny_model_dir, tmp_path / name, extractor=lambda text: text[:1] or None, max_steps=2)
        trainer.train()
        runs.append([{k: v for k, v in e.items() if k.startswith("cgrpo/")} for e in trainer.state.log_history])
    assert runs[0] == runs[1]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"budget_grid": [4, 4]}, "repeat"),
        ({"budget_grid": [0, 2]}, "not a positive integer"),
        ({"budget_grid": []}, "grid is empty"),
        ({"budget_grid": [1]}, "contains 1"),
        ({"budget_grid": [1, 2, 4]}, "advantage is always zero"),
        ({"steps_per_generation": 3, "gradient_accumulation_steps": 2}, "multiple of gradient_accumulation_steps"),
        ({"num_generations": 16}, "must equal max"),
        ({"conformal_delta": 1.5}, "conformal_delta"),
        ({"delta": 0.1}, "conformal_delta"),
        ({"delta_margin": -0.1}, "delta_margin"),
        ({"split_delta": True, "conformal_delta": 0.2}, "split_delta"),
        ({"score": "oracle"}, "score must be one of"),
        ({"recalibrate_every": -1}, "recalibrate_every"),
        ({"num_calibration_samples": 0}, "num_calibration_samples"),
        ({"calibration_batch_size": 0}, "calibration_batch_size"),
        ({"min_generation_prompts": 0}, "min_generation_prompts"),
        ({"per_device_train_batch_size": 12, "steps_per_generation": 1}, "divisible by num_generations"),
        ({"ignore_data_skip": True}, "ignore_data_skip=True would resume without C-GRPO's saved state"),
    ],
)
def test_invalid_config_values_raise(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **overrides)


def test_fixed_delta_that_the_calibration_set_cannot_certify_raises_before_training(tiny_model_dir, tmp_path):
    # 4 calibration examples certify delta >= 1/5.
    with pytest.raises(ValueError, match=r"conformal_delta=0.1 is below 1/\(n\+1\) = 0.2000 for the n = 4"):
        _trainer(tiny_model_dir, tmp_path, conformal_delta=0.1)
    assert _trainer(tiny_model_dir, tmp_path, conformal_delta=0.2).args.conformal_delta == 0.2


def test_config_defaults(tmp_path):
    config = CGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    assert config.budget_grid == [2, 4, 8, 16, 32]
    assert config.num_generations == 32
    assert config.per_device_train_batch_size == 32
    # TRL's schedule: one generation batch (one group of 32) per optimizer step, and calibration calls as wide.
    assert config.min_generation_prompts is None and config.steps_per_generation == 1
    assert config.generation_batch_size == 32 and config.calibration_batch_size == 1
    assert config.conformal_delta is None and config.recalibrate_every == 50 and config.score == "aps"


@pytest.mark.parametrize(
    ("overrides", "steps", "calibration_prompts"),
    [
        # TRL's schedule by default: steps_per_generation is gradient_accumulation_steps.
        ({}, 1, 2),
        ({"gradient_accumulation_steps": 3}, 3, 6),
        # 12-row micro-batches of 8-wide groups: 12 steps is the first even count (whole groups) >= 16 prompts.
        ({"per_device_train_batch_size": 12, "min_generation_prompts": 16}, 12, 18),
        ({"per_device_train_batch_size": 12, "gradient_accumulation_steps": 5, "min_generation_prompts": 16}, 20, 30),
        ({"min_generation_prompts": 1}, 1, 2),
        ({"min_generation_prompts": 4, "gradient_accumulation_steps": 3}, 3, 6),
        # TRL's own options win over C-GRPO's.
        ({"steps_per_generation": 2, "min_generation_prompts": 16}, 2, 4),
        ({"generation_batch_size": 48}, 3, 6),
    ],
)
def test_generation_batch_covers_min_generation_prompts(tmp_path, overrides, steps, calibration_prompts):
    options = {"per_device_train_batch_size": 16, **overrides}
    config = CGRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, budget_grid=GRID, **options)
    assert config.steps_per_generation == steps
    assert (config.per_device_train_batch_size * steps) % config.max_budget == 0
    assert config.calibration_batch_size == calibration_prompts


def test_trl_schedule_of_partial_groups_names_the_fix(tmp_path):
    with pytest.raises(
        ValueError,
        match="raise per_device_train_batch_size to a multiple of it for TRL's one "
        "generation batch per step, or set min_generation_prompts",
    ):
        CGRPOConfig(
            output_dir=str(tmp_path), use_cpu=True, bf16=False, budget_grid=GRID, per_device_train_batch_size=12
        )


def test_invalid_trainer_arguments_raise(tiny_model_dir, tmp_path):
    args = _config(tmp_path)
    common = dict(model=tiny_model_dir, reward_funcs=_length_reward, args=args, train_dataset=_data(8))
    with pytest.raises(TypeError, match="CGRPOConfig"):
        CGRPOTrainer(
            **{**common, "args": GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)},
            calibration_dataset=_data(2, offset=100),
            answer_extractor=str,
        )
    with pytest.raises(ValueError, match="answer_extractor"):
        CGRPOTrainer(**common, calibration_dataset=_data(2, offset=100))
    with pytest.raises(ValueError, match="'prompt' column"):
        CGRPOTrainer(**common, calibration_dataset=Dataset.from_dict({"text": ["a"]}), answer_extractor=str)
    with pytest.raises(ValueError, match="no column 'answer'"):
        CGRPOTrainer(**common, calibration_dataset=Dataset.from_dict({"prompt": ["a"]}), answer_extractor=str)
    with pytest.raises(ValueError, match="must not be empty"):
        CGRPOTrainer(**common, calibration_dataset=_data(0), answer_extractor=str)
    with pytest.raises(NotImplementedError, match="tools"):
        CGRPOTrainer(**common, calibration_dataset=_data(2, offset=100), answer_extractor=str, tools=[len])
    with pytest.raises(NotImplementedError, match="rollout_func"):
        CGRPOTrainer(
            **common, calibration_dataset=_data(2, offset=100), answer_extractor=str, rollout_func=lambda p, t: {}
        )
    with pytest.raises(ValueError, match="verifier"):
        CGRPOTrainer(
            **{**common, "args": _config(tmp_path, score="pass_rate")}, calibration_dataset=_data(2, offset=100)
        )
    with pytest.raises(ValueError, match="need more examples than the calibration set holds"):
        CGRPOTrainer(
            **{**common, "args": _config(tmp_path, num_calibration_samples=5)},
            calibration_dataset=_data(2, offset=100),
            answer_extractor=str,
        )


def test_verifier_of_wrong_length_is_an_error(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, score="pass_rate", verifier=lambda completions, **kw: [True])
    with pytest.raises(ValueError, match="one bool per completion"):
        _score_batch(trainer)


def test_initial_thresholds_replace_the_first_calibration(tiny_model_dir, tmp_path):
    from cgrpo.calibration import Thresholds

    given = Thresholds(delta=0.2, qhat={2: 0.5, 4: 0.5, 8: 0.5}, solve_rate=0.9, n_calibration=4)
    trainer = CGRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=_length_reward,
        args=_config(tmp_path, recalibrate_every=2, max_steps=3),
        train_dataset=_data(32),
        calibration_dataset=_data(4, offset=100),
        answer_extractor=lambda text: "1",
        initial_thresholds=given,
        initial_calibration_rollouts=40,
    )
    trainer.train()
    assert [record["step"] for record in trainer.calibration_history] == [2]
    # The caller's calibration is logged at the first step, like one run by the trainer.
    steps = [entry for entry in trainer.state.log_history if "cgrpo/mean_k" in entry]
    assert [entry.get("cgrpo/calibration_rollouts") for entry in steps] == [40, None, 32]
    assert [entry["cgrpo/calibration_rollouts_total"] for entry in steps] == [40, 40, 72]
    with pytest.raises(ValueError, match="same grid"):
        CGRPOTrainer(
            model=tiny_model_dir,
            reward_funcs=_length_reward,
            args=_config(tmp_path),
            train_dataset=_data(8),
            calibration_dataset=_data(2, offset=100),
            answer_extractor=str,
            initial_thresholds=Thresholds(delta=0.2, qhat={2: 0.5}, solve_rate=0.9, n_calibration=4),
        )


def _raise(*args, **kwargs):
    raise RuntimeError("user code failed")


def test_an_extractor_that_raises_finds_no_answer_and_training_goes_on(tiny_model_dir, tmp_path, caplog):
    calls = []

    def extractor(text):
        # Call 1 is the trainer's check of the extractor at construction; calls 2 and 3 are the calibration's.
        calls.append(text)
        if len(calls) in (2, 3):
            raise RuntimeError("user code failed")
        return None

    trainer = _trainer(tiny_model_dir, tmp_path, extractor=extractor)
    with caplog.at_level("WARNING", logger="cgrpo.trainer"):
        output = _score_batch(trainer, prompts=2)
    # No answer is ever extracted, so no prompt stops early: calibration (4 x 8) and both groups (2 x 8) are drawn.
    assert trainer.cgrpo_totals["extraction_errors"] == 2 and len(calls) == 1 + 4 * 8 + 2 * 8
    assert output["completion_mask"].size(0) == 2 * 8
    assert caplog.text.count("user code failed") == 1


def test_a_verifier_that_raises_fails_its_completions_and_training_goes_on(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path, score="first_success", verifier=_raise)
    _score_batch(trainer, prompts=2)
    # One verifier call per calibration example and per increment of each prompt (2, 2, 4): 4 + 2 * 3.
    assert trainer.cgrpo_totals["verifier_errors"] == 4 + 2 * 3
    assert trainer.budget_histogram == {8: 2}


def test_a_verifier_that_hangs_fails_its_completions_after_its_timeout(tiny_model_dir, tmp_path, caplog):
    release = threading.Event()

    def hang_on_the_first_call(completions, **columns):
        if not hang_on_the_first_call.called:
            hang_on_the_first_call.called = True
            release.wait(60)
        return [True] * len(completions)

    hang_on_the_first_call.called = False
    trainer = _trainer(
        tiny_model_dir, tmp_path, score="first_success", verifier=hang_on_the_first_call, verifier_timeout_s=0.5
    )
    try:
        with caplog.at_level("WARNING", logger="cgrpo.trainer"):
            _score_batch(trainer, prompts=2)
    finally:
        release.set()
    # Only the first calibration call hung: it counts as fails, every later call passes, and training went on.
    assert trainer.cgrpo_totals["verifier_errors"] == 1
    assert "verifier did not return within 0.5 s" in caplog.text
    assert trainer.budget_histogram == {2: 2}


@pytest.mark.parametrize(
    ("reward", "message"),
    [
        (lambda completions, **kw: [1.0], "returned 1 rewards for 4 completions"),
        (lambda completions, **kw: ["good"] * len(completions), "returned 'good', not a number"),
    ],
)
def test_a_reward_function_must_return_one_number_per_completion(tiny_model_dir, tmp_path, reward, message):
    trainer = _trainer(tiny_model_dir, tmp_path, reward=reward)
    with pytest.raises(ValueError, match=message):
        _score_batch(trainer, prompts=2)
