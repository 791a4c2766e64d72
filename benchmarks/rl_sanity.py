"""Does GRPO learn on the bootstrapped model? Train TRL's GRPOTrainer on a few training prompts and print the reward.

Two rewards separate "the training loop works" from "the task's reward is learnable at this scale":
``length`` (shorter completions score higher, a signal every prompt shares) and ``correctness`` (the task's rewards).
Run from the repository root after the default pipeline has written its base model and splits::

    HF_HUB_OFFLINE=1 python benchmarks/rl_sanity.py --reward length --prompts 64 --steps 30
    HF_HUB_OFFLINE=1 python benchmarks/rl_sanity.py --reward correctness --prompts 8 --steps 50

Prints one line per logging interval: step, mean reward, mean completion length.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from datasets import concatenate_datasets
from trl import GRPOConfig, GRPOTrainer

from cgrpo.pipeline.tasks import get_task
from cgrpo.pipeline.tasks.splits import load_split


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resources/base_model/arithmetic")
    parser.add_argument("--splits", default="results/default/splits")
    parser.add_argument("--reward", choices=["length", "correctness"], default="correctness")
    parser.add_argument("--prompts", type=int, default=8, help="first N training prompts, repeated")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--num-generations", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args()


def shorter_is_better(completions, **kwargs) -> list[float]:
    """Minus the completion's length in characters over 40."""
    return [-len(completion) / 40 for completion in completions]


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    task = get_task("arithmetic")
    prompts = task.to_prompt_dataset(load_split(args.splits, "train").select(range(args.prompts)))
    repeats = -(-args.steps * args.batch_size // (args.num_generations * args.prompts))
    # Correctness alone (not the format reward), so the printed reward is the fraction of correct completions.
    rewards = task.reward_funcs[:1] if args.reward == "correctness" else [shorter_is_better]
    with tempfile.TemporaryDirectory() as scratch:
        config = GRPOConfig(
            output_dir=scratch,
            use_cpu=True,
            bf16=False,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
            logging_steps=5,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            num_generations=args.num_generations,
            learning_rate=args.learning_rate,
            temperature=args.temperature,
            max_completion_length=40,
            beta=0.0,
            loss_type="dapo",
            seed=0,
        )
        trainer = GRPOTrainer(
            model=args.model, reward_funcs=rewards, args=config, train_dataset=concatenate_datasets([prompts] * repeats)
        )
        trainer.train()
    print("step  reward  mean length")
    for entry in trainer.state.log_history:
        if "reward" in entry:
            print(f"{entry['step']:4d}  {entry['reward']:.3f}  {entry['completions/mean_length']:.1f}")


if __name__ == "__main__":
    main()
