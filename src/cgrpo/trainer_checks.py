"""The arguments `CGRPOTrainer` checks before TRL builds anything: scoring functions, calibration set, thresholds."""

from __future__ import annotations

from typing import Any

from datasets import Dataset

from .calibration import Thresholds
from .config import CGRPOConfig
from .conformal import smallest_supported_delta


def reward_funcs_list(reward_funcs) -> list:
    if reward_funcs is None:
        raise ValueError("CGRPOTrainer needs reward_funcs: pass at least one reward function or reward model.")
    return list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]


def check_initial_thresholds(thresholds: Thresholds | None, args: CGRPOConfig) -> None:
    if thresholds is not None and sorted(thresholds.qhat) != args.budget_grid:
        raise ValueError(
            f"initial_thresholds cover budgets {sorted(thresholds.qhat)} but budget_grid is {args.budget_grid}; "
            "fit them for the same grid."
        )


def calibration_examples(dataset: Dataset, args: CGRPOConfig) -> list[dict[str, Any]]:
    """The calibration examples used at every calibration, checked against the options that read them."""
    if dataset is None or len(dataset) == 0:
        raise ValueError(
            "calibration_dataset is required and must not be empty: pass held-out examples the policy never trains on."
        )
    if "prompt" not in dataset.column_names:
        raise ValueError(f"calibration_dataset needs a 'prompt' column; it has {dataset.column_names}.")
    if args.score == "aps" and args.calibration_answer_column not in dataset.column_names:
        raise ValueError(
            f"calibration_dataset has no column {args.calibration_answer_column!r} for the gold answers; add it or set "
            "calibration_answer_column."
        )
    size = len(dataset) if args.num_calibration_samples is None else args.num_calibration_samples
    if size > len(dataset):
        raise ValueError(
            f"num_calibration_samples ({size}) exceeds the calibration set ({len(dataset)} examples); lower it or "
            "pass more examples."
        )
    _check_delta_supported(args, size)
    return [dict(row) for row in dataset.select(range(size))]


def _check_delta_supported(args: CGRPOConfig, n: int) -> None:
    if args.conformal_delta is not None and args.conformal_delta < smallest_supported_delta(n):
        raise ValueError(
            f"conformal_delta={args.conformal_delta} is below 1/(n+1) = {smallest_supported_delta(n):.4f} for the "
            f"n = {n} calibration examples, so no threshold could certify it; raise conformal_delta or calibrate on "
            "more examples."
        )


def check_scoring(args: CGRPOConfig, answer_extractor, verifier) -> None:
    if args.score == "aps" and answer_extractor is None:
        raise ValueError("score='aps' needs answer_extractor(text) -> str | None to compare answers; pass one.")
    if args.score != "aps" and verifier is None:
        raise ValueError(f"score={args.score!r} needs verifier(completions=..., **columns) -> list[bool]; pass one.")
