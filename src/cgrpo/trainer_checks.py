"""The arguments `CGRPOTrainer` checks before TRL builds anything: scoring functions, calibration set, thresholds."""

from __future__ import annotations

from datasets import Dataset

from .calibration import Thresholds
from .config import CGRPOConfig
from .conformal import smallest_supported_delta


def reward_funcs_list(reward_funcs) -> list:
    if reward_funcs is None:
        raise ValueError("CGRPOTrainer needs reward_funcs: pass at least one reward function or reward model.")
    return list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]


def check_initial_thresholds(thresholds: Thresholds | None, args: CGRPOConfig) -> None:
    if thresholds is not None and not args.calibrated:
        raise ValueError(
            f"initial_thresholds serve the conformal rule, but stopping_rule={args.stopping_rule!r} uses no "
            "thresholds; drop initial_thresholds or use stopping_rule='conformal'."
        )
    if thresholds is not None and sorted(thresholds.qhat) != args.budget_grid:
        raise ValueError(
            f"initial_thresholds cover budgets {sorted(thresholds.qhat)} but budget_grid is {args.budget_grid}; "
            "fit them for the same grid."
        )


def calibration_examples(dataset: Dataset | None, args: CGRPOConfig) -> tuple[list[dict], list[dict]]:
    """The calibration examples used at every calibration and the held-out ones (`calibration_holdout`), checked
    against the options that read them; both empty for a calibration-free stopping rule, which reads no dataset."""
    if not args.calibrated:
        return [], []
    if dataset is None or len(dataset) == 0:
        raise ValueError(
            "calibration_dataset is required by stopping_rule='conformal' and must not be empty: pass held-out "
            "examples the policy never trains on."
        )
    if "prompt" not in dataset.column_names:
        raise ValueError(f"calibration_dataset needs a 'prompt' column; it has {dataset.column_names}.")
    if args.score == "aps" and args.calibration_answer_column not in dataset.column_names:
        raise ValueError(
            f"calibration_dataset has no column {args.calibration_answer_column!r} for the gold answers; add it or set "
            "calibration_answer_column."
        )
    holdout = args.calibration_holdout
    size = len(dataset) - holdout if args.num_calibration_samples is None else args.num_calibration_samples
    if size < 1 or size + holdout > len(dataset):
        raise ValueError(
            f"num_calibration_samples ({args.num_calibration_samples}) plus calibration_holdout ({holdout}) need more "
            f"examples than the calibration set holds ({len(dataset)}); lower them or pass more examples."
        )
    _check_delta_supported(args, size)
    rows = [dict(row) for row in dataset.select(range(size + holdout))]
    return rows[:size], rows[size:]


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
