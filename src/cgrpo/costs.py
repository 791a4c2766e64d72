"""Cost accounting in *generated* rollouts: every sampled completion counts, never only the ones kept for the
policy update. The trainer's logged savings and the pipeline's run records both compute them here."""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable

__all__ = ["cpu_seconds", "rollout_savings", "rollout_savings_with_calibration", "rollouts_per_prompt"]


def is_integer(value: object) -> bool:
    """True for Python and NumPy integers, False for bools and floats (even whole ones)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _total(counts: int | Iterable[int], name: str) -> int:
    """Sum of a count or per-step counts, refusing negatives and non-integers."""
    # Anything not iterable is treated as one total so a float is reported, not a TypeError.
    values = list(counts) if isinstance(counts, Iterable) else [counts]
    for v in values:
        if not is_integer(v):
            raise ValueError(f"{name} holds {v!r}, not an integer count; pass whole numbers of rollouts/groups.")
        if v < 0:
            raise ValueError(f"{name} holds a negative count {v}; counts must be >= 0.")
    return int(sum(values))


def _check_k_max(k_max: int) -> None:
    if not is_integer(k_max) or k_max < 1:
        raise ValueError(f"k_max must be a positive integer, got {k_max!r}; pass max(grid).")


def _positive_groups(groups: int | Iterable[int]) -> int:
    total = _total(groups, "groups")
    if total == 0:
        raise ValueError("groups totals 0; pass the number of prompt groups trained on (> 0).")
    return total


def rollout_savings(generated: int | Iterable[int], groups: int | Iterable[int], k_max: int) -> float:
    """Generation-only savings ``1 - generated / (groups * k_max)``.

    Relative to fixed-group GRPO with ``G = k_max = max(grid)`` over the same
    prompt groups. ``generated`` counts every sampled completion, never only
    the kept ones. Either argument may be a total or per-step counts.
    Calibration rollouts are excluded; see
    :func:`rollout_savings_with_calibration`.
    """
    _check_k_max(k_max)
    return 1.0 - _total(generated, "generated") / (_positive_groups(groups) * int(k_max))


def rollout_savings_with_calibration(
    generated_train: int | Iterable[int],
    generated_calibration: int | Iterable[int],
    groups: int | Iterable[int],
    k_max: int,
) -> float:
    """Savings ``1 - (generated_train + generated_calibration) / (groups * k_max)``.

    Charges the calibration rollouts to C-GRPO; can be negative when
    calibration costs more than training saved. All counts are *generated*
    completions.
    """
    _check_k_max(k_max)
    used = _total(generated_train, "generated_train") + _total(generated_calibration, "generated_calibration")
    return 1.0 - used / (_positive_groups(groups) * int(k_max))


def rollouts_per_prompt(
    generated_train: int | Iterable[int],
    generated_calibration: int | Iterable[int],
    groups: int | Iterable[int],
) -> float:
    """Generated rollouts per training prompt, calibration included (the Pareto-plot x-axis)."""
    used = _total(generated_train, "generated_train") + _total(generated_calibration, "generated_calibration")
    return used / _positive_groups(groups)


def cpu_seconds() -> float:
    """CPU seconds (user and system) of this process and of its children that have ended, so far (`os.times()`).

    The twin of wall clock that does not depend on what runs next to a job: under `snakemake --cores 2`, two
    single-thread jobs share the cores, and which job runs beside another moves its wall clock but not its CPU time.
    Children count once they have been waited for (a sandboxed verifier's programs, for instance).
    """
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system
