"""Batched, seeded sampling of completions from a causal LM, with HF generate or a vLLM engine."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import GenerationConfig

# vLLM's sampling seeds are signed 64-bit integers.
_VLLM_SEEDS = 2**63


def _check(num_samples: int, temperature: float, max_new_tokens: int, batch_size: int, greedy: bool) -> None:
    if num_samples < 1 or max_new_tokens < 1 or batch_size < 1:
        raise ValueError(
            f"num_samples, max_new_tokens and batch_size must be positive, got {num_samples}, {max_new_tokens}, "
            f"{batch_size}; pass values of at least 1."
        )
    if not greedy and temperature <= 0:
        raise ValueError(f"Sampling needs a positive temperature, got {temperature}; use greedy=True instead of 0.")


def as_text(tokenizer, prompt: str | list[dict]) -> str:
    """Plain prompts pass through; conversational ones are rendered with the tokenizer's chat template."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


@contextmanager
def _seeded(seed: int, device: torch.device):
    """Seed every RNG for the block, then restore the caller's RNG state."""
    accelerators = [] if device.type == "cpu" else [device]
    with torch.random.fork_rng(devices=accelerators, device_type=device.type):
        torch.manual_seed(seed)
        yield


def _generation_config(model, tokenizer, *, greedy: bool, temperature: float, max_new_tokens: int):
    """A complete generation config, so sampling never inherits a checkpoint's own defaults.

    Like TRL's GRPO, sampling is plain temperature sampling: no top-k, top-p or repetition penalty
    (instruct checkpoints such as Qwen2.5 ship all three in their ``generation_config``).
    """
    eos = model.generation_config.eos_token_id
    options = dict(
        max_new_tokens=max_new_tokens,
        eos_token_id=eos if eos is not None else tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        repetition_penalty=1.0,
    )
    if greedy:
        return GenerationConfig(do_sample=False, **options)
    return GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, **options)


@torch.inference_mode()
def _generate_batch(model, tokenizer, texts: list[str], generation_config: GenerationConfig) -> list[str]:
    inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left").to(model.device)
    output = model.generate(**inputs, generation_config=generation_config)
    return tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def generate_completions(
    model,
    tokenizer,
    prompts: list[str] | list[list[dict]],
    *,
    num_samples: int,
    temperature: float,
    max_new_tokens: int,
    greedy: bool = False,
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = False,
) -> list[list[str]]:
    """Sample ``num_samples`` completions for each prompt; returns one list of texts per prompt.

    Prompts are left-padded and batched ``batch_size`` sequences at a time; texts are decoded without
    special tokens. Batch ``i`` is sampled under ``torch.manual_seed(seed + i)`` inside a forked RNG,
    so results depend only on the arguments and the global RNG is left untouched. With ``greedy``
    each prompt is decoded once and its completion repeated ``num_samples`` times.
    """
    _check(num_samples, temperature, max_new_tokens, batch_size, greedy)
    copies = 1 if greedy else num_samples
    texts = [as_text(tokenizer, prompt) for prompt in prompts for _ in range(copies)]
    generation_config = _generation_config(
        model, tokenizer, greedy=greedy, temperature=temperature, max_new_tokens=max_new_tokens
    )
    model.eval()
    completions: list[str] = []
    starts = range(0, len(texts), batch_size)
    # disable=None hides the bar where stderr is no terminal (a job's log file), which its redraws would litter.
    for index, start in enumerate(tqdm(starts, desc="sampling", disable=None if progress else True)):
        with _seeded(seed + index, model.device):
            completions += _generate_batch(model, tokenizer, texts[start : start + batch_size], generation_config)
    per_prompt = [completions[i * copies : (i + 1) * copies] for i in range(len(prompts))]
    return [samples * (num_samples // copies) for samples in per_prompt]


def sampling_options(
    num_prompts: int, *, num_samples: int, temperature: float, max_new_tokens: int, greedy: bool = False, seed: int = 0
) -> list[dict[str, Any]]:
    """`SamplingParams` options for each prompt: plain temperature sampling, as `generate_completions` does.

    vLLM seeds sample j of a prompt seeded s with s + j, so prompt i is seeded `seed + i * num_samples`: every sample
    has a seed of its own, and depends only on the arguments and its place, not on how vLLM batches the prompts.
    """
    _check(num_samples, temperature, max_new_tokens, 1, greedy)
    if greedy:
        return [{"n": 1, "temperature": 0.0, "max_tokens": max_new_tokens}] * num_prompts
    return [
        {
            "n": num_samples,
            "temperature": temperature,
            "top_k": 0,
            "top_p": 1.0,
            "repetition_penalty": 1.0,
            "max_tokens": max_new_tokens,
            "seed": (seed + index * num_samples) % _VLLM_SEEDS,
        }
        for index in range(num_prompts)
    ]


def generate_completions_vllm(
    engine,
    prompts: list[str] | list[list[dict]],
    *,
    num_samples: int,
    temperature: float,
    max_new_tokens: int,
    greedy: bool = False,
    seed: int = 0,
    progress: bool = False,
) -> list[list[str]]:
    """`generate_completions` through a vLLM `engine` (`cgrpo.pipeline.jobs.vllm_backend.Engine`, with the LoRA
    adapter it serves, if any): one list of texts per prompt.

    With ``greedy`` each prompt is decoded once and its completion repeated ``num_samples`` times.
    """
    from vllm import SamplingParams

    options = sampling_options(
        len(prompts),
        num_samples=num_samples,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        greedy=greedy,
        seed=seed,
    )
    tokenizer = engine.llm.get_tokenizer()
    texts = [as_text(tokenizer, prompt) for prompt in prompts]
    params = [SamplingParams(**option) for option in options]
    outputs = engine.llm.generate(texts, params, use_tqdm=progress and sys.stderr.isatty(), lora_request=engine.lora)
    copies = 1 if greedy else num_samples
    ordered = [sorted(output.outputs, key=lambda sample: sample.index) for output in outputs]
    return [[sample.text for sample in samples] * (num_samples // copies) for samples in ordered]
