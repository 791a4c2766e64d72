"""Padded rows: C-GRPO keeps TRL's groups rectangular, and these helpers keep the padding out of everything else.

A prompt that stops at budget k < max(budget_grid) is padded with one-token rows. They must never reach a reward
function, appear in TRL's completion statistics or completion table, or weigh in the loss.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence

import torch


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
            return (range(len(completions)), None), func(prompts=prompts, completions=completions,
                                                          completion_ids=completion_ids, **kwargs)
        keep = [i for i, p in enumerate(pad) if not p]
        pick = functools.partial(_pick_rows, keep=keep, rows=len(pad))
        if "log_extra" in kwargs:
            kwargs["log_extra"] = _scatter_log_extra(kwargs["log_extra"], keep, len(pad))
        picked = {key: pick(value) for key, value in kwargs.items()}
        return (keep, len(pad)), func(prompts=pick(prompts), completions=pick(completions),
                                      completion_ids=pick(completion_ids), **picked)

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
    columns = [logs["prompt"], logs["completion"], logs["advantages"], *logs["rewards"].values(),
               *logs["extra"].values()]
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
