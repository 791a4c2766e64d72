"""vLLM in the pipeline's jobs: the environment of a job that runs an engine, and evaluation's engine.

vLLM is imported only where an engine is built, so the rest loads without it.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ...support.models import adapter_config, is_plain, save_plain
from ...support.vllm_colocate import CPU_OPTIONS

logger = logging.getLogger(__name__)

# The adapter ranks vLLM's engine takes (`max_lora_rank`); an adapter's rank is served at the next one up.
LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
# GiB of KV cache per engine on CPU, where VLLM_CPU_KVCACHE_SPACE sizes it; unset, each engine reserves
# vllm_gpu_memory_utilization of the whole machine's memory, however many jobs run side by side.
CPU_KV_CACHE_GIB = 1


def uses_vllm(spec: Mapping[str, Any]) -> bool:
    """Whether the job of `spec` (a step spec as a dict) runs vLLM: training with `use_vllm`, or vLLM evaluation."""
    return bool(spec.get("trainer", {}).get("use_vllm")) or spec.get("evaluation", {}).get("backend") == "vllm"


def check_vllm_installed(config: Mapping[str, Any]) -> None:
    """Raise a ValueError naming the fix when `config` generates with vLLM (`training.use_vllm`, a method's
    `trainer.use_vllm`, or `evaluation.backend: vllm`) and vLLM cannot be imported here.

    The workflow calls it as it starts running jobs, not when it plans them: a dry run, or a cluster's planning node,
    need not have vLLM, but a local run would otherwise train for an hour before its first evaluation failed.
    """
    trainers = [config["training"], *(config[section]["trainer"] for section in ("cgrpo", "grpo", "dapo"))]
    wanted = []
    if any(trainer.get("use_vllm") for trainer in trainers):
        wanted.append("use_vllm")
    if config["cgrpo"].get("calibration_backend") == "vllm":
        wanted.append("cgrpo.calibration_backend: vllm")
    if config["evaluation"].get("backend") == "vllm":
        wanted.append("evaluation.backend: vllm")
    if wanted and importlib.util.find_spec("vllm") is None:
        raise ValueError(
            f"The config sets {' and '.join(wanted)}, but vLLM is not installed in this environment: run it in the "
            'vLLM environment (docs/clusters.md, "vLLM"), or sample with HF generate instead '
            "(config/overrides/hf_generate.yaml for calibration and evaluation)."
        )


def prepare_vllm_job(spec: Mapping[str, Any]) -> None:
    """Set the environment a job of `spec` needs before it builds a vLLM engine; values set before are kept, but for
    MASTER_PORT, which every job gets anew."""
    if not uses_vllm(spec):
        return
    # Only vLLM's CPU platform reads it.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))
    # A colocated engine joins a one-process torch.distributed group on MASTER_PORT. TRL takes the first free port of
    # a fixed list, which jobs starting side by side all find free, and a port inherited from Snakemake's environment
    # is every job's: either way all but one job fail with EADDRINUSE. Each job is one process, so no rank needs it.
    os.environ["MASTER_PORT"] = str(_free_port())
    # Evaluation's engine runs in the job's process, as a colocated one does: a spawned engine process would run the
    # job's script again, which has no main guard.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class Engine:
    """A vLLM engine and what it samples: the model it loaded, or its base with a LoRA adapter served on it (`lora`, a
    `vllm.lora.request.LoRARequest` that every call passes)."""

    llm: Any
    lora: Any = None


def load_llm(model: str, enforce_eager: bool | None = None) -> Engine:
    """A vLLM engine on `model`: on CPU with `CPU_OPTIONS`' memory share and in float32, as the HF path evaluates
    there; on a GPU with vLLM's defaults (half precision, as the HF path there).

    A LoRA adapter's folder is served on its base through vLLM's LoRA support, where the installed vLLM has it
    (`serves_lora`): no merged copy of the model is written. Otherwise, and for a GGUF file, which vLLM's CPU build
    does not read, the model is saved as a plain checkpoint (see `cgrpo.support.models.save_plain`: an adapter merged
    into a float32 copy of its base) for the engine to load, and deleted once it has. `enforce_eager` (default: on CPU)
    skips the model's compilation, which on CPU took 72 s of an 81 s start to save 0.03 s per rollout on SmolLM2-135M
    (results/reference/smollm2_cpu/generation_backends.csv): it pays only past some 2,500 rollouts.
    """
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    options = {"enforce_eager": on_cpu if enforce_eager is None else enforce_eager}
    if on_cpu:
        options.update(
            gpu_memory_utilization=CPU_OPTIONS["vllm_gpu_memory_utilization"],
            dtype="float32",
            # A prefill split across steps rewinds its seeded samples' generators, which a CPU generator cannot do
            # ("CPU Generator does not use offset"): more prompt tokens in one call than the engine's step budget
            # (4,096) crashed. Whole prefills only.
            enable_chunked_prefill=False,
        )
    from vllm import LLM

    adapter = adapter_config(model)
    if adapter is None or not serves_lora():
        with plain_copy(model) as folder:
            return Engine(LLM(model=folder, **options))
    from vllm.lora.request import LoRARequest

    rank = next(size for size in LORA_RANKS if size >= int(adapter["r"]))
    with plain_copy(adapter["base_model_name_or_path"]) as folder:
        llm = LLM(model=folder, enable_lora=True, max_loras=1, max_lora_rank=rank, **options)
    logger.info(
        "Serving the LoRA adapter %s on its base %s (no merged copy).", model, adapter["base_model_name_or_path"]
    )
    return Engine(llm, LoRARequest("adapter", 1, str(model)))


def serves_lora() -> bool:
    """Whether the installed vLLM serves LoRA adapters on this machine's platform (its CPU build has a punica
    wrapper for them since before 0.32)."""
    from vllm.platforms import current_platform

    return importlib.util.find_spec("vllm.lora") is not None and bool(current_platform.get_punica_wrapper())


@contextmanager
def plain_copy(model: str) -> Iterator[str]:
    """`model` itself where vLLM reads it, else a plain copy of it (see `cgrpo.support.models.save_plain`) in a scratch folder
    that lasts as long as the context: for an engine to load, which it does once."""
    if is_plain(model):
        yield model
        return
    with tempfile.TemporaryDirectory(prefix="cgrpo-vllm-") as folder:
        save_plain(model, folder)
        yield folder


def check_gpu_machine() -> None:
    """Raise a ValueError naming the fix unless torch sees a CUDA device and vLLM is installed: what a run meant to
    test the GPU paths needs before it starts any job."""
    import torch

    if not torch.cuda.is_available():
        raise ValueError(
            f"torch {torch.__version__} sees no CUDA device, so this run cannot test the GPU paths: run it on a GPU "
            'machine with CUDA torch and vLLM installed (docs/clusters.md, "Installing for GPUs").'
        )
    if importlib.util.find_spec("vllm") is None:
        raise ValueError(
            'vLLM is not installed, and the GPU paths generate with it: pip install -e ".[vllm]" (docs/clusters.md, '
            '"Installing for GPUs").'
        )
