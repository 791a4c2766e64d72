"""The cost plan's GPU memory estimate: what each job that trains or calibrates the policy holds on its GPU.

Per job, in GiB (2^30 bytes), from the model's size (`model_size.ModelSize`) and the job's `GRPOConfig` options:

- the policy's weights: its parameters at the bytes of `model_init_kwargs.dtype` (TRL loads float32 where it is
  unset: `bf16: true` only autocasts the computation);
- training's state: with LoRA (`peft`), the adapters in float32 (PEFT's default) with their gradients and AdamW's two
  moments, 16 bytes a trainable parameter; without, a gradient and two moments a parameter in the policy's dtype, and
  with `beta` > 0 the reference model's weights;
- activations, roughly: a micro-batch's completion logits, their temperature-scaled copy and their gradient (3 x rows
  x completion tokens x vocabulary), and with gradient checkpointing the hidden state it keeps per layer and token plus
  one layer's activations while it is recomputed (34 bytes x hidden per token at 16 bits: Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models", eq. 1, without the attention scores that a fused
  attention kernel does not store), without it every layer's;
- generation: a colocated vLLM engine takes `vllm_gpu_memory_utilization` of the GPU, which must hold the weights in
  16 bits and the KV cache of the rows it runs at once (TRL caps them at a generation batch's rows, its
  `max_num_seqs`), 2 x layers x KV heads x head_dim x 2 bytes per token; HF generate holds that cache beside the
  policy and its training state between updates. With sleep mode the engine gives its share back during the update.

Rows are planned at prompt plus maximum completion tokens where the prompt tokens are given, else at
`vllm_max_model_length`, the most the engine admits. Not counted: the CUDA context, the allocator's fragmentation,
vLLM's activations and CUDA graphs, together a few GiB, so a plan that fits by less needs a margin. The evaluations
and the format check run an engine alone on their GPU at vLLM's default 90%, which holds what a training job's
smaller share holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from ..configuration.checks import generation_batch_size
from ..configuration.methods import METHODS, static_runs
from ..configuration.run_specs import train_spec
from ..configuration.specs import calibration_seed, calibration_trainer_options
from .model_size import ModelSize

__all__ = ["GIB", "JobMemory", "memory_jobs", "memory_table", "memory_warnings"]

GIB = 2**30
# Bytes a value of the policy's weights take by `model_init_kwargs.dtype`; unset (None), TRL loads float32.
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, None: 4}
# vLLM's weights and KV cache: the checkpoint's 16-bit dtype ("auto"; a float32 checkpoint runs in float16).
_ENGINE_BYTES = 2
# AdamW's two moments with the gradient, in float32 for LoRA adapters: 4 + 4 + 8 bytes besides the weight.
_LORA_STATE_BYTES = 16
# Bytes of one layer's activations per token and hidden unit at 16 bits (Korthikanti et al. 2022, eq. 1).
_LAYER_ACTIVATION_BYTES = 34
# TRL 1.16's GRPOConfig.max_completion_length where a config leaves it unset.
_TRL_COMPLETION = 512


@dataclass(frozen=True)
class JobMemory:
    """The GPU memory of one kind of job (`rule`, `jobs` of them alike), in GiB."""

    rule: str
    jobs: int
    # Rows per micro-batch (0 for a calibration, which does not train): GRPO's grow with its group size.
    micro_batch: int
    row_tokens: int
    weights_gib: float
    training_state_gib: float
    activations_gib: float
    hf_generation_gib: float
    vllm_share_gib: float
    vllm_needs_gib: float
    peak_gib: float
    fits: bool
    # What the warnings name: the engine's options and sizes, the dtype left unset.
    utilization: float
    sleep: bool
    engine_weights_gib: float
    row_kv_gib: float
    engine_rows: int
    dtype_unset: bool


def memory_jobs(
    config: Mapping[str, Any], model: ModelSize, gpu_gib: float, prompt_tokens: float = 0.0
) -> list[JobMemory]:
    """The memory of every calibration and training job of `config` on a GPU of `gpu_gib`, alike jobs merged."""
    trainer = calibration_trainer_options(config)
    calibration_rows = config["cgrpo"]["options"]["calibration_batch_size"]
    seeds = {calibration_seed(config, seed) for seed in config["seeds"]}
    estimates = [
        _estimate("calibrate", trainer, config["peft"], model, gpu_gib, prompt_tokens, calibration_rows, grid)
        for grid in config["cgrpo"]["budget_grids"]
        for _ in seeds
    ]
    for run in static_runs(config):
        spec = train_spec(config, run, "model", "splits", "initial-calibration")
        rule = "train_cgrpo" if METHODS[spec.method].calibrated else "train"
        estimates.append(_estimate(rule, spec.trainer, spec.peft, model, gpu_gib, prompt_tokens))
    merged: dict[JobMemory, int] = {}
    for estimate in estimates:
        merged[estimate] = merged.get(estimate, 0) + 1
    return [JobMemory(**{**asdict(estimate), "jobs": count}) for estimate, count in merged.items()]


def _estimate(
    rule: str,
    trainer: Mapping[str, Any],
    peft: Mapping[str, Any] | None,
    model: ModelSize,
    gpu_gib: float,
    prompt_tokens: float,
    calibration_rows: int | None = None,
    grid: list[int] | None = None,
) -> JobMemory:
    dtype = (trainer.get("model_init_kwargs") or {}).get("dtype")
    weight_bytes = _DTYPE_BYTES.get(model.dtype if dtype == "auto" else dtype, 4)
    completion = int(trainer.get("max_completion_length") or _TRL_COMPLETION)
    row_tokens = int(
        prompt_tokens + completion if prompt_tokens else trainer.get("vllm_max_model_length") or completion
    )
    generation_rows = generation_batch_size(trainer)
    if grid is not None:
        # A calibration call draws calibration_batch_size prompts x max(grid) rows (by default a generation batch's).
        generation_rows = (calibration_rows or max(1, generation_rows // max(grid))) * max(grid)
    activation_bytes = 2 if trainer.get("bf16", True) or trainer.get("fp16") or weight_bytes == 2 else 4
    weights = model.params * weight_bytes
    state = activations = 0.0
    micro_batch = 0 if grid is not None else int(trainer.get("per_device_train_batch_size", 8))
    if micro_batch:
        state = _training_state(model, peft, weight_bytes, float(trainer.get("beta") or 0.0))
        checkpointing = bool(trainer.get("gradient_checkpointing", True))
        activations = _activations(model, micro_batch, row_tokens, completion, activation_bytes, checkpointing)
    colocated = bool(trainer.get("use_vllm")) and trainer.get("vllm_mode", "colocate") == "colocate"
    row_kv = row_tokens * model.kv_bytes_per_token(_ENGINE_BYTES if colocated else activation_bytes)
    hf_generation = 0.0 if trainer.get("use_vllm") else generation_rows * row_kv
    # HF generate's cache and the update's activations come and go in turn.
    training_side = weights + state + max(activations, hf_generation)
    utilization = float(trainer.get("vllm_gpu_memory_utilization", 0.3)) if colocated else 0.0
    share = utilization * gpu_gib * GIB
    sleep = colocated and bool(trainer.get("vllm_enable_sleep_mode"))
    # TRL runs at most a generation batch's rows at once in its engine (max_num_seqs).
    engine_rows = min(generation_rows, generation_batch_size(trainer)) if colocated else 0
    engine_weights = model.params * _ENGINE_BYTES if colocated else 0.0
    # Asleep during the update, the engine holds nothing then; awake, beside the policy and its training state.
    peak = max(training_side, weights + state + share) if sleep else training_side + share
    return JobMemory(
        rule=rule,
        jobs=1,
        micro_batch=micro_batch,
        row_tokens=row_tokens,
        weights_gib=weights / GIB,
        training_state_gib=state / GIB,
        activations_gib=activations / GIB,
        hf_generation_gib=hf_generation / GIB,
        vllm_share_gib=share / GIB,
        vllm_needs_gib=(engine_weights + engine_rows * row_kv) / GIB,
        peak_gib=peak / GIB,
        fits=peak <= gpu_gib * GIB,
        utilization=utilization,
        sleep=sleep,
        engine_weights_gib=engine_weights / GIB,
        row_kv_gib=row_kv / GIB if colocated else 0.0,
        engine_rows=engine_rows,
        dtype_unset=dtype is None,
    )


def _training_state(model: ModelSize, peft: Mapping[str, Any] | None, weight_bytes: int, beta: float) -> float:
    if peft:
        # Unset, PEFT targets the query and value projections of the llama family.
        modules = peft.get("target_modules") or ["q_proj", "v_proj"]
        return model.lora_params(int(peft.get("r", 8)), modules) * _LORA_STATE_BYTES
    # A gradient and AdamW's two moments in the weights' dtype; with a KL term, TRL loads a reference model too.
    return model.params * weight_bytes * (3 + (beta > 0))


def _activations(
    model: ModelSize, rows: int, row_tokens: int, completion: int, activation_bytes: int, checkpointing: bool
) -> float:
    # The completion tokens' logits, their temperature-scaled copy, and their gradient.
    logits = 3 * rows * completion * model.vocab * activation_bytes
    layer = _LAYER_ACTIVATION_BYTES * activation_bytes / 2 * rows * row_tokens * model.hidden
    if checkpointing:
        return logits + model.layers * rows * row_tokens * model.hidden * activation_bytes + layer
    return logits + model.layers * layer


def memory_table(jobs: list[JobMemory]) -> pd.DataFrame:
    """The estimate as the plan prints it: one row per kind of job."""
    shown = [
        "rule",
        "jobs",
        "micro_batch",
        "row_tokens",
        "weights_gib",
        "training_state_gib",
        "activations_gib",
        "hf_generation_gib",
        "vllm_share_gib",
        "vllm_needs_gib",
        "peak_gib",
        "fits",
    ]
    return pd.DataFrame([asdict(job) for job in jobs])[shown]


def memory_warnings(jobs: list[JobMemory], gpu_gib: float) -> list[str]:
    """One sentence per way the jobs do not fit, each naming its fixes."""
    warnings = []
    if any(job.dtype_unset for job in jobs):
        warnings.append(
            "training.model_init_kwargs.dtype is unset, so TRL loads the policy in float32, 4 bytes a parameter "
            "(bf16: true only autocasts the computation): set it to bfloat16."
        )
    for job in jobs:
        batches = f", {job.micro_batch}-row micro-batches" if job.micro_batch else ""
        name = f"{job.rule} ({job.jobs} job{'s' if job.jobs > 1 else ''}{batches})"
        free = job.vllm_share_gib - job.engine_weights_gib
        if job.utilization and free < job.row_kv_gib:
            warnings.append(
                f"{name}: vLLM's share of {job.vllm_share_gib:.1f} GiB (vllm_gpu_memory_utilization "
                f"{job.utilization:g}) cannot hold the model's {job.engine_weights_gib:.1f} GiB of weights and the "
                f"KV cache of one {job.row_tokens:,}-token row, so the engine will not start: raise "
                "vllm_gpu_memory_utilization or use a GPU with more memory."
            )
        elif job.utilization and job.vllm_needs_gib > job.vllm_share_gib:
            warnings.append(
                f"{name}: vLLM's share of {job.vllm_share_gib:.1f} GiB holds the KV cache of "
                f"{int(free / job.row_kv_gib):,} of the {job.engine_rows:,} rows of {job.row_tokens:,} tokens it runs "
                f"at once ({job.vllm_needs_gib:.1f} GiB with its weights), so they run in waves, slower than "
                "throughputs measured without: raise vllm_gpu_memory_utilization, use a GPU with more memory, or "
                "generate fewer rows at once (per_device_train_batch_size x steps_per_generation)."
            )
        if not job.fits:
            warnings.append(
                f"{name}: needs about {job.peak_gib:.1f} GiB at its peak, more than the GPU's {gpu_gib:g} GiB: use a "
                "GPU with more memory, a smaller per_device_train_batch_size (with more gradient_accumulation_steps), "
                "or, beside a colocated engine, a lower vllm_gpu_memory_utilization or vllm_enable_sleep_mode."
            )
    return warnings
