"""Shared fixtures: a tiny random causal LM and a character tokenizer, built offline in seconds."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

CHARACTERS = "0123456789+-*/=#.:?, abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\n'"


def set_config_key(config: dict, dotted: str, value) -> None:
    """Set `config`'s key at the dotted path ("cgrpo.options.score") to `value`, as an edited config file would."""
    *parents, key = dotted.split(".")
    for parent in parents:
        config = config[parent]
    config[key] = value


def build_tiny_model(path, seed: int = 0) -> str:
    """Save a random 2-layer Qwen2 model and a character-level tokenizer to `path`; return the path."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    specials = ["<pad>", "<eos>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials + list(CHARACTERS))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    fast.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


# Settings for a bootstrap that takes seconds: far too small to learn arithmetic, but it exercises every step.
TINY_BOOTSTRAP = dict(
    seed=0,
    num_examples=64,
    batch_size=16,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    warmup_steps=0,
)


@pytest.fixture(scope="session")
def bootstrapped_model_dir(tmp_path_factory):
    """A base model built by `cgrpo.pipeline.jobs.base_model.bootstrap_base_model` on a tiny budget."""
    from cgrpo.pipeline.jobs.base_model import bootstrap_base_model

    return bootstrap_base_model(tmp_path_factory.mktemp("bootstrapped-model"), **TINY_BOOTSTRAP)


REPO = Path(__file__).resolve().parents[1]
# A safety net against a hung run, not a speed target: the smoke run takes about 2 minutes on 2 idle cores.
SMOKE_TIMEOUT_S = 1200


def run_smoke(workdir: Path, *args: str, timeout: float = SMOKE_TIMEOUT_S) -> subprocess.CompletedProcess:
    """The smoke config's Snakemake run in `workdir` (no profile unless `args` names one); stdout and stderr merged."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(REPO / "config" / "smoke.yaml"),
        *args,
    ]
    return subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=timeout, check=False
    )


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> tuple[Path, str]:
    """The smoke pipeline run once locally, on 2 cores, for every test that checks its results: (workdir, output)."""
    workdir = tmp_path_factory.mktemp("smoke-local")
    result = run_smoke(workdir, "--workflow-profile", "none", "--cores", "2")
    assert result.returncode == 0, result.stdout[-5000:]
    return workdir, result.stdout


SLURM_PROFILE = REPO / "workflow" / "profiles" / "slurm-local"
PARTITION = "local"


def cluster_problem() -> str | None:
    """Why this machine cannot run the test, or None."""
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        return "sbatch or squeue not found, no SLURM here (start a local cluster: bash scripts/slurm-local.sh start)"
    try:
        result = subprocess.run(
            ["sinfo", "--noheader", "--partition", PARTITION, "--format", "%t"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"the SLURM cluster does not answer sinfo: {error}"
    if result.returncode != 0:
        return f"the SLURM cluster does not answer sinfo: {result.stderr.strip()}"
    states = result.stdout.split()
    if not any(state.rstrip("*~#") in {"idle", "mix", "alloc"} for state in states):
        return (
            f"SLURM partition {PARTITION!r} has no node up (sinfo node states: {states or 'none'}); "
            "start a local cluster: bash scripts/slurm-local.sh start"
        )
    return None


def load_script(path: Path, name: str):
    """The module of a script outside the package (benchmarks/*.py), imported from its file."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def require_cluster() -> None:
    """Skip the calling test with the reason when no cluster answers; fail instead where CGRPO_REQUIRE_SLURM is set
    (.ci/run sets it after starting one, so a cluster that stopped answering cannot pass CI as skips)."""
    problem = cluster_problem()
    if problem and os.environ.get("CGRPO_REQUIRE_SLURM"):
        pytest.fail(f"CGRPO_REQUIRE_SLURM is set but {problem}")
    if problem:
        pytest.skip(problem)


def run_two_ranks(script: Path, model_dir: str, out: Path) -> list[dict]:
    """Run `script <model_dir> <out>` on two CPU processes (torchrun, gloo); return each rank's `rank<i>.json`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(script),
        model_dir,
        str(out),
    ]
    result = subprocess.run(command, env=env, cwd=out, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
