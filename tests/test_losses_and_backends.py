"""Padding leaves no trace in the update: every TRL loss type exactly, and the vLLM path with a fake backend."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_trainer import _score_batch, _trainer
from trl import GRPOTrainer

LOSS_TYPES = ["grpo", "dapo", "bnpo", "dr_grpo", "cispo", "sapo", "luspo", "vespo"]
PER_ROW_LOSSES = {"grpo", "sapo", "luspo", "dr_grpo"}


def _gradient(loss_fn, trainer, inputs) -> torch.Tensor:
    trainer.model.zero_grad()
    loss_fn(trainer.model, inputs).backward()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


def _window_gradient(trainer, micro_batches: list[dict]) -> torch.Tensor:
    """C-GRPO's gradient accumulated over one optimizer step made of `micro_batches`, one generation batch."""
    trainer.args.steps_per_generation = trainer.current_gradient_accumulation_steps = len(micro_batches)
    trainer._buffered_inputs = micro_batches
    trainer.model.zero_grad()
    for step, inputs in enumerate(micro_batches):
        trainer._step = step
        trainer.compute_loss(trainer.model, inputs).backward()
    trainer.args.steps_per_generation = trainer.current_gradient_accumulation_steps = 1
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


def _trl_only(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k not in ("num_real_rows", "filler_rows")}


def _with_fillers(batch: dict, fillers: int) -> dict:
    """The batch plus masked filler rows, as `_drop_padded_rows` leaves them for equal micro-batches."""
    rows = batch["advantages"].size(0)
    index = torch.cat([torch.arange(rows), torch.zeros(fillers, dtype=torch.long)])
    padded = {k: v[index] if torch.is_tensor(v) and v.dim() > 0 and v.size(0) == rows else v for k, v in batch.items()}
    padded["completion_mask"][rows:] = 0
    padded["advantages"][rows:] = 0
    padded["filler_rows"] = torch.arange(rows + fillers) >= rows
    return padded


def _fillers_only(batch: dict) -> dict:
    """A micro-batch as wide as `batch` made only of masked filler rows."""
    empty = _with_fillers(batch, fillers=batch["advantages"].size(0))
    half = batch["advantages"].size(0)
    return {
        k: v[half:] if torch.is_tensor(v) and v.dim() > 0 and v.size(0) == 2 * half else v for k, v in empty.items()
    }


@pytest.fixture(scope="module", params=[0.0, 0.04], ids=["beta0", "beta0.04"])
def scored(request, tiny_model_dir, tmp_path_factory):
    trainer = _trainer(
        tiny_model_dir,
        tmp_path_factory.mktemp("loss"),
        extractor=lambda text: "1",
        per_device_train_batch_size=24,
        beta=request.param,
        max_completion_length=8,
    )
    trainer.current_gradient_accumulation_steps = 1
    batch = _score_batch(trainer, prompts=3)
    assert batch["advantages"].abs().sum() > 0  # a batch without signal would make every gradient equal
    assert not batch["filler_rows"].any()
    return trainer, batch


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_padding_gradient_equals_unpadded_gradient(scored, loss_type):
    trainer, batch = scored
    trainer.loss_type = loss_type
    padded = _with_fillers(batch, fillers=2)
    reference = _gradient(lambda m, x: GRPOTrainer.compute_loss(trainer, m, x), trainer, _trl_only(batch))
    ours = _window_gradient(trainer, [padded])
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)
    if loss_type in PER_ROW_LOSSES:
        # Without the reweighting, TRL's row-normalised losses shrink by real rows / all rows.
        plain = _gradient(lambda m, x: GRPOTrainer.compute_loss(trainer, m, x), trainer, _trl_only(padded))
        torch.testing.assert_close(plain, reference * 6 / 8, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("entropy_coef", [0.0, 0.1], ids=["no-entropy", "entropy0.1"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_a_micro_batch_of_fillers_only_leaves_the_gradient_unchanged(scored, loss_type, entropy_coef):
    # The window [real rows, fillers only] must update like the real micro-batch alone: TRL would average bnpo's and
    # the entropy bonus's micro-batch means over both, halving them.
    trainer, batch = scored
    if entropy_coef and not hasattr(trainer, "_entropy_bonus_enabled"):
        pytest.skip("this TRL has no entropy bonus")
    trainer.loss_type = loss_type
    if entropy_coef:
        trainer.entropy_coef, trainer._entropy_bonus_enabled = entropy_coef, True
    try:
        alone = _window_gradient(trainer, [batch])
        window = _window_gradient(trainer, [batch, _fillers_only(batch)])
        trl_window = _trl_window_gradient(trainer, [batch, _fillers_only(batch)])
    finally:
        trainer.entropy_coef, trainer._entropy_bonus_enabled = 0.0, False
    torch.testing.assert_close(window, alone, rtol=0, atol=1e-6)
    if loss_type == "bnpo" or entropy_coef:
        assert not torch.allclose(trl_window, alone, rtol=0, atol=1e-6)


def _trl_window_gradient(trainer, micro_batches: list[dict]) -> torch.Tensor:
    """TRL's own gradient over the same window, for contrast."""
    trainer.args.steps_per_generation = trainer.current_gradient_accumulation_steps = len(micro_batches)
    trainer.model.zero_grad()
    for inputs in micro_batches:
        GRPOTrainer.compute_loss(trainer, trainer.model, _trl_only(inputs)).backward()
    trainer.args.steps_per_generation = trainer.current_gradient_accumulation_steps = 1
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


def _record_scored_shapes(monkeypatch) -> list[tuple[int, int]]:
    """From now on, the (rows, columns) of every batch TRL's log-prob scoring gets, in order."""
    shapes = []
    score = GRPOTrainer._get_per_token_logps_and_entropies

    def recording(self, model, input_ids, *args, **kwargs):
        shapes.append(tuple(input_ids.shape))
        return score(self, model, input_ids, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", recording)
    return shapes


def _with_trailing_columns(batch: dict, columns: int) -> dict:
    """The batch with unused completion columns appended, as a micro-batch of a wider generation batch has them."""
    widened = dict(batch)
    for key in ("completion_ids", "completion_mask", "old_per_token_logps", "ref_per_token_logps"):
        if batch.get(key) is not None:
            value = batch[key]
            widened[key] = torch.cat([value, value.new_zeros((value.size(0), columns))], dim=1)
    return widened


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_unused_completion_columns_are_cut_and_leave_the_gradient_unchanged(scored, loss_type, monkeypatch):
    trainer, batch = scored
    trainer.loss_type = loss_type
    reference = _gradient(lambda m, x: GRPOTrainer.compute_loss(trainer, m, x), trainer, _trl_only(batch))
    scored = _record_scored_shapes(monkeypatch)
    ours = _window_gradient(trainer, [_with_trailing_columns(batch, 5)])
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-6)
    assert [width for _, width in scored] == [batch["prompt_ids"].size(1) + batch["completion_ids"].size(1)]


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo"])
def test_row_normalised_losses_train_with_filler_rows(tiny_model_dir, tmp_path, loss_type):
    trainer = _trainer(
        tiny_model_dir,
        tmp_path,
        loss_type=loss_type,
        per_device_train_batch_size=6,
        steps_per_generation=4,
        max_steps=4,
    )
    trainer.train()
    assert all(math.isfinite(entry.get("loss", 0.0)) for entry in trainer.state.log_history)


def test_padded_rows_skip_old_and_reference_log_prob_passes(tiny_model_dir, tmp_path, monkeypatch):
    # beta != 0 scores reference log-probs, and two steps per generation score old-policy ones.
    trainer = _trainer(tiny_model_dir, tmp_path, extractor=lambda text: "1", beta=0.04, steps_per_generation=2)
    scored = _record_scored_shapes(monkeypatch)
    batch = _score_batch(trainer, prompts=2)
    # Two prompts stop at k=2: 4 real rows of 16 are scored, once for the old policy and once for the reference.
    assert [rows for rows, _ in scored] == [4, 4]
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        expected, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, trainer.model, ids, mask, batch["completion_ids"].size(1)
        )
    real = batch["completion_mask"].bool()
    torch.testing.assert_close(batch["old_per_token_logps"][real], expected[real])


class FakeVLLM:
    """Stands in for TRL's vLLM helper: records each request and returns fixed completions with logprobs."""

    def __init__(self):
        self.requests: list[tuple[int, int]] = []
        # TRL's colocated engine, which a calibration seeds row by row; the fake's `generate` never calls it.
        self.llm = SimpleNamespace(generate=None)

    def sync_weights(self):
        pass

    def generate(self, prompts, images, num_generations, profiler=None):
        self.requests.append((len(prompts), num_generations))
        completion_ids = [[5, 6, 1] for _ in prompts]
        logprobs = [[[-0.5] for _ in ids] for ids in completion_ids]
        return prompts, completion_ids, logprobs, None


def _vllm_trainer(model_dir, tmp_path, **overrides):
    trainer = _trainer(model_dir, tmp_path, **overrides)
    trainer.use_vllm = True
    trainer.vllm_generation = FakeVLLM()
    trainer.vllm_importance_sampling_correction = True
    trainer._last_loaded_step = 0
    return trainer


@pytest.mark.parametrize(
    ("skip", "requests"),
    [
        # Calibration asks for 8 samples of 2 prompts; then increments of 2, 2 and 4 samples for both prompts.
        (False, [(16, 8), (4, 2), (4, 2), (8, 4)]),
        # No answer is ever extracted, so no budget below 8 can stop: after the first 2, the other 6 in one call.
        (True, [(16, 8), (4, 2), (12, 6)]),
    ],
)
def test_vllm_requests_one_call_per_increment_with_grouped_rows(tiny_model_dir, tmp_path, skip, requests):
    trainer = _vllm_trainer(
        tiny_model_dir,
        tmp_path,
        extractor=lambda text: None,
        num_calibration_samples=2,
        calibration_batch_size=2,
        skip_impossible_budgets=skip,
    )
    _score_batch(trainer, prompts=2)
    assert trainer.vllm_generation.requests == requests


def test_a_round_with_different_increments_asks_vllm_for_rows_grouped_by_their_common_divisor(tiny_model_dir, tmp_path):
    from cgrpo.calibration import Thresholds

    # Answers in call order: prompt 0 draws two failures (4 agreeing of 4 is out of reach: it skips to 8), prompt 1
    # draws a and b (3 of 4 could still agree: it draws 2 more), then failures only.
    answers = [iter([])]
    trainer = _vllm_trainer(tiny_model_dir, tmp_path, extractor=lambda text: next(answers[0], "") or None)
    answers[0] = iter(["", "", "a", "b"])  # from the first training draw on (construction probes the extractor)
    trainer.cgrpo_state.thresholds = Thresholds(
        delta=0.2, qhat={2: 1.0, 4: 0.75, 8: 1.0}, solve_rate=0.9, n_calibration=4
    )
    trainer.cgrpo_state.last_calibration_step = 0
    _score_batch(trainer, prompts=2)
    # Round 2 holds 6 rows of prompt 0 and 2 of prompt 1, in pairs; round 3 the last 4 of prompt 1.
    assert trainer.vllm_generation.requests == [(4, 2), (8, 2), (4, 4)]
    assert trainer.budget_histogram == {8: 2}


def test_vllm_padded_rows_get_unit_importance_ratio(tiny_model_dir, tmp_path):
    # Three prompts stop at k=2; steps_per_generation=4 keeps two padded rows as masked fillers.
    trainer = _vllm_trainer(
        tiny_model_dir, tmp_path, extractor=lambda text: "1", per_device_train_batch_size=6, steps_per_generation=4
    )
    batch = _score_batch(trainer, prompts=3)
    ratio = batch["importance_sampling_ratio"]
    assert ratio.size(0) == 8
    assert torch.all(ratio[6:] == 1.0)
    assert torch.all(torch.isnan(batch["sampling_per_token_logps"][6:, 0]))
    assert torch.all(batch["sampling_per_token_logps"][:6, :3] == -0.5)


def test_padded_rows_leave_completion_statistics(tiny_model_dir, tmp_path):
    trainer = _vllm_trainer(tiny_model_dir, tmp_path, extractor=lambda text: "1")
    _score_batch(trainer, prompts=2)
    metrics = trainer._metrics["train"]
    # Every real completion is the fake's three tokens; one-token padded rows would pull the minimum to 1.
    assert metrics["completions/min_length"] == [3.0]
    assert metrics["completions/mean_length"] == [3.0]
    assert metrics["completions/clipped_ratio"] == [0.0]
    assert set(trainer._logs["completion"]) != {""} and len(trainer._logs["completion"]) == 4


def test_reward_functions_see_real_rows_only(tiny_model_dir, tmp_path):
    seen = []

    def reward(completions, completion_ids, answer, **kwargs):
        seen.append((len(completions), len(completion_ids), len(answer)))
        kwargs["log_extra"]("length", [len(c) for c in completion_ids])
        return [1.0] * len(completions)

    trainer = _vllm_trainer(tiny_model_dir, tmp_path, extractor=lambda text: "1", reward=reward)
    _score_batch(trainer, prompts=2)
    # The probe before the calibration (one empty completion), then the batch's real rows.
    assert seen == [(1, 1, 1), (4, 4, 4)]
    assert list(trainer._logs["extra"]["length"]) == [3, 3, 3, 3]


def test_wrapped_reward_functions_keep_their_names(tiny_model_dir, tmp_path):
    import functools

    def correctness(completions, scale, **kwargs):
        return [scale] * len(completions)

    trainer = _trainer(tiny_model_dir, tmp_path, reward=[functools.partial(correctness, scale=1.0), _named_reward])
    assert trainer.reward_func_names == ["correctness", "_named_reward"]
    _score_batch(trainer)
    assert {"rewards/correctness/mean", "rewards/_named_reward/mean"} <= set(trainer._metrics["train"])


def _named_reward(completions, **kwargs):
    return [0.0] * len(completions)
