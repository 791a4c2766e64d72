"""vLLM colocate mode: the CPU build's eager engine, weight sync and whole prefills, and rows sampled with seeds of
their own.

On its CPU platform vLLM packs every linear layer's weight into a oneDNN (or AMX) kernel when it loads the model and
leaves an empty tensor in the weight's place, so TRL's colocate sync, which feeds each policy tensor to the model's
`load_weights`, fails (`'Parameter' object has no attribute 'weight_loader'`). vLLM's in-place reload restores the
layers it packed, loads the tensors and packs them again; `use_reloading_weight_sync` makes TRL's sync go through it.
GPU platforms keep TRL's own sync, whose unpacked weights it loads directly.

TRL seeds each colocated engine with its process index, so two runs that differ only in their seed draw the same
samples; `seeded_rows` gives each row of a generation call a seed of its own, which the caller derives from its run.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import partial
from importlib.util import find_spec
from typing import TYPE_CHECKING

from ..vllm_streaming import replaced

# The evaluation imports CPU_OPTIONS through the vLLM backend; TRL takes seconds to import, and only the annotation
# below needs it.
if TYPE_CHECKING:
    from trl import GRPOTrainer

# `GRPOConfig` options for colocate mode on CPU: vLLM's memory check rejects the GPU default utilization (0.9) on a
# small machine, and sizes the KV cache by the VLLM_CPU_KVCACHE_SPACE environment variable (GiB) instead; sleep mode
# needs a GPU; a short model length keeps the cache small.
CPU_OPTIONS = {"vllm_gpu_memory_utilization": 0.1, "vllm_enable_sleep_mode": False, "vllm_max_model_length": 256}


# Where a TRL release builds its colocated engine from (`LLM(...)`): 1.16's generation module, older releases' trainer.
_ENGINE_MODULES = ("trl.generation.vllm_generation", "trl.trainer.grpo_trainer")


@contextmanager
def eager_cpu_engine(args) -> Iterator[None]:
    """Within the block, a colocated engine TRL builds (for `args`) on vLLM's CPU platform computes in float32 and runs
    eagerly, as the evaluation's engine does (`cgrpo.pipeline.jobs.vllm_backend.load_llm`) and as the policy computes.

    TRL asks for the model's dtype, which vLLM's CPU platform takes as bfloat16, compiled with torch.compile, and takes
    no option against either. On a CPU without native bfloat16 (AVX2 only) vLLM's bfloat16 layers fall back to unpacked
    matmuls: SmolLM2-135M drew 32 seeded calibration rows in 83 s there, against 17 s in float32, and compiling added
    2.5 minutes to the engine's start (docs/real-model.md). GPU platforms keep TRL's engine.
    """
    if not (args is not None and args.use_vllm and args.vllm_mode == "colocate") or find_spec("vllm") is None:
        yield
        return
    from vllm.platforms import current_platform

    modules = [sys.modules[name] for name in _ENGINE_MODULES if hasattr(sys.modules.get(name), "LLM")]
    if not current_platform.is_cpu() or not modules:
        yield
        return
    engine = modules[0].LLM
    with ExitStack() as stack:
        for module in modules:
            stack.enter_context(replaced(module, "LLM", partial(engine, enforce_eager=True, dtype="float32")))
        yield


def use_reloading_weight_sync(trainer: GRPOTrainer) -> None:
    """Make `trainer`'s colocated vLLM reload the policy's weights in place when vLLM runs on CPU, and take whole
    prefills only (see `take_whole_prefills`); else do nothing."""
    if not (trainer.use_vllm and trainer.vllm_mode == "colocate"):
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    generation = trainer.vllm_generation
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner

    def sync_weights() -> None:
        # TRL's parameter walk gathers sharded (FSDP, DeepSpeed) and merges PEFT weights under vLLM's names.
        runner.reload_weights(weights_iterator=generation._iter_named_params())
        generation.llm.reset_prefix_cache()

    generation.sync_weights = sync_weights
    take_whole_prefills(generation.llm)


def take_whole_prefills(llm) -> None:
    """Make the CPU engine `llm` schedule whole prefills only, where its step budget holds its longest prompt.

    A prefill split across engine steps rewinds its seeded samples' generators, which a CPU generator cannot do
    ("CPU Generator does not use offset"): a call of seeded rows with more prompt tokens than a step takes (TRL sets
    4,096) crashed. TRL builds the engine with chunked prefill on and takes no option for it; the scheduler reads
    the setting at every step.
    """
    config = llm.llm_engine.vllm_config
    if config.model_config.max_model_len <= config.scheduler_config.max_num_batched_tokens:
        config.scheduler_config.enable_chunked_prefill = False


@contextmanager
def seeded_rows(trainer: GRPOTrainer, seeds: Sequence[int]) -> Iterator[None]:
    """Within the block, row i of each call `trainer` makes to its colocated engine samples with seed `seeds[i]`
    (rows past the list, such as the throwaway copies that keep processes in step, with TRL's parameters), so that
    what a call draws is set by the seeds, not by the engine's random state. Outside colocate mode it does nothing,
    and with tensor parallelism too, whose processes must send their engine the same requests (TRL gathers their
    prompts into each) while each would seed its own rows.
    """
    if not (trainer.use_vllm and trainer.vllm_mode == "colocate") or trainer.args.vllm_tensor_parallel_size > 1:
        yield
        return
    llm = trainer.vllm_generation.llm
    unseeded = llm.generate

    def seeded(prompts, sampling_params=None, *args, **kwargs):
        params = [sampling_params.clone() for _ in prompts]
        for row, seed in zip(params, seeds):
            row.seed = seed
        return unseeded(prompts, params, *args, **kwargs)

    with replaced(llm, "generate", seeded):
        yield
