"""What the project's `GRPOTrainer` subclasses share: checks made before TRL builds anything."""

from __future__ import annotations

from trl import GRPOConfig


def check_generation_batch_fits(args: GRPOConfig, train_dataset, fix: str) -> None:
    """Refuse a generation batch that needs more prompts than `train_dataset` holds.

    TRL's sampler drops an incomplete generation batch, so such a run would stop at step 0 with only transformers'
    warning. `fix` names the options that size the batch. Datasets without a length (iterable) are not checked.
    """
    if train_dataset is None or not hasattr(train_dataset, "__len__"):
        return
    needed = args.generation_batch_size // args.num_generations
    if len(train_dataset) < needed:
        raise ValueError(
            f"train_dataset holds {len(train_dataset)} prompts but one generation batch needs {needed} "
            f"(generation_batch_size {args.generation_batch_size} // num_generations {args.num_generations}), so "
            f"training would stop at step 0; {fix}, or pass more prompts."
        )
