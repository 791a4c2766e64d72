"""The format-rate job: the share of the base model's answers the task's grader reads, before training."""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pytest
import yaml
from snakemake.utils import validate

from cgrpo.pipeline.configuration.specs import format_rate_spec
from cgrpo.pipeline.jobs import evaluation
from cgrpo.pipeline.jobs.format_rate import measure_format_rate
from cgrpo.pipeline.tasks import get_task
from cgrpo.pipeline.tasks.splits import load_split, make_splits

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
SHIPPED = str(REPO / "resources" / "base_model" / "arithmetic")


def _spec(splits: Path, prompts: int, samples: int, backend: str = "hf") -> dict:
    return {
        "model": SHIPPED,
        "splits": str(splits),
        "task": {"name": "arithmetic", "options": {}},
        "seed": 0,
        "prompts": prompts,
        "samples": samples,
        "evaluation": {"temperature": 1.0, "max_new_tokens": 40, "batch_size": 16, "backend": backend},
    }


@pytest.fixture
def splits(tmp_path) -> Path:
    pool = get_task("arithmetic", num_examples=64, seed=0).load()
    make_splits(pool, tmp_path / "splits", sizes={"train": 16, "calibration": 4, "eval": 4}, seed=0)
    return tmp_path / "splits"


def test_the_rate_is_the_share_of_completions_the_grader_reads(splits, tmp_path, monkeypatch, caplog):
    golds = [get_task("arithmetic").gold(answer) for answer in load_split(splits, "train")["answer"][:4]]
    drawn = []

    # Per prompt: the gold answer, a wrong one, and two the grader cannot read (a unit after the number, no marker).
    def scripted(model, tokenizer, prompts, *, num_samples, **options):
        drawn.append((len(prompts), num_samples, options["seed"]))
        return [[f"#### {gold}", "#### -1", f"#### {gold} pens", "it is 3"] for gold in golds[: len(prompts)]]

    monkeypatch.setattr(evaluation, "generate_completions", scripted)
    with caplog.at_level(logging.WARNING):
        measure_format_rate(_spec(splits, prompts=4, samples=4), tmp_path / "rate.csv", tmp_path / "rate.md")
    row = pd.read_csv(tmp_path / "rate.csv").iloc[0]
    assert drawn == [(4, 4, drawn[0][2])]
    assert (row["prompts"], row["samples_per_prompt"], row["completions"]) == (4, 4, 16)
    assert row["format_rate"] == pytest.approx(0.5)
    assert row["correct_share"] == pytest.approx(0.25)
    assert row["mean_prompt_tokens"] > 0 and row["mean_completion_tokens"] > 0
    assert (row["temperature"], row["max_new_tokens"], row["backend"]) == (1.0, 40, "hf")
    # At 0.5 the rate is not below the warning's line; the table is in markdown too.
    assert "give the prompt a system message" not in caplog.text
    assert (tmp_path / "rate.md").read_text().startswith("|")


def test_a_low_rate_is_a_warning_naming_the_fix(splits, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(
        evaluation, "generate_completions", lambda model, tok, prompts, *, num_samples, **o: [["no"] * num_samples] * 2
    )
    with caplog.at_level(logging.WARNING):
        measure_format_rate(_spec(splits, prompts=2, samples=3), tmp_path / "rate.csv", tmp_path / "rate.md")
    assert pd.read_csv(tmp_path / "rate.csv").iloc[0]["format_rate"] == 0
    assert "task.options.system_prompt, worked_examples" in caplog.text


def test_the_shipped_model_samples_the_first_training_prompts_repeatably(splits, tmp_path):
    tables = []
    for name in ("a", "b"):
        measure_format_rate(_spec(splits, prompts=20, samples=2), tmp_path / f"{name}.csv", tmp_path / f"{name}.md")
        tables.append(pd.read_csv(tmp_path / f"{name}.csv").drop(columns="wall_s"))
    # The train split holds 16 prompts: all of them, 2 samples each; the same seed draws the same samples.
    assert tables[0].iloc[0]["prompts"] == 16 and tables[0].iloc[0]["completions"] == 32
    pd.testing.assert_frame_equal(tables[0], tables[1])
    # The shipped model writes the graded form most of the time (0.89 on the default's 32 prompts).
    assert tables[0].iloc[0]["format_rate"] > 0.5


def test_the_spec_samples_as_the_base_models_evaluation_does():
    config = yaml.safe_load((REPO / "config" / "smollm2_cpu.yaml").read_text())
    validate(config, schema=str(SCHEMA))
    spec = format_rate_spec(config, "model", "splits")
    assert (spec.prompts, spec.samples, spec.seed) == (32, 2, config["splits"]["seed"])
    # The training temperature and completion length, and the evaluation's backend (vLLM for SmolLM2).
    assert spec.evaluation == {"temperature": 0.5, "max_new_tokens": 48, "batch_size": 64, "backend": "vllm"}
    assert spec.task["options"]["worked_examples"] == 3
