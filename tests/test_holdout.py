"""The held-out coverage of each training calibration's thresholds (`calibration_holdout`): what it records, and that
its costs stay apart from the calibration's and training's."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset

from cgrpo import CGRPOConfig, CGRPOTrainer
from cgrpo.calibration import Thresholds
from cgrpo.trainer_state import CGRPOState

GRID = [2, 4, 8]
# Verifier outcomes per calibration-dataset example ("1" a pass): the 4 calibration examples pass first, so
# first_success scores 1/k at every k and, at delta 0.2 (the smallest 4 examples support), qhat_k = 1/k. Of the 4
# held-out examples, two pass first (scores 1/k, covered) and two do not (2/k and 1.0, never covered).
PATTERNS = ["10000000", "11111111", "10101010", "11000000", "11111111", "01111111", "00000000", "10000000"]


def _verifier(completions, index, **kwargs):
    return [PATTERNS[index][j] == "1" for j in range(len(completions))]


def _trainer(model_dir, tmp_path, calibration_size: int = 8, **overrides) -> CGRPOTrainer:
    options = {
        "output_dir": str(tmp_path),
        "use_cpu": True,
        "bf16": False,
        "budget_grid": GRID,
        "per_device_train_batch_size": 16,
        "max_completion_length": 4,
        "max_steps": 1,
        "logging_steps": 1,
        "report_to": [],
        "save_strategy": "no",
        "seed": 0,
        "score": "first_success",
        "recalibrate_every": 0,
        "min_generation_prompts": 1,
        "conformal_delta": 0.2,
        "num_calibration_samples": 4,
        "calibration_holdout": 4,
    }
    calibration = Dataset.from_dict(
        {"prompt": [f"{i}*2=" for i in range(calibration_size)], "index": list(range(calibration_size))}
    )
    train = Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(8)], "index": [1] * 8})
    return CGRPOTrainer(
        model=model_dir,
        reward_funcs=lambda completions, **kw: [float(len(c) % 2) for c in completions],
        args=CGRPOConfig(**{**options, **overrides}),
        train_dataset=train,
        calibration_dataset=calibration,
        verifier=_verifier,
    )


def test_each_calibration_records_its_thresholds_coverage_on_the_held_out_prompts(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path)
    trainer.train()
    [record] = trainer.calibration_history
    assert record["qhat"] == {k: pytest.approx(1 / k) for k in GRID}
    holdout = record["holdout"]
    assert holdout["coverage"] == {2: 0.5, 4: 0.5, 8: 0.5} and holdout["n"] == 4
    assert holdout["rollouts"] == 4 * 8 and holdout["tokens"] > 0 and holdout["wall_s"] > 0 and holdout["cpu_s"] >= 0
    totals = trainer.cgrpo_totals
    # The diagnostic's costs are counted apart: the calibration still cost its own 4 x 8 rollouts only.
    assert totals["calibration_rollouts"] == record["rollouts"] == 4 * 8
    assert totals["holdout_rollouts"] == 4 * 8 and totals["holdout_tokens"] == holdout["tokens"]
    assert totals["holdout_s"] == holdout["wall_s"] and totals["holdout_cpu_s"] == holdout["cpu_s"]
    # The record survives a checkpoint's JSON round trip, budgets as ints.
    restored = CGRPOState.from_dict(json.loads(json.dumps(trainer.cgrpo_state.to_dict())))
    assert restored.calibration_history == trainer.calibration_history


def test_holdout_coverage_checks_given_thresholds_as_the_pipeline_calls_it(tiny_model_dir, tmp_path):
    trainer = _trainer(tiny_model_dir, tmp_path)
    trainer.model.train()
    loose = Thresholds(delta=0.1, qhat={2: 1.0, 4: 0.5, 8: 0.125}, solve_rate=1.0, n_calibration=4)
    result = trainer.holdout_coverage(loose)
    # Held-out scores at k: 1/k, 1/k, 2/k and 1.0.
    assert result["coverage"] == {2: 1.0, 4: 0.75, 8: 0.5} and result["n"] == 4
    assert trainer.cgrpo_totals["holdout_rollouts"] == 32 and trainer.cgrpo_totals["calibration_rollouts"] == 0
    with pytest.raises(ValueError, match="budget_grid is"):
        trainer.holdout_coverage(Thresholds(delta=0.1, qhat={2: 1.0}, solve_rate=1.0, n_calibration=4))


def test_holdout_needs_enough_examples_and_is_off_by_default(tiny_model_dir, tmp_path):
    with pytest.raises(
        ValueError,
        match=r"plus calibration_holdout \(4\) need more examples than the calibration set "
        r"holds \(6\)",
    ):
        _trainer(tiny_model_dir, tmp_path, calibration_size=6)
    # Without num_calibration_samples, the calibration uses every example before the held-out ones.
    trainer = _trainer(tiny_model_dir, tmp_path, num_calibration_samples=None, calibration_holdout=3)
    assert len(trainer._calibration_examples) == 5 and [ex["index"] for ex in trainer._holdout_examples] == [5, 6, 7]
    off = _trainer(tiny_model_dir, tmp_path, calibration_holdout=0)
    assert off._holdout_examples == []
    with pytest.raises(ValueError, match="set calibration_holdout > 0"):
        off.holdout_coverage(Thresholds(delta=0.1, qhat={k: 1.0 for k in GRID}, solve_rate=1.0, n_calibration=4))


def test_the_held_out_draws_leave_the_calibration_untouched(tiny_model_dir, tmp_path):
    # Same seed with and without the diagnostic: the held-out prompts are scored after the calibration, so its
    # thresholds, rollouts and tokens are the same.
    runs = []
    for holdout in (0, 4):
        trainer = _trainer(tiny_model_dir, tmp_path / str(holdout), calibration_holdout=holdout)
        trainer.train()
        totals = trainer.cgrpo_totals
        runs.append((trainer.thresholds, totals["calibration_rollouts"], totals["calibration_tokens"]))
    assert runs[0] == runs[1]
