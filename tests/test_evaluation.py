"""Evaluation on hand-built samples, its seed streams, and generated-versus-kept rollout counting in training."""

from __future__ import annotations

import json
import math

import pytest

from cgrpo.pipeline.jobs import evaluation
from cgrpo.pipeline.jobs.evaluation import conformal_metrics, fixed_k_metrics
from cgrpo.pipeline.jobs.sampling import generate_completions
from cgrpo.pipeline.tasks import get_task
from cgrpo.pipeline.tasks.splits import load_split, make_splits

GRID = [2, 4]
# Resolved evaluation settings (cgrpo.pipeline.configuration.specs.evaluation_settings) for a seconds-long evaluation.
EVALUATION_SETTINGS = {
    "budget_grid": [2, 4],
    "score": "aps",
    "temperature": 1.0,
    "max_new_tokens": 4,
    "batch_size": 4,
    "deltas": [0.5],
    "delta_margin": 0.05,
    "split_delta": False,
    "coverage_splits": 20,
    "statistics_seed": 0,
}
GOLDS = ["1", "2", "3", "4"]
# Four prompts with four sampled answers each (None = failed extraction).
ANSWERS = [
    ["1", "1", "1", "1"],  # always right
    ["2", "5", "2", "2"],  # mostly right
    ["9", "9", "3", None],  # right once, outvoted
    [None, None, "7", "8"],  # never right
]


def test_fixed_k_metrics_by_hand():
    record = fixed_k_metrics(ANSWERS, GOLDS, GRID)
    # maj@2: prompt 1 ("1"), prompt 2 (tie "2"/"5", first seen "2" wins) -> 2/4; maj@4: prompts 1 and 2 -> 2/4.
    assert record["maj_at_k"] == {2: 0.5, 4: 0.5}
    assert record["eval_maj_acc"] == 0.5
    # pass@2 per prompt: 1, 1 - C(1,2)/C(4,2) = 1, 1 - C(3,2)/C(4,2) = 0.5, 0 -> mean 0.625; pass@4: 1, 1, 1, 0.
    assert record["pass_at_k"] == {2: pytest.approx(0.625), 4: pytest.approx(0.75)}
    # mean@K: (4 + 3 + 1 + 0) / 16.
    assert record["mean_at_k"] == pytest.approx(0.5)


def test_conformal_metrics_separate_fixed_k_and_post_selection_coverage():
    settings = {
        "budget_grid": GRID,
        "deltas": [0.5],
        "delta_margin": 0.05,
        "split_delta": False,
        "coverage_splits": 20,
        "statistics_seed": 0,
    }
    calibration = [["1", "1", "1", "1"], ["2", "2", "2", "2"], ["3", "4", "3", "4"], ["5", "6", "7", "8"]]
    record = conformal_metrics(ANSWERS, GOLDS, calibration, ["1", "2", "3", "9"], settings, seed=0)
    modes = [entry["delta_mode"] for entry in record["conformal"]]
    assert modes == ["auto", 0.5]
    for entry in record["conformal"]:
        assert sum(entry["histogram"].values()) == 4
        assert 2 <= entry["mean_k"] <= 4
        assert 0.0 <= entry["coverage_post_selection"] <= 1.0
    rows = [row for row in record["coverage"] if row["delta_mode"] == 0.5]
    assert [row["k"] for row in rows] == GRID
    fixed = next(entry for entry in record["conformal"] if entry["delta_mode"] == 0.5)
    for row in rows:
        assert row["nominal"] == pytest.approx(0.5)
        assert row["ci_low"] <= row["coverage"] <= row["ci_high"]
        assert row["n_eval"] == 4
        assert row["qhat"] == fixed["qhat"][row["k"]]
        if row["qhat"] == 1.0:
            assert row["coverage"] == 1.0  # every score is at most 1: nothing tested at this k
    # One re-split row per threshold set and budget, each refitted 20 times on 4 of the 8 pooled prompts.
    splits = record["coverage_splits"]
    assert [(row["delta_mode"], row["k"]) for row in splits] == [(mode, k) for mode in modes for k in GRID]
    assert all(row["repeats"] == 20 and row["n_calibration"] == 4 and 0 <= row["mean"] <= 1 for row in splits)


def test_generated_not_kept_rollouts_are_counted(tiny_model_dir, tmp_path):
    from test_trainer import _score_batch, _trainer

    trainer = _trainer(tiny_model_dir, tmp_path, extractor=lambda text: "1")
    _score_batch(trainer, prompts=2)
    # TRL's groups are 8 rows wide (16 rows), but only the 2 x 2 completions drawn before stopping were generated.
    assert trainer.cgrpo_totals["train_rollouts"] == 4
    assert trainer.cgrpo_totals["groups"] == 2
    assert trainer.cgrpo_totals["calibration_rollouts"] == 4 * 8


def _evaluate_same_prompts(spec, out_path, monkeypatch):
    """Run evaluate_model with the eval split standing in for calibration too; return each generate_completions call."""
    calls = []

    def recording(model, tokenizer, prompts, **options):
        completions = generate_completions(model, tokenizer, prompts, **options)
        batches = math.ceil(len(prompts) * (1 if options["greedy"] else options["num_samples"]) / options["batch_size"])
        calls.append({"seeds": range(options["seed"], options["seed"] + batches), "completions": completions})
        return completions

    monkeypatch.setattr(evaluation, "generate_completions", recording)
    monkeypatch.setattr(evaluation, "load_split", lambda path, name: load_split(path, "eval"))
    evaluation.evaluate_model(spec, out_path)
    record = json.loads(out_path.read_text())
    del record["eval_wall_s"]
    return calls, record


def test_each_sampling_purpose_and_run_seed_has_its_own_stream(tiny_model_dir, tmp_path, monkeypatch):
    pool = get_task("arithmetic", num_examples=64, seed=0).load()
    make_splits(pool, tmp_path / "splits", sizes={"calibration": 4, "eval": 4}, seed=0)
    settings = EVALUATION_SETTINGS
    spec = {
        "run": "base",
        "task": {"name": "arithmetic", "options": {}},
        "model": tiny_model_dir,
        "splits": str(tmp_path / "splits"),
        "evaluation": settings,
    }
    runs = [
        _evaluate_same_prompts({**spec, "seed": seed}, tmp_path / f"{i}.json", monkeypatch)
        for i, seed in enumerate([0, 0, 1])
    ]
    (first, record), (again, record_again), (other_seed, _) = runs
    # Same spec, same samples and metrics.
    assert again == first and record_again == record
    # The record says what prompts showed besides their questions: nothing, at the task's defaults.
    assert record["prompt"] == {"chat": False, "system_prompt": None, "worked_examples": []}
    # The per-prompt outcomes behind the intervals average to the record's accuracies.
    for column, key in [
        ("eval_greedy_acc", "eval_greedy_acc"),
        ("eval_maj_acc", "eval_maj_acc"),
        ("eval_mean_at_k", "mean_at_k"),
    ]:
        assert len(record["per_prompt"][column]) == 4
        assert sum(record["per_prompt"][column]) / 4 == pytest.approx(record[key])
    # Calls are greedy, eval, calibration: the same prompts must get independent samples for eval and calibration.
    assert first[1]["completions"] != first[2]["completions"]
    # No batch seed (purpose seed + batch index) is shared between purposes or between run seeds 0 and 1.
    batch_seeds = [seed for call in first + other_seed for seed in call["seeds"]]
    assert len(set(batch_seeds)) == len(batch_seeds)


def test_a_replayed_model_keeps_more_samples_than_its_metrics_use(tmp_path, monkeypatch):
    # pool_samples 8 on grid [2, 4]: the first 4 samples of every prompt are right and the other 4 wrong, so metrics
    # that read past the 4th sample, or pools cut to 4, show.
    pool = get_task("arithmetic", num_examples=64, seed=0).load()
    make_splits(pool, tmp_path / "splits", sizes={"calibration": 4, "eval": 4}, seed=0)
    task = get_task("arithmetic")
    golds = {}
    for split in ("eval", "calibration"):
        rows = task.to_prompt_dataset(load_split(tmp_path / "splits", split))
        golds.update(zip(rows["prompt"], rows["answer"]))
    drawn = []

    def fake_generate(model, tokenizer, prompts, *, num_samples, greedy, **options):
        drawn.append(num_samples)
        right = 1 if greedy else 4
        return [[f"#### {golds[p]}"] * right + ["#### -1"] * (num_samples - right) for p in prompts]

    monkeypatch.setattr(evaluation, "generate_completions", fake_generate)
    monkeypatch.setattr(evaluation, "_load_model", lambda location: None)
    monkeypatch.setattr(evaluation, "load_tokenizer", lambda location, **options: None)
    settings = {**EVALUATION_SETTINGS, "pool_samples": 8}
    spec = {
        "run": "base",
        "task": {"name": "arithmetic", "options": {}},
        "model": "unused",
        "splits": str(tmp_path / "splits"),
        "seed": 0,
        "evaluation": settings,
    }
    evaluation.evaluate_model(spec, tmp_path / "record.json")
    record = json.loads((tmp_path / "record.json").read_text())
    assert drawn == [1, 8, 8]
    assert record["mean_at_k"] == 1.0 and record["eval_maj_acc"] == 1.0
    assert record["per_prompt"]["eval_mean_at_k"] == [1.0] * 4
    for split in ("eval", "calibration"):
        outcomes = record["pools"][split]["outcomes"]
        assert [row.count("-1") for row in outcomes] == [4] * 4 and {len(row) for row in outcomes} == {8}
