"""The model card of a model trained here: its base model and the method it was trained with, with its settings.

TRL's card (`GRPOTrainer.create_model_card`) links a base model loaded from a local folder as
"[None](https://huggingface.co/None)", loads a model saved to a folder as `model="None"` in its quick start, and says
"trained with GRPO" for every subclass; `rewrite_card` replaces all three.
"""

from __future__ import annotations

import re
from typing import Any

# What TRL's template renders for a base model it found no hub id for (a local folder, or a model passed in memory).
UNNAMED_BASE = "[None](https://huggingface.co/None)"
# TRL's sentence naming the method, its paper linked.
TRL_METHOD = re.compile(r"^This model was trained with GRPO\b.*$", re.MULTILINE)
GRPO_PAPER = "[GRPO](https://huggingface.co/papers/2402.03300)"
# TRL's quick start loads the model by its hub id, which a model saved to a folder does not have.
UNNAMED_MODEL = 'model="None"'


def rewrite_card(text: str, trainer: Any) -> str:
    """TRL's card `text` with the base model named and, for the project's own methods, the method and its settings
    (`trainer.method_description()`, None for plain GRPO, which TRL's card describes already)."""
    location = getattr(getattr(trainer.model, "config", None), "_name_or_path", "") or ""
    text = text.replace(UNNAMED_BASE, f"`{location}`" if location else "a model passed in memory")
    text = text.replace(UNNAMED_MODEL, 'model="path/to/this/model"')
    method = trainer.method_description()
    if method is None:
        return text
    text, replaced = TRL_METHOD.subn(lambda _: method, text, count=1)
    return text if replaced else f"{text.rstrip()}\n\n{method}\n"


def describe_dynamic_sampling(args: Any) -> str:
    """The paragraph on DAPO's dynamic sampling with its settings (`DynamicSamplingConfig` options)."""
    return (
        f"This model was trained with {GRPO_PAPER} and DAPO's dynamic sampling: {args.num_generations} completions "
        f"per prompt, groups whose rewards all agree dropped and the batch refilled with new prompts, in at most "
        f"{args.max_sampling_rounds} rounds per generation batch."
    )


def describe_cgrpo(args: Any, thresholds: Any) -> str:
    """The paragraph on C-GRPO (or a stopping rule on its grid) with its settings (`CGRPOConfig` options) and the
    thresholds in force (None before a calibration or with a calibration-free rule)."""
    grid = ", ".join(str(k) for k in args.budget_grid)
    if args.stopping_rule == "conformal":
        delta = (
            f"automatic delta (1 - calibration solve rate + {args.delta_margin:g})"
            if args.conformal_delta is None
            else f"delta {args.conformal_delta:g}"
        )
        calibration = (
            "calibrated once before training"
            if args.recalibrate_every == 0
            else f"recalibrated every {args.recalibrate_every} optimizer steps"
        )
        rule = f"conformal, score `{args.score}`, {delta}, {calibration}"
        if thresholds is not None:
            rule += f"; the last calibration chose delta {thresholds.delta:.3f}"
    else:
        options = getattr(args, "stopping_options", None)
        details = [f"stop_share {args.stop_share:g}"] if args.stopping_rule == "share" else []
        details += [f"options {options}"] if options else []
        rule = ", ".join([f"`{args.stopping_rule}`", *details])
    return (
        f"This model was trained with C-GRPO: {GRPO_PAPER} with per-prompt rollout budgets, each prompt sampled along "
        f"the budget grid {grid} and stopped at the first budget where its stopping rule holds. Stopping rule: {rule}."
    )
