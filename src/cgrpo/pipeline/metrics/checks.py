"""Argument checks shared by the evaluation metrics: one clear error per bad input, before any work."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...costs import is_integer


def is_failed(answer: str | None) -> bool:
    """Return True when an extracted answer is a failed extraction (``None`` or ``""``)."""
    return answer is None or answer == ""


def check_k(k: int, n: int, what: str = "answers") -> None:
    if not is_integer(k):
        raise ValueError(f"k must be an integer, got {k!r}; pass an int budget.")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}; pass a positive budget.")
    if k > n:
        raise ValueError(f"k={k} exceeds the {n} {what} available; sample at least k per prompt or lower k.")


def check_same_length(a: Sequence, b: Sequence, a_name: str, b_name: str) -> None:
    if len(a) != len(b):
        raise ValueError(f"{a_name} has {len(a)} entries but {b_name} has {len(b)}; pass one per prompt in both.")


def check_nonempty(x: Sequence, name: str) -> None:
    if len(x) == 0:
        raise ValueError(f"{name} is empty; pass at least one prompt.")


def check_gold(gold: Any) -> None:
    # A missing gold would make every prompt silently "wrong"; refuse instead.
    if is_failed(gold):
        raise ValueError(f"gold answer {gold!r} is missing; drop the prompt or supply its gold.")


def check_delta(delta: float) -> None:
    if not (0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must lie in (0, 1), got {delta}; pass a miscoverage level like 0.1.")


def score_array(scores: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(list(scores), dtype=float)
    # NaN <= qhat is False, so a NaN would silently count as "not covered".
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN; recompute the scores or drop those prompts.")
    return arr
