"""vLLM colocate mode on CPU: the weight sync that survives vLLM's packed CPU linear layers.

On its CPU platform vLLM packs every linear layer's weight into a oneDNN (or AMX) kernel when it loads the model and
leaves an empty tensor in the weight's place, so TRL's colocate sync, which feeds each policy tensor to the model's
`load_weights`, fails (`'Parameter' object has no attribute 'weight_loader'`). vLLM's in-place reload restores the
layers it packed, loads the tensors and packs them again; `use_reloading_weight_sync` makes TRL's sync go through it.
GPU platforms keep TRL's own sync, whose unpacked weights it loads directly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# The evaluation imports CPU_OPTIONS through the vLLM backend; TRL takes seconds to import, and only the annotation
# below needs it.
if TYPE_CHECKING:
    from trl import GRPOTrainer

# `GRPOConfig` options for colocate mode on CPU: vLLM's memory check rejects the GPU default utilization (0.9) on a
# small machine, and sizes the KV cache by the VLLM_CPU_KVCACHE_SPACE environment variable (GiB) instead; sleep mode
# needs a GPU; a short model length keeps the cache small.
CPU_OPTIONS = {"vllm_gpu_memory_utilization": 0.1, "vllm_enable_sleep_mode": False, "vllm_max_model_length": 256}


def use_reloading_weight_sync(trainer: GRPOTrainer) -> None:
    """Make `trainer`'s colocated vLLM reload the policy's weights in place when vLLM runs on CPU; else do nothing."""
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
