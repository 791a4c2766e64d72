"""vLLM as the pipeline's generation backend: config/overrides/vllm_cpu.yaml, job environment, evaluation sampling.

The tests marked vllm run a real vLLM (its CPU build: `python -m pytest -q -m vllm` in the environment `.ci/run`
builds; without vLLM they skip with the reason). The others check the wiring without vLLM, in the main environment.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import run_smoke
from snakemake.utils import update_config, validate

from cgrpo.pipeline.configuration.checks import check_config
from cgrpo.pipeline.configuration.run_specs import evaluation_spec, train_spec
from cgrpo.pipeline.configuration.specs import TRAINING_ONLY_OPTIONS, calibration_spec, method_trainer
from cgrpo.pipeline.jobs import evaluation, vllm_backend
from cgrpo.pipeline.jobs.sampling import generate_completions, generate_completions_vllm, sampling_options
from cgrpo.pipeline.jobs.vllm_backend import (
    CPU_KV_CACHE_GIB,
    check_vllm_installed,
    load_llm,
    prepare_vllm_job,
    uses_vllm,
)
from cgrpo.pipeline.metrics.statistics import purpose_seed
from cgrpo.pipeline.tasks import get_task
from cgrpo.pipeline.tasks.splits import make_splits
from cgrpo.support.models import load_model, save_plain
from cgrpo.support.vllm_colocate import CPU_OPTIONS

REPO = Path(__file__).resolve().parents[1]
SMOKE, OVERRIDE = REPO / "config" / "smoke.yaml", REPO / "config" / "overrides" / "vllm_cpu.yaml"
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"
SHIPPED = REPO / "resources" / "base_model" / "arithmetic"
JOB_VARIABLES = ("VLLM_CPU_KVCACHE_SPACE", "MASTER_PORT", "VLLM_ENABLE_V1_MULTIPROCESSING")
GREEDY_PROMPTS = 24


def _planned(*paths: Path) -> dict:
    """The config Snakemake plans with `--configfile` `paths`: merged in order, defaults filled, checked."""
    config = {}
    for path in paths:
        update_config(config, yaml.safe_load(path.read_text()))
    validate(config, schema=str(SCHEMA))
    check_config(config)
    return config


# ------------------------------------------------------------------------------------ wiring, without vLLM


def test_the_override_turns_on_colocated_vllm_with_the_cpu_options_and_vllm_evaluation():
    config = _planned(SMOKE, OVERRIDE)
    for method in ("cgrpo", "grpo", "dapo"):
        trainer = method_trainer(config, method)
        assert trainer["use_vllm"] and trainer["vllm_mode"] == "colocate"
        assert {key: trainer[key] for key in CPU_OPTIONS} == CPU_OPTIONS
    assert evaluation_spec(config, "grpo_s0_G8", "model", "splits").evaluation["backend"] == "vllm"
    # vLLM's CPU attention rejects the smoke's own model (head size 16): the shipped one has 32.
    assert not config["base_model"]["bootstrap"] and config["base_model"]["path"] == "resources/base_model/arithmetic"


def test_only_runs_training_with_vllm_carry_the_streaming_option_in_their_specs():
    # The option changes nothing with HF generate, so the specs (and cached results) of such runs stay as they were.
    run, grid = "cgrpo_s0_g2-4-8_dauto_r1", "2-4-8"
    for paths, streams in (((SMOKE,), None), ((SMOKE, OVERRIDE), True)):
        config = _planned(*paths)
        assert train_spec(config, run, "model", "splits", "cal.json").cgrpo.get("stream_increments") is streams
        assert "stream_increments" not in calibration_spec(config, grid, 0, "model", "splits").cgrpo


def test_the_calibration_job_alone_samples_with_vllm_when_told():
    config = _planned(SMOKE)
    # Unset, the calibration samples as C-GRPO's training does, and its spec is what it was before the option.
    sampling = {k: v for k, v in method_trainer(config, "cgrpo").items() if k not in TRAINING_ONLY_OPTIONS}
    assert calibration_spec(config, "2-4-8", 0, "m", "s").trainer == sampling
    config["cgrpo"]["calibration_backend"] = "vllm"
    trainer = calibration_spec(config, "2-4-8", 0, "m", "s").trainer
    assert trainer == {**sampling, "use_vllm": True, "vllm_mode": "colocate", **CPU_OPTIONS}
    assert uses_vllm({"trainer": trainer})
    assert not train_spec(config, "cgrpo_s0_g2-4-8_dauto_r1", "m", "s", "cal.json").trainer.get("use_vllm")
    # A vLLM option the config sets is kept over the CPU default.
    config["training"]["vllm_max_model_length"] = 512
    assert calibration_spec(config, "2-4-8", 0, "m", "s").trainer["vllm_max_model_length"] == 512
    del config["training"]["vllm_max_model_length"]
    # Off CPU the engine keeps TRL's options.
    config["training"]["use_cpu"] = False
    assert "vllm_gpu_memory_utilization" not in calibration_spec(config, "2-4-8", 0, "m", "s").trainer
    # Each seed's calibration seeds its engine's samples with its own seed (tests/test_vllm.py draws them): accepted.
    config["cgrpo"]["calibrate_per_seed"] = True
    check_config(config)
    config["cgrpo"]["calibration_backend"] = "vllms"
    with pytest.raises(Exception, match="vllms"):
        validate(config, schema=str(SCHEMA))


def test_evaluation_samples_with_hf_generate_unless_told():
    config = _planned(SMOKE)
    assert evaluation_spec(config, "base", "model", "splits").evaluation["backend"] == "hf"
    config["evaluation"]["backend"] = "vllms"
    with pytest.raises(Exception, match="vllms"):
        validate(config, schema=str(SCHEMA))


@pytest.mark.parametrize("spec", [{"trainer": {"use_vllm": True}}, {"evaluation": {"backend": "vllm"}}])
def test_a_vllm_job_gets_a_kv_cache_a_port_and_an_engine_in_process(spec, monkeypatch):
    for name in JOB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    prepare_vllm_job(spec)
    assert uses_vllm(spec)
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == str(CPU_KV_CACHE_GIB)
    assert 0 < int(os.environ["MASTER_PORT"]) < 2**16
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_a_job_keeps_the_environment_it_was_given_but_the_port_and_others_are_left_alone(monkeypatch):
    for name, value in zip(JOB_VARIABLES, ("4", "29500", "1")):
        monkeypatch.setenv(name, value)
    prepare_vllm_job({"trainer": {"use_vllm": True}})
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "4" and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    # An inherited port is every concurrent job's, so each job takes its own.
    assert os.environ["MASTER_PORT"] != "29500"
    for name in JOB_VARIABLES:
        monkeypatch.delenv(name)
    prepare_vllm_job({"trainer": {"use_vllm": False}, "evaluation": {"backend": "hf"}})
    assert not any(name in os.environ for name in JOB_VARIABLES)


def test_vllm_sampling_options_seed_every_sample_apart():
    options = {"num_samples": 4, "temperature": 0.7, "max_new_tokens": 12}
    seeds = [
        option["seed"] + j
        for purpose in ("eval", "calibration")
        for seed in (0, 1)
        for option in sampling_options(5, seed=purpose_seed(seed, purpose), **options)
        for j in range(4)
    ]
    assert len(set(seeds)) == len(seeds) == 2 * 2 * 5 * 4
    first = sampling_options(5, seed=7, **options)
    assert first == sampling_options(5, seed=7, **options)
    assert {(o["n"], o["temperature"], o["top_k"], o["top_p"], o["max_tokens"]) for o in first} == {
        (4, 0.7, 0, 1.0, 12)
    }
    # vLLM's seeds are signed 64-bit.
    assert sampling_options(2, seed=2**63 - 1, **options)[1]["seed"] == 3
    assert sampling_options(3, greedy=True, **options) == [{"n": 1, "temperature": 0.0, "max_tokens": 12}] * 3
    with pytest.raises(ValueError, match="positive temperature"):
        sampling_options(1, num_samples=2, temperature=0.0, max_new_tokens=4)


def test_vllm_evaluation_samples_each_purpose_from_its_own_seed(tiny_model_dir, tmp_path, monkeypatch):
    # vLLM stands in as HF generate on the same model, so both backends must write the same record.
    from test_evaluation import EVALUATION_SETTINGS as settings
    from transformers import AutoModelForCausalLM, AutoTokenizer

    pool = get_task("arithmetic", num_examples=64, seed=0).load()
    make_splits(pool, tmp_path / "splits", sizes={"calibration": 4, "eval": 4}, seed=0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, padding_side="left")
    calls = []

    def fake_vllm(llm, prompts, **options):
        assert llm == ("engine on", tiny_model_dir)
        calls.append(options)
        return generate_completions(model, tokenizer, prompts, batch_size=4, **options)

    monkeypatch.setattr(evaluation, "load_llm", lambda path: ("engine on", path))
    monkeypatch.setattr(evaluation, "generate_completions_vllm", fake_vllm)
    spec = {
        "run": "base",
        "task": {"name": "arithmetic", "options": {}},
        "model": tiny_model_dir,
        "splits": str(tmp_path / "splits"),
        "seed": 3,
    }
    records = []
    for backend in ("vllm", "hf"):
        evaluation.evaluate_model({**spec, "evaluation": {**settings, "backend": backend}}, tmp_path / "record.json")
        records.append(json.loads((tmp_path / "record.json").read_text()))
        del records[-1]["eval_wall_s"]
    assert records[0] == records[1]
    assert [(call["seed"], call["greedy"], call["num_samples"]) for call in calls] == [
        (purpose_seed(3, "greedy"), True, 1),
        (purpose_seed(3, "eval"), False, 4),
        (purpose_seed(3, "calibration"), False, 4),
    ]


def test_dry_run_with_the_override_plans_every_job(tmp_path):
    from test_workflow import job_counts, snakemake

    (tmp_path / "resources").symlink_to(REPO / "resources")
    result = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(SMOKE), str(OVERRIDE))
    assert result.returncode == 0, result.stdout[-3000:]
    counts = job_counts(result.stdout)
    assert counts["train_cgrpo"] == 1 and counts["train"] == 3 and counts["evaluate"] >= 5


def test_a_run_that_needs_vllm_where_it_is_missing_stops_before_its_first_job(tmp_path, monkeypatch):
    with_vllm, without = _planned(SMOKE, OVERRIDE), _planned(SMOKE)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "vllm" else find_spec(name))
    with pytest.raises(ValueError, match="sets use_vllm and evaluation.backend: vllm, but vLLM is not installed"):
        check_vllm_installed(with_vllm)
    check_vllm_installed(without)
    without["cgrpo"]["calibration_backend"] = "vllm"
    with pytest.raises(ValueError, match="sets cgrpo.calibration_backend: vllm, but vLLM is not installed"):
        check_vllm_installed(without)
    monkeypatch.undo()
    # A dry run plans it anywhere (above); a run fails at once, with the fix, before any job.
    if importlib.util.find_spec("vllm") is not None:
        return
    from test_workflow import snakemake

    (tmp_path / "resources").symlink_to(REPO / "resources")
    result = snakemake(tmp_path, "--cores", "1", "--configfile", str(SMOKE), str(OVERRIDE))
    assert result.returncode != 0, result.stdout[-3000:]
    assert "hf_generate.yaml for calibration and evaluation" in result.stdout, result.stdout[-3000:]
    assert not (tmp_path / "results" / "vllm_cpu" / "base_model").exists()


# ------------------------------------------------------------------------------------ with a real vLLM


@pytest.fixture(scope="module")
def vllm_installed():
    pytest.importorskip("vllm", reason="vLLM is not installed: .ci/run builds the environment these tests need")


@pytest.fixture(scope="module")
def vllm_smoke_run(vllm_installed, tmp_path_factory):
    """The smoke config with config/overrides/vllm_cpu.yaml run through Snakemake on 2 cores: (workdir, output).

    VLLM_CPU_KVCACHE_SPACE is left out of the environment: the jobs must set it themselves.
    """
    workdir = tmp_path_factory.mktemp("smoke-vllm")
    (workdir / "resources").symlink_to(REPO / "resources")
    saved = os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    try:
        result = run_smoke(
            workdir, "--workflow-profile", "none", "--cores", "2", "--configfile", str(SMOKE), str(OVERRIDE)
        )
    finally:
        if saved is not None:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = saved
    assert result.returncode == 0, result.stdout[-5000:]
    return workdir, result.stdout


@pytest.mark.vllm
@pytest.mark.slow
def test_smoke_pipeline_with_vllm_end_to_end(vllm_smoke_run):
    results = vllm_smoke_run[0] / "results" / "vllm_cpu"
    summary = pd.read_csv(results / "tables" / "summary.csv")
    assert set(summary["method"]) == {"base", "cgrpo", "grpo", "dapo"}
    for column in ("eval_greedy_acc", "eval_maj_acc"):
        assert summary[column].map(math.isfinite).all() and summary[column].between(0, 1).all(), column
    trained = [path for path in results.glob("runs/*/run.json") if "reused_from" not in json.loads(path.read_text())]
    assert {json.loads(path.read_text())["method"] for path in trained} == {"cgrpo", "grpo", "dapo"}
    for path in trained:
        # TRL logs the sampler's importance ratio only for completions vLLM generated (C-GRPO's second step trains on
        # the first step's generation batch, and logs none).
        ratio = pd.read_csv(path.parent / "steps.csv")["sampling/importance_sampling_ratio/mean"]
        assert len(ratio) == 2 and ratio.map(math.isfinite).any(), path.parent.name
    evaluation_logs = list((results / "logs" / "evaluate").glob("*.log"))
    assert len(evaluation_logs) == len(summary)
    for log in evaluation_logs:
        assert "sampling with the vllm backend" in log.read_text(), log.name


@pytest.fixture(scope="module")
def engine(vllm_installed):
    """A vLLM engine on the shipped model, as evaluation builds it, and prompts of the arithmetic task."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))
    task = get_task("arithmetic", num_examples=64)
    prompts = list(task.to_prompt_dataset(task.load("train")).select(range(GREEDY_PROMPTS))["prompt"])
    return load_llm(str(SHIPPED)), task, prompts


@pytest.mark.vllm
def test_greedy_evaluation_through_vllm_answers_as_hf_generate(engine):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llm, task, prompts = engine
    options = dict(num_samples=2, temperature=1.0, max_new_tokens=40, greedy=True)
    with_vllm = generate_completions_vllm(llm, prompts, **options)
    model = AutoModelForCausalLM.from_pretrained(SHIPPED).eval()
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED, padding_side="left")
    with_hf = generate_completions(model, tokenizer, prompts, **options)
    answers = [[task.extract(text) for text in texts] for texts in with_vllm]
    assert answers == [[task.extract(text) for text in texts] for texts in with_hf]
    # Answers that all agreed, or were all missing, would not show a backend's mistakes.
    assert len({row[0] for row in answers}) > GREEDY_PROMPTS // 2 and None not in {row[0] for row in answers}
    assert all(len(row) == 2 and row[0] == row[1] for row in answers)


@pytest.mark.vllm
def test_vllm_sampling_is_seeded_per_call_and_varies_within_a_prompt(engine):
    llm, _, prompts = engine
    options = dict(num_samples=8, temperature=1.0, max_new_tokens=40)
    first = generate_completions_vllm(llm, prompts, seed=purpose_seed(0, "eval"), **options)
    assert generate_completions_vllm(llm, prompts, seed=purpose_seed(0, "eval"), **options) == first
    assert generate_completions_vllm(llm, prompts, seed=purpose_seed(0, "calibration"), **options) != first
    assert all(len(texts) == 8 for texts in first) and any(len(set(texts)) > 1 for texts in first)


@pytest.mark.vllm
def test_seeded_sampling_of_more_prompt_tokens_than_an_engine_step_takes(engine):
    # 24 prompts four times as long, 8 samples each: some 6,500 prompt tokens against a step budget of 4,096. A
    # prefill split across steps made the CPU engine rewind its seeded generators, and crash.
    llm, _, prompts = engine
    long_prompts = [" ".join([prompt] * 4) for prompt in prompts]
    completions = generate_completions_vllm(llm, long_prompts, num_samples=8, temperature=1.0, max_new_tokens=8, seed=1)
    assert [len(texts) for texts in completions] == [8] * len(prompts)


@pytest.mark.vllm
def test_vllm_evaluates_a_lora_adapter_as_hf_generate_does(engine, tmp_path, monkeypatch):
    from test_plain_checkpoints import _adapter
    from transformers import AutoTokenizer

    _, task, prompts = engine
    _adapter(str(SHIPPED), tmp_path / "adapter")
    # The adapter is served on its base through vLLM's LoRA support: no merged copy is written (#57).
    saved = []
    monkeypatch.setattr(
        vllm_backend, "save_plain", lambda model, folder: saved.append(folder) or save_plain(model, folder)
    )
    llm = load_llm(str(tmp_path / "adapter"))
    assert vllm_backend.serves_lora() and saved == []
    assert llm.lora is not None and llm.llm.llm_engine.vllm_config.lora_config is not None
    options = dict(num_samples=1, temperature=1.0, max_new_tokens=40, greedy=True)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "adapter", padding_side="left")

    def answers(completions):
        return [task.extract(texts[0]) for texts in completions]

    with_vllm = answers(generate_completions_vllm(llm, prompts, **options))
    with_hf = answers(generate_completions(load_model(tmp_path / "adapter").eval(), tokenizer, prompts, **options))
    base = answers(generate_completions(load_model(SHIPPED).eval(), tokenizer, prompts, **options))
    assert with_vllm == with_hf
    # Otherwise an engine that dropped the adapter would pass.
    assert with_hf != base


@pytest.mark.vllm
def test_the_calibration_job_samples_an_adapter_with_a_colocated_engine(vllm_installed, tmp_path, monkeypatch):
    from test_plain_checkpoints import _adapter

    from cgrpo.pipeline.jobs import runs, trainers

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))
    _adapter(str(SHIPPED), tmp_path / "adapter")
    config = _planned(SMOKE)
    config["cgrpo"]["calibration_backend"] = "vllm"
    task = get_task("arithmetic", **config["task"]["options"])
    make_splits(task.load(), tmp_path / "splits", sizes={"train": 4, "calibration": 8, "eval": 2}, seed=0)
    spec = calibration_spec(config, "2-4-8", 0, str(tmp_path / "adapter"), str(tmp_path / "splits"))
    built, saved = [], []
    monkeypatch.setattr(
        vllm_backend, "save_plain", lambda model, folder: saved.append(folder) or save_plain(model, folder)
    )
    build = trainers.calibration_trainer
    monkeypatch.setattr(trainers, "calibration_trainer", lambda *args: built.append(build(*args)) or built[-1])
    runs.calibrate_initial(spec.to_dict(), tmp_path / "calibration")
    record = json.loads((tmp_path / "calibration" / "thresholds.json").read_text())
    assert record["rollouts"] == 8 * 8 and record["tokens"] > 0
    assert {k: len(scores) for k, scores in record["scores"].items()} == {"2": 8, "4": 8, "8": 8}
    # The engine and the policy loaded the adapter merged into a plain copy, deleted once the trainer was built.
    (trainer,) = built
    assert trainer.use_vllm and trainer.vllm_generation.llm is not None
    assert len(saved) == 1 and not Path(saved[0]).exists() and trainer.model.name_or_path == saved[0]
