"""Bad input to `CGRPOConfig` and `CGRPOTrainer` caught at construction, before a model is trained: a grid out of order
or of one budget, an answer extractor of the wrong return type, a calibration set too small for any threshold below 1
or shared with the training set, and an extractor that fails on every completion."""

from __future__ import annotations

import logging

import pytest
from datasets import Dataset

from cgrpo import CGRPOConfig, CGRPOTrainer
from cgrpo.calibration import fit_thresholds, unanimous_solve_counts
from cgrpo.trainer_checks import check_extractions, check_held_out


def _data(n: int, offset: int = 0) -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [f"{i}+{i}=" for i in range(offset, offset + n)],
            "answer": [str(2 * i) for i in range(offset, offset + n)],
        }
    )


def _config(tmp_path, **overrides) -> CGRPOConfig:
    options = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        budget_grid=[2, 4],
        per_device_train_batch_size=8,
        max_completion_length=4,
        max_steps=1,
        report_to=[],
        save_strategy="no",
    )
    return CGRPOConfig(**{**options, **overrides})


def _trainer(model_dir, tmp_path, calibration: Dataset, extractor=lambda text: None, **overrides) -> CGRPOTrainer:
    return CGRPOTrainer(
        model=model_dir,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=_config(tmp_path, **overrides),
        train_dataset=_data(16),
        calibration_dataset=calibration,
        answer_extractor=extractor,
    )


# ------------------------------------------------------------------------------------------------------ the grid


def test_a_grid_out_of_order_is_refused_not_sorted(tmp_path):
    with pytest.raises(ValueError, match=r"budget_grid \[4, 2\] is not increasing; list the budgets in increasing"):
        _config(tmp_path, budget_grid=[4, 2])
    assert _config(tmp_path, budget_grid=[2, 4]).budget_grid == [2, 4]


def test_a_grid_of_one_budget_is_refused(tmp_path):
    # No prompt could stop before the only budget: the run would be GRPO at G = 4 under C-GRPO's name.
    with pytest.raises(ValueError, match=r"grid \[4\] holds one budget, so no prompt can stop before it"):
        _config(tmp_path, budget_grid=[4], per_device_train_batch_size=4)


# ------------------------------------------------------------------------------------------------ the extractor


def test_an_extractor_returning_a_list_is_refused_at_construction(tmp_path):
    # re.findall's list of matches: its text never equals a gold answer, so every outcome would count as wrong.
    with pytest.raises(TypeError, match=r"answer_extractor returned a list \(\[\]\), not an answer; return the final"):
        _trainer("unused-model-path", tmp_path, _data(4, offset=100), extractor=lambda text: [])


def test_an_extractor_that_refuses_empty_text_is_left_to_training(tiny_model_dir, tmp_path):
    def extractor(text):
        return text.split("#### ")[1]

    trainer = _trainer(tiny_model_dir, tmp_path, _data(32, offset=100), extractor=extractor)
    assert trainer.answer_extractor is extractor


def test_an_extractor_that_raised_on_every_completion_stops_the_run():
    with pytest.raises(ValueError, match="answer_extractor raised on all 64 completions of the calibration at step 0"):
        check_extractions(64, 64, "the calibration at step 0")
    # One answer found is a policy that rarely answers, not a broken extractor.
    check_extractions(63, 64, "the calibration at step 0")
    check_extractions(0, 0, "a batch without completions")


# ------------------------------------------------------------------------------------------- the calibration set


def test_a_calibration_set_shared_with_training_is_refused():
    with pytest.raises(ValueError, match=r"calibration_dataset shares 8 of its 8 prompts with train_dataset"):
        check_held_out([dict(row) for row in _data(8)], _data(16))
    with pytest.raises(ValueError, match=r"shares 1 of its 4 prompts with train_dataset \(the first: '15\+15='\)"):
        check_held_out([dict(row) for row in _data(4, offset=15)], _data(16))
    check_held_out([dict(row) for row in _data(4, offset=100)], _data(16))


def test_a_shared_prompt_is_quoted_whole_words_and_closed():
    long = [{"prompt": " ".join(["seventeen"] * 20) + " =", "answer": "0"}]
    with pytest.raises(ValueError) as refused:
        check_held_out(long, Dataset.from_dict({"prompt": [long[0]["prompt"]]}))
    quoted = str(refused.value).split("(the first: ")[1].split(")")[0]
    # Cut at a word, marked as cut, and the quote closed.
    assert quoted.startswith("'seventeen seventeen") and quoted.endswith(" ...'") and len(quoted) <= 82


def test_conversational_prompts_are_compared_as_messages():
    messages = [[{"role": "user", "content": f"{i}+{i}="}] for i in range(4)]
    train = Dataset.from_dict({"prompt": messages})
    with pytest.raises(ValueError, match="shares 1 of its 1 prompts"):
        check_held_out([{"prompt": [{"content": "2+2=", "role": "user"}]}], train)
    check_held_out([{"prompt": [{"role": "user", "content": "9+9="}]}], train)


@pytest.mark.parametrize("margin", [0.0, 0.05, 0.1, 0.2])
@pytest.mark.parametrize("n", [4, 8, 16, 18, 32, 100])
def test_unanimous_solve_counts_are_those_of_fit_thresholds(n, margin):
    # The warning computes without scores what the automatic delta does with them: check it against the real fit.
    expected = []
    for solved in range(1, n):
        scores = [0.5] * solved + [1.0] * (n - solved)
        if fit_thresholds({2: scores, 4: scores}, None, margin).qhat[4] == 1.0:
            expected.append(solved)
    assert unanimous_solve_counts(n, margin) == expected


def test_a_calibration_set_too_small_for_any_threshold_below_one_warns(tiny_model_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="cgrpo.trainer_checks"):
        _trainer(tiny_model_dir, tmp_path, _data(8, offset=100), delta_margin=0.05)
    message = (
        "With 8 calibration examples fitting the thresholds and delta_margin=0.05, the automatic delta leaves every "
        "threshold at 1 whenever the policy solves 4 to 7 of them within max(budget_grid), and C-GRPO then stops a "
        "prompt only when all its answers agree (the unanimous rule); calibrate on at least 18 examples or raise "
        "delta_margin to 0.098."
    )
    assert [record.getMessage() for record in caplog.records] == [message]
    # Both fixes it names hold: 18 examples at this margin, or this margin on 8 examples.
    assert not [solved for solved in unanimous_solve_counts(18, 0.05) if solved > 9]
    assert not [solved for solved in unanimous_solve_counts(8, 0.098) if solved > 4]
    assert [solved for solved in unanimous_solve_counts(17, 0.05) if solved > 8.5]


def test_two_calibration_examples_warn_as_eight_do(tiny_model_dir, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="cgrpo.trainer_checks"):
        _trainer(tiny_model_dir, tmp_path, _data(2, offset=100), delta_margin=0.05, budget_grid=[2, 4])
    [record] = caplog.records
    assert record.getMessage().startswith(
        "With 2 calibration examples fitting the thresholds and delta_margin=0.05, the automatic delta leaves every "
        "threshold at 1 whenever the policy solves 1 of them"
    )
    assert "raise delta_margin to 0.167" in record.getMessage()
    # The margin it names is one fix: one solved example of two then leaves a threshold below 1 possible.
    assert unanimous_solve_counts(2, 0.05) == [1] and unanimous_solve_counts(2, 0.167) == []


@pytest.mark.parametrize(
    "overrides",
    [
        # The default experiment's calibration: 32 prompts at margin 0.2.
        {"delta_margin": 0.2, "num_calibration_samples": 32},
        # A fixed delta asks for no coverage the solve rate sets.
        {"conformal_delta": 0.5},
        # The calibration-free rules read no calibration set.
        {"stopping_rule": "unanimous"},
    ],
)
def test_a_calibration_set_large_enough_does_not_warn(tiny_model_dir, tmp_path, caplog, overrides):
    with caplog.at_level(logging.WARNING, logger="cgrpo.trainer_checks"):
        _trainer(tiny_model_dir, tmp_path, _data(32, offset=100), **overrides)
    assert not caplog.records


# ------------------------------------------------------------------------------------- in training, at first use


def test_a_calibration_set_shared_with_training_is_refused_at_construction(tmp_path):
    # Refused before the model loads: the path below names no model.
    with pytest.raises(ValueError, match="calibration_dataset shares 4 of its 4 prompts with train_dataset"):
        _trainer("unused-model-path", tmp_path, _data(4, offset=12))


def _train(model_dir, tmp_path, extractor, **overrides) -> CGRPOTrainer:
    trainer = _trainer(model_dir, tmp_path, _data(4, offset=100), extractor=extractor, **overrides)
    trainer.train()
    return trainer


def test_a_reward_function_that_raises_stops_the_run_before_the_calibration(tiny_model_dir, tmp_path):
    def broken_reward(completions, answer, **kwargs):
        return [float(completion == answer[0]) / 0 for completion in completions]

    trainer = CGRPOTrainer(
        model=tiny_model_dir,
        reward_funcs=broken_reward,
        args=_config(tmp_path),
        train_dataset=_data(16),
        calibration_dataset=_data(8, offset=100),
        answer_extractor=lambda text: None,
    )
    with pytest.raises(
        ValueError,
        match=r"reward function broken_reward raised ZeroDivisionError \(float division by zero\) on an empty completion",
    ):
        trainer.train()
    # Checked before any rollout: the calibration drew none.
    assert trainer.cgrpo_totals["calibration_rollouts"] == 0 and not trainer.calibration_history


def test_an_extractor_returning_a_list_for_a_completion_stops_training(tiny_model_dir, tmp_path):
    # None for empty text passes the check at construction; the first completion with text shows the list.
    with pytest.raises(TypeError, match=r"answer_extractor returned a list \(\["):
        _train(tiny_model_dir, tmp_path, lambda text: [text] if text else None)


def _always_raise(text):
    raise KeyError("answer")


def test_an_extractor_that_fails_on_every_calibration_completion_stops_training(tiny_model_dir, tmp_path):
    # 4 calibration prompts x 4 completions (the largest budget).
    with pytest.raises(ValueError, match="answer_extractor raised on all 16 completions of the calibration at step 0"):
        _train(tiny_model_dir, tmp_path, _always_raise)


def test_an_extractor_that_fails_on_every_completion_of_the_first_batch_stops_training(tiny_model_dir, tmp_path):
    # A calibration-free rule has no calibration: the first generation batch (2 prompts, 2 to 4 completions each).
    with pytest.raises(ValueError, match=r"answer_extractor raised on all \d+ completions of the first generation"):
        _train(tiny_model_dir, tmp_path, _always_raise, stopping_rule="unanimous")
