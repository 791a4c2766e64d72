"""Checks of `GRPOConfig` options that the project's configs share (`CGRPOConfig`, `DynamicSamplingConfig` and the
dynamic sampling options both carry), run in their `__post_init__`: below every config, importing none."""

from __future__ import annotations

from trl import GRPOConfig


def check_whole_groups(per_device: int, steps: int, steps_name: str, width: int, width_name: str, fix: str) -> None:
    """Refuse a per-process generation batch (`per_device` rows times `steps`) that does not hold whole groups."""
    if (per_device * steps) % width:
        raise ValueError(
            f"per_device_train_batch_size * {steps_name} ({per_device} * {steps}) must be a multiple of {width_name} "
            f"({width}) so that every process holds whole groups; {fix}."
        )


def refuse_ignore_data_skip(config: GRPOConfig, state: str) -> None:
    """Refuse `ignore_data_skip`, which would resume a run without its trainer's own saved `state`."""
    if config.ignore_data_skip:
        raise ValueError(
            f"ignore_data_skip=True would resume without {state}, which transformers restores only along with the "
            "skipped batches; leave it False."
        )
