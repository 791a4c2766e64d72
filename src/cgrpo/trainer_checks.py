"""The arguments `CGRPOTrainer` checks before TRL builds anything: scoring functions, calibration set, thresholds."""

from __future__ import annotations

import inspect
import json
import logging
import math
from typing import Any

from datasets import Dataset
from torch import nn

from .calibration import Thresholds, unanimous_solve_counts
from .config import CGRPOConfig
from .conformal import smallest_supported_delta
from .support.messages import quoted
from .support.user_code import normalise_answer

logger = logging.getLogger(__name__)

# Largest calibration set the warning about a too small one searches for the size that would do.
_LARGEST_SIZE_SUGGESTED = 2000


def reward_funcs_list(reward_funcs) -> list:
    if reward_funcs is None:
        raise ValueError("CGRPOTrainer needs reward_funcs: pass at least one reward function or reward model.")
    return list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]


def probe_reward_funcs(reward_funcs: list, names: list[str], example: dict[str, Any], state: Any) -> None:
    """Call every reward function (reward models aside) once, on `example`'s prompt with an empty completion, which a
    policy can generate: one that raises then stops the run with its name before the first calibration spends its
    rollouts, not after. The call gets the keyword arguments TRL passes, its logging hooks as no-ops."""
    prompt = example["prompt"]
    completion = "" if isinstance(prompt, str) else [{"role": "assistant", "content": ""}]
    columns = {key: [value] for key, value in example.items() if key not in ("prompt", "completion", "completion_ids")}
    hooks = {"trainer_state": state, "log_extra": _ignore, "log_metric": _ignore}
    for func, name in zip(reward_funcs, names):
        if isinstance(func, nn.Module) or inspect.iscoroutinefunction(func):
            continue
        try:
            func(prompts=[prompt], completions=[completion], completion_ids=[[]], **columns, **hooks)
        except Exception as error:
            raise ValueError(
                f"reward function {name} raised {type(error).__name__} ({error}) on an empty completion of the first "
                "training prompt, checked before any rollout is drawn; make it return a number (or None) for any "
                "completion."
            ) from error


def _ignore(*args, **kwargs) -> None:
    return None


def check_initial_thresholds(thresholds: Thresholds | None, args: CGRPOConfig) -> None:
    if thresholds is not None and args.stopping_rule != "conformal":
        raise ValueError(
            f"initial_thresholds serve the conformal rule, but stopping_rule={args.stopping_rule!r} uses no "
            "thresholds; drop initial_thresholds or use stopping_rule='conformal'."
        )
    if thresholds is not None and sorted(thresholds.qhat) != args.budget_grid:
        raise ValueError(
            f"initial_thresholds cover budgets {sorted(thresholds.qhat)} but budget_grid is {args.budget_grid}; "
            "fit them for the same grid."
        )


def calibration_examples(
    dataset: Dataset | None, args: CGRPOConfig, train_dataset: Dataset | None = None
) -> tuple[list[dict], list[dict]]:
    """The calibration examples used at every calibration and the held-out ones (`calibration_holdout`), checked
    against the options that read them and, given `train_dataset`, against its prompts; both empty for a
    calibration-free stopping rule, which reads no dataset."""
    if not args.calibrated:
        return [], []
    if dataset is None or len(dataset) == 0:
        raise ValueError(
            f"calibration_dataset is required by stopping_rule={args.stopping_rule!r} and must not be empty: pass "
            "held-out examples the policy never trains on."
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
    _warn_if_thresholds_stay_at_one(args, size)
    rows = [dict(row) for row in dataset.select(range(size + holdout))]
    check_held_out(rows, train_dataset)
    return rows[:size], rows[size:]


def check_held_out(rows: list[dict], train_dataset: Dataset | None) -> None:
    """Refuse calibration examples whose prompt the policy trains on: the conformal guarantee needs unseen prompts.

    Prompts are compared as they are (text, or conversational messages); datasets without a length (iterable) are not
    read, since that would consume them.
    """
    if not isinstance(train_dataset, Dataset) or "prompt" not in train_dataset.column_names:
        return
    training = {_prompt_key(prompt) for prompt in train_dataset["prompt"]}
    shared = [row["prompt"] for row in rows if _prompt_key(row["prompt"]) in training]
    if shared:
        raise ValueError(
            f"calibration_dataset shares {len(shared)} of its {len(rows)} prompts with train_dataset (the first: "
            f"{quoted(shared[0])}); calibrate on held-out prompts the policy never trains on, or the thresholds lose "
            "their coverage guarantee."
        )


def _prompt_key(prompt) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


def _warn_if_thresholds_stay_at_one(args: CGRPOConfig, n: int) -> None:
    """Warn when `n` calibration examples leave every automatic threshold at 1 for a policy that solves most of them.

    A calibration-size effect (`cgrpo.calibration.unanimous_solve_counts`): too few examples for the coverage the
    automatic delta asks of a policy that solves a majority of them, so C-GRPO silently becomes the unanimous rule.
    A policy that solves almost none leaves every threshold at 1 at any size, which no warning here could fix.
    """
    if args.stopping_rule != "conformal" or args.conformal_delta is not None:
        return
    fit = n - n // 2 if args.split_delta else n
    counts = set(unanimous_solve_counts(fit, args.delta_margin))
    if not _majority_stuck(fit, args.delta_margin):
        return
    # The solve counts from the largest one down to where a threshold below 1 becomes possible again.
    stuck = [max(counts)]
    while stuck[0] - 1 in counts:
        stuck.insert(0, stuck[0] - 1)
    # About 1 / delta_margin examples do (docs/method.md, "What makes the thresholds non-trivial, and what makes
    # them trivial"); beyond a few thousand, the margin is the fix.
    largest = _LARGEST_SIZE_SUGGESTED if args.delta_margin * _LARGEST_SIZE_SUGGESTED > 1 else fit + 1
    needed = next((m for m in range(fit + 1, largest) if not _majority_stuck(m, args.delta_margin)), None)
    if needed is not None and args.split_delta:
        needed = 2 * needed - 1
    margin = math.ceil(1000 * (fit - 1) / (fit * (fit + 1))) / 1000
    solved = f"{stuck[0]}" if len(stuck) == 1 else f"{stuck[0]} to {stuck[-1]}"
    size_fix = f"calibrate on at least {needed} examples or " if needed is not None else ""
    logger.warning(
        "With %d calibration examples fitting the thresholds and delta_margin=%g, the automatic delta leaves every "
        "threshold at 1 whenever the policy solves %s of them within max(budget_grid), and C-GRPO then stops a prompt "
        "only when all its answers agree (the unanimous rule); %sraise delta_margin to %g.",
        fit,
        args.delta_margin,
        solved,
        size_fix,
        margin,
    )


def _majority_stuck(n: int, margin: float) -> list[int]:
    # Half counts: two examples of which the policy solves one leave every threshold at 1 as surely as eight do.
    return [solved for solved in unanimous_solve_counts(n, margin) if solved >= n / 2]


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
    if args.score == "aps":
        _check_extractor_output(answer_extractor)


def _check_extractor_output(answer_extractor) -> None:
    """Refuse an extractor whose answer to an empty completion is neither text, a number nor None (`normalise_answer`).

    Every extractor meets empty completions (a policy that ends at once, and C-GRPO's padding), so this first call
    shows a wrong return type, a list of regex matches say, before any model is loaded; in training, the trainer
    would count each such answer as a failed extraction and go on.
    """
    try:
        answer = answer_extractor("")
    except Exception:  # noqa: BLE001 - an extractor may refuse empty text; training counts that as no answer
        return
    normalise_answer(answer)


def check_extractions(errors: int, outcomes: int, when: str) -> None:
    """Stop a run whose answer extractor raised on each of the `outcomes` completions of `when` (`errors` of them).

    The trainer counts a raising extractor as a failed extraction and goes on, which is right for the odd completion
    it cannot parse; when it fails on every one, every score is 1 and no prompt can stop early, which is a bug in the
    extractor, not a property of the policy.
    """
    if outcomes and errors >= outcomes:
        raise ValueError(
            f"answer_extractor raised on all {outcomes} completions of {when} (the first error is in the warning "
            "above); fix it so that it returns the final answer as a str, or None, for any completion text."
        )
