"""Padded rows: C-GRPO keeps TRL's groups rectangular, and these helpers keep the padding out of everything else.

A prompt that stops at budget k < max(budget_grid) is padded with one-token rows. They must never reach a reward
function, appear in TRL's completion statistics or completion table, or weigh in the loss.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

# TRL warns about every row whose rewards are all None; padded rows are such rows by design.
ALL_NONE_WARNING = "All reward functions returned None"


def real_rows_only(func, pad_mask: Callable[[], Sequence[bool] | None]):
    """Wrap a reward function so that padded rows never reach it; they get None, which TRL turns into NaN.

    The wrapper also checks that the function returns one number (or None) per completion it was given.

    `pad_mask()` returns the current batch's padding flags, or None outside C-GRPO training generation. Reward models
    (`nn.Module`) and hub ids pass through: the trainer overwrites their padded rows with NaN.
    """
    if isinstance(func, (str, torch.nn.Module)):
        return func

    def call(prompts, completions, completion_ids, **kwargs):
        pad = pad_mask()
        if pad is None or not any(pad):
            return (range(len(completions)), None), func(
                prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs
            )
        keep = [i for i, p in enumerate(pad) if not p]
        pick = functools.partial(_pick_rows, keep=keep, rows=len(pad))
        if "log_extra" in kwargs:
            kwargs["log_extra"] = _scatter_log_extra(kwargs["log_extra"], keep, len(pad))
        picked = {key: pick(value) for key, value in kwargs.items()}
        return (keep, len(pad)), func(
            prompts=pick(prompts), completions=pick(completions), completion_ids=pick(completion_ids), **picked
        )

    def scatter(layout, rewards):
        keep, rows = layout
        rewards = _checked_rewards(func, rewards, len(keep))
        return rewards if rows is None else _scatter(rewards, keep, rows)

    if inspect.iscoroutinefunction(func):

        async def wrapped_async(prompts, completions, completion_ids, **kwargs):
            layout, pending = call(prompts, completions, completion_ids, **kwargs)
            return scatter(layout, await pending)

        return _named_like(wrapped_async, func)

    def wrapped(prompts, completions, completion_ids, **kwargs):
        return scatter(*call(prompts, completions, completion_ids, **kwargs))

    return _named_like(wrapped, func)


def checked_reward_funcs(reward_funcs):
    """``reward_funcs`` for a trainer that pads no rows, each function wrapped to check that it returns one number
    (or None) per completion, so that a wrong one stops training with its name rather than a tensor error."""
    if reward_funcs is None:
        return None
    funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    return [real_rows_only(func, lambda: None) for func in funcs]


def _checked_rewards(func, rewards, expected: int) -> list:
    """The rewards as a list, or a ValueError naming the function when they are not one number (or None) each."""
    rewards = list(rewards)
    if len(rewards) != expected:
        raise ValueError(
            f"reward function {func.__name__} returned {len(rewards)} rewards for {expected} completions; "
            "return one per completion."
        )
    bad = [r for r in rewards if r is not None and (isinstance(r, (str, bytes)) or not hasattr(r, "__float__"))]
    if bad:
        raise ValueError(
            f"reward function {func.__name__} returned {bad[0]!r}, not a number; return a float (or None) per "
            "completion."
        )
    return rewards


def _named_like(wrapper, func):
    # TRL names a reward function's metrics after it (`rewards/<name>/mean`); a `functools.partial` has no
    # `__name__`, so the name of the function it binds is used, as TRL does.
    functools.update_wrapper(wrapper, func)
    wrapper.__name__ = getattr(func, "__name__", None) or getattr(func, "func", func).__name__
    return wrapper


def drop_padded_from_logs(logs: dict, padded: Sequence[bool]) -> None:
    """Remove the latest batch's padded rows from TRL's completion table buffers (`trainer._logs`)."""
    rows = len(padded)
    columns = [
        logs["prompt"],
        logs["completion"],
        logs["advantages"],
        *logs["rewards"].values(),
        *logs["extra"].values(),
    ]
    for column in columns:
        if len(column) < rows:
            continue
        latest = [column.pop() for _ in range(rows)][::-1]
        column.extend(value for value, pad in zip(latest, padded) if not pad)


def log_length_stats(metrics, lengths: torch.Tensor, truncated: torch.Tensor) -> None:
    """TRL's completion-length statistics (`completions/*`), computed over real completions only."""
    metrics["completions/mean_length"].append(lengths.mean().item())
    metrics["completions/min_length"].append(lengths.min().item())
    metrics["completions/max_length"].append(lengths.max().item())
    metrics["completions/clipped_ratio"].append(truncated.float().mean().item())
    terminated = lengths[~truncated] if (~truncated).any() else torch.zeros(1)
    metrics["completions/mean_terminated_length"].append(terminated.mean().item())
    metrics["completions/min_terminated_length"].append(terminated.min().item())
    metrics["completions/max_terminated_length"].append(terminated.max().item())


def keep_rows(output: dict, index: torch.Tensor, rows: int) -> dict:
    """Select `index` along the row dimension of every per-row tensor of TRL's batch dict."""
    return {
        key: value[index] if torch.is_tensor(value) and value.dim() > 0 and value.size(0) == rows else value
        for key, value in output.items()
    }


def _pick_rows(value, keep: list[int], rows: int):
    if isinstance(value, list) and len(value) == rows:
        return [value[i] for i in keep]
    return value


def _scatter(values: list, keep: list[int], rows: int) -> list:
    full = [None] * rows
    for i, value in zip(keep, values):
        full[i] = value
    return full


def _scatter_log_extra(log_extra, keep: list[int], rows: int):
    def scattered(column: str, values: list):
        log_extra(column, _scatter(list(values), keep, rows))

    return scattered


# Batch entries with one column per completion token; the importance-sampling ratio has one only at token level.
_PER_TOKEN_KEYS = (
    "completion_ids",
    "completion_mask",
    "tool_mask",
    "old_per_token_logps",
    "ref_per_token_logps",
    "sampling_per_token_logps",
    "importance_sampling_ratio",
)


def trim_completion_columns(inputs: dict[str, Any]) -> dict[str, Any]:
    """The micro-batch without the trailing completion columns that none of its rows' masks uses."""
    mask = inputs["completion_mask"]
    used = mask.any(dim=0).nonzero()
    width = int(used.max().item()) + 1 if len(used) else 1
    if width == mask.size(1):
        return inputs
    return {
        key: value[:, :width]
        if key in _PER_TOKEN_KEYS and torch.is_tensor(value) and value.dim() >= 2 and value.size(1) == mask.size(1)
        else value
        for key, value in inputs.items()
    }


def place_rows(
    full: torch.Tensor | None, values: torch.Tensor | None, rows: torch.Tensor, count: int, width: int
) -> torch.Tensor | None:
    """Write per-token `values` of some rows into `full` (zeros of `count` x `width` made on first use)."""
    if values is None:
        return None
    if full is None:
        full = values.new_zeros((count, width))
    full[rows, : values.size(1)] = values
    return full


class _AllNoneFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return ALL_NONE_WARNING not in str(record.msg)


@contextlib.contextmanager
def without_all_none_warning(trl_logger: logging.Logger) -> Iterator[None]:
    """Silence TRL's warning about rows without rewards while padded rows are scored."""
    quiet = _AllNoneFilter()
    trl_logger.addFilter(quiet)
    try:
        yield
    finally:
        trl_logger.removeFilter(quiet)
