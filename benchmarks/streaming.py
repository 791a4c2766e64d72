"""C-GRPO's increments on SmolLM2-135M: HF generate, colocated vLLM in rounds, and vLLM streamed without rounds.

C-GRPO samples a step's prompts along the budget grid. In rounds (HF generate, or vLLM with
`stream_increments=False`) each round waits for every prompt's increment; streamed (vLLM, the default) a prompt's next
increment enters the engine as soon as its previous one is decided. Both subcommands use `config/smollm2_cpu.yaml`'s
few-shot chat task, LoRA r 8, temperature 0.5, completions up to 48 tokens and delta 0.35, with one calibration first.

``generate`` times the generation of one batch of prompts alone, the part of a step the rounds change, on one
trainer (one engine), the modes interleaved over repeats: C-GRPO in rounds, C-GRPO streamed (vLLM only), and every
prompt drawn to max(grid) in one call (GRPO's generation at G = max(grid)). One row per repeat and mode: seconds,
rounds (generation calls, or streamed, the longest chain of increments) and rollouts. It prints the medians and a
least-squares fit of the seconds on rounds and rollouts per backend (the cost model of docs/trainer.md).

``train`` trains C-GRPO for a few steps and reports the median seconds per step after the first (which holds the
calibration and the warm-up), the generation seconds of a step, its rounds and rollouts, and the start-up seconds.

The vLLM runs need vLLM's CPU build (the environment of docs/real-model.md, "In the pipeline") and a plain checkpoint.
Run from the repository root, offline, on idle cores (generate: about 15 minutes on 2 cores; train: 11 minutes a
run)::

    python benchmarks/smollm2_backends.py save /tmp/smollm2
    export VLLM_CPU_KVCACHE_SPACE=1 PYTHONPATH=src; PY=/path/to/vllm-cpu-env/bin/python
    $PY benchmarks/streaming.py generate /tmp/smollm2 vllm --out results/reference/smollm2_cpu/streaming_generation.csv
    $PY benchmarks/streaming.py generate /tmp/smollm2 hf --out results/reference/smollm2_cpu/streaming_generation.csv
    for run in vllm:rounds vllm:streamed hf:rounds; do
        $PY benchmarks/streaming.py train /tmp/smollm2 ${run%%:*} --mode ${run##*:} \\
            --out results/reference/smollm2_cpu/streaming_training.csv
    done
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml
from peft import LoraConfig
from transformers import TrainerCallback

from cgrpo import CGRPOConfig, CGRPOTrainer
from cgrpo.pipeline.tasks import get_task

CONFIG = yaml.safe_load((Path(__file__).resolve().parents[1] / "config" / "smollm2_cpu.yaml").read_text())


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["generate", "train"])
    parser.add_argument("model", help="a plain SmolLM2 folder (benchmarks/smollm2_backends.py save)")
    parser.add_argument("backend", choices=["hf", "vllm"])
    parser.add_argument("--mode", choices=["rounds", "streamed"], default="rounds", help="train: how C-GRPO samples")
    parser.add_argument("--grid", type=int, nargs="+", help="budget grid (generate: 2..32; train: 2 4 8, the config's)")
    parser.add_argument("--prompts", type=int, help="prompts per batch or step (generate: 16; train: 8)")
    parser.add_argument("--steps", type=int, default=5, help="train: optimizer steps")
    parser.add_argument("--repeats", type=int, default=3, help="generate: timed repeats after one warm-up")
    parser.add_argument("--calibration-prompts", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="CSV to append the rows to; printed only when left out")
    args = parser.parse_args()
    generate = args.command == "generate"
    args.grid = args.grid or ([2, 4, 8, 16, 32] if generate else [2, 4, 8])
    args.prompts = args.prompts or (16 if generate else 8)
    return args


def build(args) -> tuple[CGRPOTrainer, list[dict]]:
    """The C-GRPO trainer of the run, and the train prompts it has not trained on for `generate`'s batches."""
    task = get_task(CONFIG["task"]["name"], **CONFIG["task"]["options"])
    prompts = task.to_prompt_dataset(task.load("train"))
    train = args.prompts * args.steps
    training = CONFIG["training"]
    options = dict(
        output_dir=tempfile.mkdtemp(),
        use_cpu=True,
        bf16=False,
        report_to=[],
        disable_tqdm=True,
        save_strategy="no",
        logging_steps=1,
        max_steps=args.steps,
        per_device_train_batch_size=args.prompts * args.grid[-1],
        steps_per_generation=1,
        seed=args.seed,
        **{key: training[key] for key in ("learning_rate", "temperature", "max_completion_length", "beta")},
        loss_type=training["loss_type"],
        reward_weights=training["reward_weights"],
        budget_grid=args.grid,
        conformal_delta=CONFIG["cgrpo"]["deltas"][0],
        recalibrate_every=0,
        stream_increments=args.mode == "streamed",
        min_generation_prompts=None,
        **{key: CONFIG["cgrpo"]["options"][key] for key in ("score", "delta_margin", "split_delta")},
    )
    if args.backend == "vllm":
        from cgrpo.support.vllm_colocate import CPU_OPTIONS

        # The few-shot prompt (194-196 tokens) and a 48-token completion fit CPU_OPTIONS' 256 with 12 tokens to spare;
        # 512 leaves room for a config with longer completions.
        options.update(use_vllm=True, vllm_mode="colocate", **{**CPU_OPTIONS, "vllm_max_model_length": 512})
    trainer = CGRPOTrainer(
        model=args.model,
        reward_funcs=task.reward_funcs,
        args=CGRPOConfig(**options),
        train_dataset=prompts.select(range(train)),
        calibration_dataset=prompts.select(range(train, train + args.calibration_prompts)),
        answer_extractor=task.extract,
        peft_config=LoraConfig(task_type="CAUSAL_LM", **CONFIG["peft"]),
    )
    start = train + args.calibration_prompts
    return trainer, [dict(row) for row in prompts.select(range(start, start + args.prompts))]


# ---------------------------------------------------------------------- generate
def _timed_generation(trainer: CGRPOTrainer, examples: list[dict], mode: str) -> dict:
    width = trainer.args.max_budget
    rows = [example for example in examples for _ in range(width)]
    metrics = trainer._metrics["train"]
    start = time.perf_counter()
    if mode == "one call":
        trainer._generate_rows([row["prompt"] for row in rows], width, rows[0]["prompt"])
        rounds, rollouts = 1, len(rows)
    else:
        trainer._streams = mode == "streamed"
        trainer._batch_examples = rows
        trainer._generate([row["prompt"] for row in rows])
        rounds, rollouts = metrics["cgrpo/generation_rounds"][-1], metrics["cgrpo/rollouts_generated"][-1]
    return {"mode": mode, "seconds": time.perf_counter() - start, "rounds": rounds, "rollouts": rollouts}


def generate(args) -> pd.DataFrame:
    trainer, examples = build(args)
    trainer.model.train()
    calibration = trainer.calibrate()
    print(f"qhat {calibration.qhat}, solve rate {calibration.solve_rate:.2f}")
    if args.backend == "vllm":
        # What a training step adds with vLLM and not with HF generate: the policy's weights pushed into the engine.
        start = time.perf_counter()
        trainer.vllm_generation.sync_weights()
        print(f"weight sync {time.perf_counter() - start:.2f} s")
    modes = ["rounds", "streamed", "one call"] if args.backend == "vllm" else ["rounds", "one call"]
    rows = []
    for repeat in range(args.repeats + 1):  # the first pass warms up and is not kept
        for mode in modes:
            row = {"backend": args.backend, "repeat": repeat, **_timed_generation(trainer, examples, mode)}
            print(row)
            rows.append(row)
    table = pd.DataFrame(rows)
    table = table[table["repeat"] > 0].assign(prompts=args.prompts, grid=" ".join(map(str, args.grid)))
    print(table.groupby("mode")[["seconds", "rounds", "rollouts"]].median().to_string())
    design = np.column_stack([np.ones(len(table)), table["rounds"], table["rollouts"]])
    (base, per_round, per_rollout), *_ = np.linalg.lstsq(design, table["seconds"].to_numpy(), rcond=None)
    print(
        f"cost model ({args.backend}): seconds = {base:.2f} + {per_round:.3f} x rounds + {per_rollout:.4f} x rollouts"
    )
    return table


# ---------------------------------------------------------------------- train
class StepTimer(TrainerCallback):
    """Wall-clock seconds of every optimizer step."""

    def __init__(self):
        self.seconds: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.seconds.append(time.perf_counter() - self._start)


def train(args) -> pd.DataFrame:
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    trainer, _ = build(args)
    load = time.perf_counter() - start
    if args.mode == "streamed" and not trainer._streams:
        raise SystemExit("streamed needs vLLM in colocate mode: run it with the vllm backend.")
    timer, generation = StepTimer(), []
    trainer.add_callback(timer)
    sample = trainer._generate

    def timed(prompts):
        begin = time.perf_counter()
        result = sample(prompts)
        generation.append(time.perf_counter() - begin)
        return result

    trainer._generate = timed
    trainer.train()
    history = [entry for entry in trainer.state.log_history if "loss" in entry][1:]
    row = {
        "backend": args.backend,
        "mode": args.mode,
        "steps": args.steps,
        "prompts_per_step": args.prompts,
        "step_s": statistics.median(timer.seconds[1:]),
        "generation_s": statistics.median(generation[1:]),
        "rounds_per_step": statistics.mean(entry["cgrpo/generation_rounds"] for entry in history),
        "rollouts_per_step": statistics.mean(entry["cgrpo/rollouts_generated"] for entry in history),
        "first_step_s": timer.seconds[0],
        "load_s": load,
    }
    print(row)
    return pd.DataFrame([row]).round(2)


def main() -> None:
    args = parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    table = generate(args) if args.command == "generate" else train(args)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out, mode="a", header=not args.out.exists(), index=False)


if __name__ == "__main__":
    main()
