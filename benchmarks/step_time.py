"""Policy-update time of C-GRPO whose prompts all stop at the first budget, against fixed GRPO at that G.

Padded rows must cost no forward or backward pass, so the update of a C-GRPO batch whose prompts all stop at k should
take about as long as GRPO's update at G = k on the same prompts (target: at most 1.15x). Generation, scoring and
calibration are excluded: the update time is the time in `training_step` minus the time in
`_generate_and_score_completions`, and the median step is reported.

Run (offline, CPU), from the repository root::

    HF_HUB_OFFLINE=1 python benchmarks/step_time.py --steps 30
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from cgrpo import CGRPOConfig, CGRPOTrainer
from cgrpo.pipeline.jobs.base_model import bootstrap_base_model


def update_seconds(trainer) -> list[float]:
    """Train and return, per training step, the seconds spent outside generation and scoring (the update)."""
    generate, step = trainer._generate_and_score_completions, trainer.training_step
    scoring, updates = [0.0], []

    @functools.wraps(generate)
    def timed_generate(*args, **kwargs):
        start = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            scoring[0] += time.perf_counter() - start

    @functools.wraps(step)
    def timed_step(*args, **kwargs):
        scoring[0], start = 0.0, time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            updates.append(time.perf_counter() - start - scoring[0])

    trainer._generate_and_score_completions, trainer.training_step = timed_generate, timed_step
    trainer.train()
    return updates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model path; default: a small model bootstrapped into a temporary folder")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--stop-at", type=int, default=2, help="the first budget, where every C-GRPO prompt stops")
    parser.add_argument("--max-completion-length", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = args.model or str(bootstrap_base_model(tempfile.mkdtemp(), num_examples=256, num_layers=2))
    grid = [args.stop_at, 2 * args.stop_at, 4 * args.stop_at, 8 * args.stop_at, 16 * args.stop_at]
    data = Dataset.from_dict(
        {
            "prompt": [f"Question: {i} + {i} = ?\nAnswer: " for i in range(516)],
            "answer": [str(2 * i) for i in range(516)],
        }
    )
    # Held-out calibration prompts: the conformal guarantee needs prompts the policy does not train on.
    data, calibration = data.select(range(512)), data.select(range(512, 516))
    common = dict(
        output_dir=tempfile.mkdtemp(),
        use_cpu=True,
        bf16=False,
        max_steps=args.steps,
        report_to=[],
        save_strategy="no",
        logging_steps=args.steps,
        max_completion_length=args.max_completion_length,
        seed=0,
    )

    def reward(completions, **kwargs):
        return [float(len(c) % 3) for c in completions]

    cgrpo = CGRPOTrainer(
        model=model,
        reward_funcs=reward,
        train_dataset=data,
        calibration_dataset=calibration,
        answer_extractor=lambda text: "same",  # every answer agrees: each prompt stops at the first budget
        args=CGRPOConfig(
            budget_grid=grid,
            per_device_train_batch_size=args.prompts_per_step * grid[-1],
            recalibrate_every=0,
            **common,
        ),
    )
    grpo = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        train_dataset=data,
        args=GRPOConfig(
            num_generations=args.stop_at, per_device_train_batch_size=args.prompts_per_step * args.stop_at, **common
        ),
    )
    # The median step resists bursts of load from other processes better than the total.
    cgrpo_s, grpo_s = statistics.median(update_seconds(cgrpo)), statistics.median(update_seconds(grpo))
    print(f"C-GRPO mean_k: {cgrpo.cgrpo_totals['train_rollouts'] / cgrpo.cgrpo_totals['groups']:.2f}")
    print(
        f"median update time per step over {args.steps} steps: C-GRPO {cgrpo_s * 1000:.1f} ms, "
        f"GRPO G={args.stop_at} {grpo_s * 1000:.1f} ms, ratio {cgrpo_s / grpo_s:.3f}"
    )


if __name__ == "__main__":
    main()
