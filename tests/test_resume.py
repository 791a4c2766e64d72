"""A C-GRPO or dynamic sampling (DAPO) run stopped after a checkpoint and resumed from it ends exactly where an
uninterrupted run ends."""

from __future__ import annotations

import json
from functools import partial

import pytest
import torch
from datasets import Dataset
from test_dynamic_sampling import RecordingReward
from test_dynamic_sampling import _config as dynamic_sampling_config
from test_dynamic_sampling import _data as dynamic_sampling_data
from transformers import TrainerCallback

from cgrpo import CGRPOConfig, CGRPOTrainer, DynamicSamplingGRPOTrainer
from cgrpo.support.resume import state_file

STEPS, SAVE_EVERY, RECALIBRATE_EVERY = 6, 3, 2


class _StopAfter(TrainerCallback):
    """Ends training after a given step, as a preemption right after that step's checkpoint would."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step
        return control


def _trainer(model_dir, output_dir, callbacks=None, **options) -> CGRPOTrainer:
    data = Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(40)], "answer": ["1"] * 40})
    args = CGRPOConfig(
        **{
            "output_dir": str(output_dir),
            "use_cpu": True,
            "bf16": False,
            "budget_grid": [2, 4, 8],
            "per_device_train_batch_size": 16,
            "max_completion_length": 6,
            "max_steps": STEPS,
            "logging_steps": 1,
            "report_to": [],
            "save_strategy": "steps",
            "save_steps": SAVE_EVERY,
            "recalibrate_every": RECALIBRATE_EVERY,
            "seed": 0,
            "min_generation_prompts": 1,
            "conformal_delta": 0.3,
            **options,
        }
    )
    # The length's parity as the answer: about half the answers are right, prompts stop at different budgets, and the
    # randomized score and the stopping RNG matter.
    return CGRPOTrainer(
        model=model_dir,
        reward_funcs=lambda completions, **kw: [float(len(c) % 3) for c in completions],
        args=args,
        train_dataset=data.select(range(32)),
        calibration_dataset=data.select(range(32, 40)) if args.calibrated else None,
        answer_extractor=lambda text: str(len(text) % 2),
        callbacks=callbacks,
    )


def _dynamic_sampling_trainer(model_dir, output_dir, callbacks=None) -> DynamicSamplingGRPOTrainer:
    # Half the prompts have zero-variance groups, so most generation batches drop groups and refill from the stream.
    args = dynamic_sampling_config(output_dir, max_steps=STEPS, save_strategy="steps", save_steps=SAVE_EVERY)
    return DynamicSamplingGRPOTrainer(
        model=model_dir,
        reward_funcs=RecordingReward(),
        args=args,
        train_dataset=dynamic_sampling_data(),
        callbacks=callbacks,
    )


def _interrupted_and_resumed(make_trainer, output_dir):
    """Train with `make_trainer(output_dir, callbacks)` and stop one step after the checkpoint at SAVE_EVERY, as a kill
    then would; resume from that checkpoint to the end. Returns the resumed trainer and the checkpoint."""
    make_trainer(output_dir, callbacks=[_StopAfter(SAVE_EVERY + 1)]).train()
    checkpoint = output_dir / f"checkpoint-{SAVE_EVERY}"
    resumed = make_trainer(output_dir)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    return resumed, checkpoint


def _logs(trainer, prefixes: tuple[str, ...]) -> list[dict]:
    return [
        {k: v for k, v in entry.items() if k.startswith(prefixes) or k == "step"}
        for entry in trainer.state.log_history
        if "loss" in entry
    ]


def _weights(trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def _same_weights(first: list[torch.Tensor], second: list[torch.Tensor]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def _outcome(trainer: CGRPOTrainer) -> dict:
    """Everything a run decides and counts, without wall-clock seconds."""
    seconds = ("generation_s", "calibration_s", "holdout_s", "holdout_cpu_s")
    return {
        "logs": _logs(trainer, ("cgrpo/", "loss", "reward")),
        "calibrations": [
            {k: v for k, v in record.items() if k not in ("wall_s", "cpu_s")} for record in trainer.calibration_history
        ],
        "totals": {k: v for k, v in trainer.cgrpo_totals.items() if k not in seconds},
        "budgets": dict(trainer.budget_histogram),
        "weights": _weights(trainer),
    }


def _dynamic_sampling_outcome(trainer: DynamicSamplingGRPOTrainer) -> dict:
    """Everything a dynamic sampling run decides and counts, without wall-clock seconds."""
    return {
        "logs": _logs(trainer, ("dynamic/", "loss", "reward", "completions/", "grad_norm")),
        "totals": {k: v for k, v in trainer.dynamic_totals.items() if k != "generation_s"},
        "stream_position": trainer._sampler.stream.position,
        "weights": _weights(trainer),
    }


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    trainer = _trainer(tiny_model_dir, tmp_path_factory.mktemp("uninterrupted"))
    trainer.train()
    return _outcome(trainer)


@pytest.mark.long
def test_resumed_run_equals_an_uninterrupted_one(tiny_model_dir, tmp_path, uninterrupted):
    resumed, checkpoint = _interrupted_and_resumed(partial(_trainer, tiny_model_dir), tmp_path)
    saved = json.loads(state_file(checkpoint, "cgrpo", 0).read_text())
    assert saved["last_calibration_step"] == 2 and len(saved["calibration_history"]) == 2
    outcome = _outcome(resumed)
    # Calibrations at steps 0, 2 and 4: the one at 2 came from the checkpoint, the one at 4 ran after resuming.
    assert [record["step"] for record in outcome["calibrations"]] == [0, 2, 4]
    assert [entry["step"] for entry in outcome["logs"]] == list(range(1, STEPS + 1))
    for key in ("logs", "calibrations", "totals", "budgets"):
        assert outcome[key] == uninterrupted[key], key
    assert _same_weights(outcome["weights"], uninterrupted["weights"])


def test_resumed_calibration_free_run_equals_an_uninterrupted_one(tiny_model_dir, tmp_path):
    make_trainer = partial(_trainer, tiny_model_dir, stopping_rule="share")
    uninterrupted = make_trainer(tmp_path / "uninterrupted")
    uninterrupted.train()
    expected = _outcome(uninterrupted)
    resumed, checkpoint = _interrupted_and_resumed(make_trainer, tmp_path / "interrupted")
    saved = json.loads(state_file(checkpoint, "cgrpo", 0).read_text())
    assert saved["thresholds"] is None and saved["calibration_history"] == []
    outcome = _outcome(resumed)
    # Prompts stopped at different budgets, before and after the checkpoint, with no calibration at all.
    assert len(outcome["budgets"]) > 1 and outcome["totals"]["calibration_rollouts"] == 0
    assert resumed.thresholds is None and outcome["calibrations"] == []
    for key in ("logs", "totals", "budgets"):
        assert outcome[key] == expected[key], key
    assert _same_weights(outcome["weights"], expected["weights"])


@pytest.mark.long
def test_resumed_dynamic_sampling_run_equals_an_uninterrupted_one(tiny_model_dir, tmp_path):
    make_trainer = partial(_dynamic_sampling_trainer, tiny_model_dir)
    uninterrupted = make_trainer(tmp_path / "uninterrupted")
    uninterrupted.train()
    expected = _dynamic_sampling_outcome(uninterrupted)

    resumed, checkpoint = _interrupted_and_resumed(make_trainer, tmp_path / "interrupted")
    outcome = _dynamic_sampling_outcome(resumed)
    saved = json.loads(state_file(checkpoint, "dynamic_sampling", 0).read_text())
    # Refills were drawn both before the checkpoint and after it, so the resumed run continued the stream.
    assert 0 < saved["stream_position"] < outcome["stream_position"]
    assert 0 < saved["totals"]["groups_dropped"] < outcome["totals"]["groups_dropped"]
    assert [entry["step"] for entry in outcome["logs"]] == list(range(1, STEPS + 1))
    for key in ("logs", "totals", "stream_position"):
        assert outcome[key] == expected[key], key
    assert _same_weights(outcome["weights"], expected["weights"])


def test_a_checkpoint_without_cgrpo_state_is_a_clear_error(tiny_model_dir, tmp_path):
    _trainer(tiny_model_dir, tmp_path, callbacks=[_StopAfter(SAVE_EVERY)]).train()
    checkpoint = tmp_path / f"checkpoint-{SAVE_EVERY}"
    state_file(checkpoint, "cgrpo", 0).unlink()
    with pytest.raises(FileNotFoundError, match="holds no C-GRPO state"):
        _trainer(tiny_model_dir, tmp_path).train(resume_from_checkpoint=str(checkpoint))
