"""Compute matching: the fixed group size G whose generated rollouts per training prompt match a C-GRPO setting's."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .checks import is_integer
from .methods import setting_label
from .reporting import load_json

__all__ = ["match_group_size", "nearest_admissible_g"]


def nearest_admissible_g(target: float, batch_size: int, allowed_min: int = 2) -> int:
    """Group size G closest to ``target`` with ``batch_size % G == 0`` and ``G >= allowed_min``.

    This is the compute-matched fixed-G GRPO baseline (e.g. ``target`` =
    C-GRPO's rollouts per prompt). Ties go to the larger G.
    """
    t = float(target)
    if not math.isfinite(t) or t <= 0:
        raise ValueError(f"target must be a positive finite number, got {target!r}; pass rollouts per prompt.")
    if not is_integer(batch_size) or batch_size < 1:
        raise ValueError(
            f"batch_size must be a positive integer, got {batch_size!r}; pass the generation batch size."
        )
    if not is_integer(allowed_min) or allowed_min < 1:
        raise ValueError(f"allowed_min must be a positive integer, got {allowed_min!r}; pass e.g. 2.")
    candidates = [g for g in range(int(allowed_min), int(batch_size) + 1) if batch_size % g == 0]
    if not candidates:
        raise ValueError(
            f"batch_size {batch_size} has no divisor >= {allowed_min}; raise batch_size or lower allowed_min."
        )
    # Sorting key (distance, -g) makes the larger G win ties.
    return min(candidates, key=lambda g: (abs(g - t), -g))


def match_group_size(run_files: Sequence[str | Path], batch_size: int) -> dict[str, Any]:
    """The fixed G whose generated rollouts per prompt match one C-GRPO setting's.

    ``run_files`` are the ``run.json`` of every seed of one C-GRPO setting. The target is their mean
    ``rollouts_per_prompt`` (calibration included) and G the admissible group size closest to it
    (:func:`nearest_admissible_g`: a divisor of ``batch_size``, at least 2).
    """
    records = load_json(run_files)
    if not records:
        raise ValueError("No run.json given; pass the C-GRPO runs of one setting.")
    settings = {setting_label(record) for record in records}
    if len(settings) != 1 or any(record["method"] != "cgrpo" for record in records):
        raise ValueError(f"Compute matching needs the C-GRPO runs of one setting, got settings {sorted(settings)}.")
    target = sum(record["rollouts_per_prompt"] for record in records) / len(records)
    return {
        "setting": settings.pop(),
        "runs": [record["run"] for record in records],
        "rollouts_per_prompt": target,
        "batch_size": int(batch_size),
        "num_generations": nearest_admissible_g(target, int(batch_size)),
    }
