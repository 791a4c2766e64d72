"""Cost accounting in *generated* rollouts: every sampled completion counts, never only the ones kept for the
policy update. The trainer's logged savings and the pipeline's run records both compute them here."""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Iterable

__all__ = [
    "calibration_steps",
    "cpu_seconds",
    "generation_span",
    "refit_due",
    "rollout_savings",
    "rollout_savings_with_calibration",
    "rollouts_per_prompt",
]


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


def generation_span(steps_per_generation: int, num_iterations: int = 1, gradient_accumulation_steps: int = 1) -> int:
    """Optimizer steps between two generation batches that start on an optimizer step.

    TRL generates once every `steps_per_generation * num_iterations` micro-steps and an optimizer step is
    `gradient_accumulation_steps` of them; CGRPOConfig makes the first a multiple of the second, so the span is their
    quotient, and in general the least common multiple's.
    """
    micro_steps = steps_per_generation * num_iterations
    return math.lcm(micro_steps, gradient_accumulation_steps) // gradient_accumulation_steps


def refit_due(step: int, last_calibration_step: int, every: int) -> bool:
    """Whether a generation batch starting at optimizer step `step` refits the stopping rule first: `every` > 0 steps
    or more after the previous calibration (`every` 0 keeps the first one)."""
    return every > 0 and step - last_calibration_step >= every


def calibration_steps(max_steps: int, span: int, every: int) -> list[int]:
    """The optimizer steps at which a run of `max_steps` steps calibrates: step 0, then each generation batch start
    (every `span` steps, see :func:`generation_span`) where :func:`refit_due` says so; `CGRPOTrainer` calibrates by the
    same rule, so a plan can count calibrations before the run."""
    steps = [0]
    for start in range(span, max_steps, span):
        if refit_due(start, steps[-1], every):
            steps.append(start)
    return steps


def cpu_seconds() -> float:
    """CPU seconds (user and system) of this process and of its children that have ended, so far (`os.times()`).

    The twin of wall clock that does not depend on what runs next to a job: under `snakemake --cores 2`, two
    single-thread jobs share the cores, and which job runs beside another moves its wall clock but not its CPU time.
    Children count once they have been waited for (a sandboxed verifier's programs, for instance).
    """
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system
