"""The specs of a run's jobs: training, evaluation and learning curve, from the config and what the run's name says.

The method registry (`cgrpo.pipeline.configuration.methods`) says what a run of each method holds; this module joins
it with the settings every run shares (task, seed, trainer options, evaluation, rollout budget).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .methods import METHODS, method_learning_rate, parse_run_name
from .specs import (
    CurveSpec,
    EvaluationSpec,
    TrainSpec,
    budget_max_steps,
    budget_spec,
    calibration_prompt_seed,
    calibration_seed,
    cgrpo_options,
    evaluation_settings,
    method_trainer,
    pool_samples,
    task_spec,
)

__all__ = ["curve_spec", "evaluation_spec", "train_spec"]

Config = Mapping[str, Any]


def train_spec(config: Config, run: str, model: str, splits: str, calibration: str | None = None) -> TrainSpec:
    """The training run named `run`; a calibrated method's run starts from the initial calibration in `calibration`."""
    name = parse_run_name(run)
    method = METHODS[name.method]
    if method.calibrated and calibration is None:
        raise ValueError(f"Run {run!r} starts from an initial calibration; pass its thresholds.json.")
    fields = {"trainer": method_trainer(config, method.section), **method.spec_fields(config, name, calibration)}
    rate = method_learning_rate(config, name.method, name.lr_factor)
    # Set only where it differs, so that the specs of runs at their section's rate, and their results, stay.
    if rate is not None and rate != fields["trainer"].get("learning_rate"):
        fields["trainer"] = {**fields["trainer"], "learning_rate": rate}
    if "cgrpo" in fields:
        fields["cgrpo"] = cgrpo_options(fields["cgrpo"], fields["trainer"])
    if fields.get("budget_grid") is not None:
        fields["calibration_prompt_seed"] = calibration_prompt_seed(config, calibration_seed(config, name.seed))
    budget = budget_spec(config)
    if budget is not None:
        width = fields.get("num_generations") or max(fields["budget_grid"])
        smallest = fields.get("num_generations") or min(fields["budget_grid"])
        steps = budget_max_steps(budget["rollouts"], fields["trainer"], width, smallest)
        fields.update(budget=budget, trainer={**fields["trainer"], "max_steps": steps})
    return TrainSpec(
        run=run,
        method=name.method,
        model=model,
        splits=splits,
        task=task_spec(config),
        seed=name.seed,
        peft=config["peft"],
        **fields,
    )


def evaluation_spec(config: Config, run: str, model: str, splits: str) -> EvaluationSpec:
    """The evaluation of `run` (or ``"base"``): its training seed, the first grid, and sampling as in its training.

    The base model is evaluated with the split seed and the `training` options.
    """
    name = parse_run_name(run)
    section = None if name.method == "base" else METHODS[name.method].section
    seed = name.seed if name.seed is not None else config["splits"]["seed"]
    settings = evaluation_settings(config, method_trainer(config, section))
    samples = pool_samples(config, run)
    # Only where it differs, so that the specs of existing results, and their cached outputs, stay as they were.
    if samples > max(settings["budget_grid"]):
        settings["pool_samples"] = samples
    return EvaluationSpec(run=run, model=model, splits=splits, task=task_spec(config), seed=seed, evaluation=settings)


def curve_spec(config: Config, run: str, record: str | None, model: str, splits: str) -> CurveSpec:
    """The learning curve of `run` (or ``"base"``), sampled as its evaluation is, `budget.eval_samples` a prompt;
    `record` is its run.json (None for the base model)."""
    name = parse_run_name(run)
    section = None if name.method == "base" else METHODS[name.method].section
    settings = evaluation_settings(config, method_trainer(config, section))
    evaluation = {key: settings[key] for key in ("temperature", "max_new_tokens", "batch_size", "backend")}
    evaluation["samples"] = int(config["budget"]["eval_samples"])
    seed = name.seed if name.seed is not None else config["splits"]["seed"]
    return CurveSpec(
        run=run, record=record, model=model, splits=splits, task=task_spec(config), seed=seed, evaluation=evaluation
    )
