"""Checks of a workflow config that its JSON schema cannot express, run when Snakemake plans the workflow.

Each bad input gets one sentence naming the config key and the fix, before any job starts. The config must have
been validated against ``workflow/schemas/config.schema.yaml`` first (which fills in the defaults).
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Mapping
from typing import Any

from ...allocation import allocator_names, get_allocator
from ...calibration import training_grid
from ...conformal import smallest_supported_delta
from ...stopping import get_rule, rule_names
from ..tasks import TASKS, available_tasks, check_task_score, get_task
from .methods import METHODS, static_runs
from .options import BOOTSTRAP_SETTINGS, CGRPO_CONFIG, GRPO_CONFIG, LORA_CONFIG, check_options
from .run_specs import train_spec
from .specs import base_model_path, check_model_source, evaluation_grid


class ConfigError(ValueError):
    """A workflow config that cannot run; the message names the key and the fix."""


def check_config(config: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for the first problem found in a schema-validated ``config``.

    Hub ids of models and datasets are not looked up: the machine that plans a workflow need not be the one that
    runs it, so their offline availability is checked by the first job that needs them (base_model, split).
    """
    try:
        check_budget_grids(config)
        check_fixed_deltas(config)
        check_calibration_size(config)
        check_task(config)
        check_model(config)
        check_trainer_sections(config)
        check_shared_schedule(config)
        check_batch_sizes(config)
        check_stopping_rules(config)
        check_allocators(config)
        check_budget(config)
        check_learning_rates(config)
        check_signal_control(config)
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(str(error)) from None


def check_budget(config: Mapping[str, Any]) -> None:
    """A rollout budget compares methods by learning curves at equal rollouts: on a math task, against fixed group
    sizes, with a milestone per distinct rollout count."""
    budget = config.get("budget") or {}
    if budget.get("rollouts") is None:
        return
    if budget["rollouts"] < budget["milestones"]:
        raise ConfigError(
            f"budget.rollouts ({budget['rollouts']}) is fewer than budget.milestones ({budget['milestones']}); raise "
            "the budget or lower the milestones."
        )
    if config["grpo"]["compute_matched"]:
        raise ConfigError(
            "grpo.compute_matched matches C-GRPO's rollouts over a fixed number of steps, which a rollout budget "
            "replaces (every run spends budget.rollouts); set grpo.compute_matched: false."
        )
    if not config["grpo"]["num_generations"]:
        raise ConfigError(
            "budget.rollouts compares every method with the best fixed group size, but grpo.num_generations lists "
            "none; list the group sizes to compare with."
        )
    if config["cgrpo"]["options"]["score"] != "aps":
        raise ConfigError(
            "budget.rollouts draws learning curves of answers graded against a gold answer (score aps); run the budget "
            "on a math task, or set budget.rollouts: null."
        )


def check_learning_rates(config: Mapping[str, Any]) -> None:
    """`learning_rates` names methods this config can train, and a sweep has a learning rate to multiply, runs under a
    rollout budget (whose validation accuracy at the budget chooses) and on validation prompts."""
    rates = config.get("learning_rates") or {}
    for method in rates.get("by_method", {}):
        if method not in METHODS:
            hint = _nearest(method, list(METHODS)) or "."
            raise ConfigError(
                f"config key learning_rates.by_method names {method!r}, which is no method ({', '.join(METHODS)}): "
                f"fix the name{hint}"
            )
    if rates.get("sweep", [1]) == [1]:
        return
    budget = (config.get("budget") or {}).get("rollouts")
    if budget is None or config["splits"]["sizes"].get("validation") is None:
        raise ConfigError(
            "learning_rates.sweep chooses each method's learning rate by its validation accuracy at a rollout budget; "
            "set budget.rollouts and splits.sizes.validation, or sweep nothing (learning_rates.sweep: [1])."
        )
    if config["training"].get("learning_rate") is None:
        raise ConfigError(
            "learning_rates.sweep multiplies each method's learning rate, but training.learning_rate is unset (TRL's "
            "default then applies); set training.learning_rate."
        )


def check_signal_control(config: Mapping[str, Any]) -> None:
    """Refuse a signal-rule delta that its control prompts could not meet even if every one were informative: conformal
    risk control needs (lost + 1) / (n + 1) <= delta on n informative control prompts, so n >= 1/delta - 1."""
    ablations = config["cgrpo"]["ablations"]
    if "signal" not in ablations["rules"]:
        return
    options = config["cgrpo"]["options"]
    prompts = options["num_calibration_samples"] or config["splits"]["sizes"]["calibration"]
    if prompts is None:
        return
    # The rule estimates on the first half of its calibration prompts and controls the risk on the second.
    control = prompts - prompts // 2
    for delta in _ablation_settings_of(config, "signal"):
        needed = math.ceil(1 / delta - 1 - 1e-9)
        if control < needed:
            raise ConfigError(
                f"config key cgrpo.ablations.settings.signal has delta {delta:g}, which needs at least {needed} "
                f"informative control prompts, but the signal rule controls on {control} of its {prompts} calibration "
                f"prompts (the second half): raise cgrpo.options.num_calibration_samples to at least {2 * needed} or "
                f"use a delta of at least {1 / (control + 1):.3f}."
            )


def _ablation_settings_of(config: Mapping[str, Any], rule: str) -> list[float]:
    settings = config["cgrpo"]["ablations"]["settings"]
    return [float(v) for v in settings.get(rule, [get_rule(rule).defaults[get_rule(rule).parameter]])]


def check_stopping_rules(config: Mapping[str, Any]) -> None:
    """The ablations' and the replay's rules are registered (plugins imported first) and accept their settings."""
    ablations, replay = config["cgrpo"]["ablations"], config["replay"]
    named = [("cgrpo.ablations.rules", rule) for rule in ablations["rules"]]
    named += [("cgrpo.ablations.settings", rule) for rule in ablations["settings"]]
    named += [("cgrpo.ablations.options", rule) for rule in ablations.get("options", {})]
    named += [("replay.settings", rule) for rule in replay["settings"]]
    named += [("replay.options", rule) for rule in replay["options"]]
    for key, rule in named:
        _check_registered(key, rule, rule_names(), "stopping rule")
    if "conformal" in ablations["rules"]:
        raise ConfigError("config key cgrpo.ablations.rules lists conformal, which is C-GRPO itself; remove it.")
    score = config["cgrpo"]["options"].get("score", "aps")
    for key, settings in (("cgrpo.ablations.settings", ablations["settings"]), ("replay.settings", replay["settings"])):
        for rule, values in settings.items():
            parameter = get_rule(rule).parameter
            if parameter is None:
                raise ConfigError(f"config key {key}.{rule}: the {rule!r} rule has no parameter to set; remove it.")
            for value in values:
                _check_rule_options(f"{key}.{rule}", rule, score, {parameter: value})
    for rule, options in replay["options"].items():
        _check_rule_options(f"replay.options.{rule}", rule, score, options)
    for rule, options in ablations.get("options", {}).items():
        check_options(options, f"cgrpo.ablations.options.{rule}", CGRPO_CONFIG)
    known = {"base", *static_runs(config)}
    unknown = [model for model in replay["models"] if model not in known]
    if unknown:
        raise ConfigError(
            f"config key replay.models lists {', '.join(unknown)}, which this config does not train; use base or "
            "one of its runs."
        )


def check_allocators(config: Mapping[str, Any]) -> None:
    """The allocators named are registered (plugins imported first), accept their options, and their totals lie on the
    grid."""
    allocators = config.get("allocators") or {}
    grid = evaluation_grid(config)
    for key in ("runs", "options", "rollouts_per_prompt"):
        for name in allocators.get(key, []):
            _check_registered(f"allocators.{key}", name, allocator_names(), "prompt allocator")
    for name, options in allocators.get("options", {}).items():
        try:
            get_allocator(name)(grid, **options)
        except ValueError as error:
            raise ConfigError(f"config key allocators.options.{name}: {error}") from None
    for name, total in allocators.get("rollouts_per_prompt", {}).items():
        if not min(grid) <= total <= max(grid):
            raise ConfigError(
                f"config key allocators.rollouts_per_prompt.{name} is {total:g}, outside the grid's smallest and "
                f"largest budgets ({min(grid)} and {max(grid)}); choose a total between them."
            )


def _check_registered(key: str, name: str, registered: list[str], kind: str) -> None:
    if name not in registered:
        close = difflib.get_close_matches(name, registered, n=1)
        fix = f"did you mean {close[0]!r}, or" if close else "fix the name or"
        raise ConfigError(
            f"config key {key} names {name!r}, which is no registered {kind} ({', '.join(registered)}); {fix} list the "
            "module that registers it under plugins."
        )


def _check_rule_options(key: str, rule: str, score: str, options: Mapping[str, Any]) -> None:
    try:
        get_rule(rule)(score, **options)
    except ValueError as error:
        raise ConfigError(f"config key {key}: {error}") from None


def check_budget_grids(config: Mapping[str, Any]) -> None:
    grids = [(f"cgrpo.budget_grids[{index}]", grid) for index, grid in enumerate(config["cgrpo"]["budget_grids"])]
    if config["replay"].get("budget_grid") is not None:
        grids.append(("replay.budget_grid", config["replay"]["budget_grid"]))
    for key, grid in grids:
        # The schema accepts 2.0 as an integer, and cannot say "strictly increasing".
        if any(type(k) is not int for k in grid) or grid != sorted(set(grid)):
            raise ConfigError(
                f"config key {key} = {grid} must be a strictly increasing list of integers, e.g. [2, 4, 8, 16, 32]."
            )
        try:
            training_grid(grid)
        except ValueError as error:
            raise ConfigError(f"config key {key}: {error}") from None


def check_fixed_deltas(config: Mapping[str, Any]) -> None:
    """Reject a fixed delta below 1/(n+1), which n calibration examples cannot certify."""
    split_size = config["splits"]["sizes"]["calibration"]
    training_size = config["cgrpo"]["options"]["num_calibration_samples"] or split_size
    for key, deltas, size, size_key in [
        ("cgrpo.deltas", config["cgrpo"]["deltas"], training_size, "cgrpo.options.num_calibration_samples"),
        ("evaluation.deltas", config["evaluation"]["deltas"], split_size, "splits.sizes.calibration"),
    ]:
        for delta in deltas:
            if size and delta != "auto" and delta < smallest_supported_delta(size):
                smallest = smallest_supported_delta(size)
                raise ConfigError(
                    f"config key {key} has {delta}, below 1/(n+1) = {smallest:.4f} for the n = {size} calibration "
                    f"examples of {size_key}, which certify coverage up to {1 - smallest:.4f} only: use a delta of "
                    f"at least {smallest:.4f} or more examples."
                )


def check_calibration_size(config: Mapping[str, Any]) -> None:
    """Reject calibration options that need more examples than the calibration split holds, which every calibration
    job would refuse after the base model and the splits."""
    size = config["splits"]["sizes"]["calibration"]
    options = config["cgrpo"]["options"]
    needed = (options["num_calibration_samples"] or 1) + options["calibration_holdout"]
    if size is not None and needed > size:
        raise ConfigError(
            f"config keys cgrpo.options.num_calibration_samples ({options['num_calibration_samples']}) and "
            f"cgrpo.options.calibration_holdout ({options['calibration_holdout']}) need {needed} calibration examples, "
            f"but splits.sizes.calibration is {size}: lower them or raise splits.sizes.calibration."
        )


def needed_splits(eval_source_split: str | None) -> list[str]:
    """The task splits the split rule reads: train, and ``splits.eval_source_split`` when set."""
    return ["train"] + ([eval_source_split] if eval_source_split else [])


def check_task(config: Mapping[str, Any]) -> None:
    """Reject task options the task's factory refuses, data it cannot read, an eval source split for a generated task
    (which has one pool), a score it cannot compute (aps needs
    answers to compare with a gold answer, first_success and pass_rate a verifier) and a bootstrap on another task's
    data."""
    name = config["task"]["name"]
    if name not in available_tasks():
        try:
            get_task(name)
        except ValueError as error:
            raise ConfigError(f"config key task.name: {error}") from None
    options = config["task"]["options"]
    try:
        task = get_task(name, **options)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"config key task.options of task {name!r}: {error}{_task_option_hint(name, options)}"
        ) from None
    eval_source_split = config["splits"]["eval_source_split"]
    if task.source is not None:
        task.source.check(needed_splits(eval_source_split), offline=False)
    elif eval_source_split is not None:
        # The split job would fail on it: a generated task has one pool, which calibration and eval are carved from.
        raise ConfigError(
            f"config key splits.eval_source_split is {eval_source_split!r}, but task {name!r} generates one pool "
            "(split 'train') and has no other split: leave splits.eval_source_split unset (null) to carve the eval "
            "set from that pool."
        )
    if task.source is None:
        # A generated pool costs nothing to build: one with too few questions for the worked examples stops the plan.
        try:
            task.prompt_record()
        except ValueError as error:
            raise ConfigError(f"config key task.options.worked_examples: {error}") from None
    try:
        check_task_score(task, config["cgrpo"]["options"]["score"])
    except ValueError as error:
        raise ConfigError(f"config key cgrpo.options.score: {error}") from None
    if config["base_model"]["bootstrap"]:
        bootstrap_task = config["base_model"]["options"].get("task", "arithmetic")
        # gsm8k shares the arithmetic task's format, so the arithmetic bootstrap serves it.
        expected = "code" if name == "code" else "arithmetic"
        if bootstrap_task != expected:
            raise ConfigError(
                f"config key base_model.options.task is {bootstrap_task!r}, but task {name!r} needs a base model "
                f"bootstrapped on {expected!r} data: set base_model.options.task to {expected!r}."
            )


def _nearest(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _task_option_hint(name: str, options: Mapping[str, Any]) -> str:
    """The nearest keyword of the task's factory to an option it lacks, when its signature lists them all."""
    parameters = inspect.signature(TASKS[name]).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return ""
    unknown = [option for option in options if option not in parameters]
    return _nearest(unknown[0], list(parameters)) if unknown else ""


def check_model(config: Mapping[str, Any]) -> None:
    """Reject bootstrap options the bootstrap lacks, or a model path that holds no saved model."""
    if config["base_model"]["bootstrap"]:
        check_options(config["base_model"]["options"], "base_model.options", BOOTSTRAP_SETTINGS)
        return
    # Offline availability of a hub id is the base_model rule's check: a dry run needs no model.
    try:
        check_model_source(base_model_path(config), offline=False)
    except ValueError as error:
        raise ConfigError(f"config key {error}") from None


def check_trainer_sections(config: Mapping[str, Any]) -> None:
    """Reject GRPOConfig and LoraConfig options that do not exist or have the wrong type, and group sizes set outside
    the grids."""
    # The shared section, then each method's overrides of it.
    sections = {
        "training": config["training"],
        **{f"{method.section}.trainer": config[method.section]["trainer"] for method in METHODS.values()},
    }
    for key, section in sections.items():
        if "num_generations" in section:
            # Group sizes come from cgrpo.budget_grids, grpo.num_generations and dapo.num_generations, one per run.
            raise ConfigError(
                f"config key {key}.num_generations is not allowed: set group sizes with cgrpo.budget_grids, "
                "grpo.num_generations and dapo.num_generations."
            )
        check_options(section, key, GRPO_CONFIG, " (C-GRPO's own options go under cgrpo.options, DAPO's under dapo)")
    if config["peft"]:
        check_options(config["peft"], "peft", LORA_CONFIG)


def generation_batch_size(trainer: Mapping[str, Any]) -> int:
    """Rows per generation batch of a run with `trainer` options, by TRL's rule on one process (the pipeline's): a
    generation batch spans `steps_per_generation` micro-batches, `gradient_accumulation_steps` of them unless set."""
    if trainer.get("generation_batch_size"):
        return int(trainer["generation_batch_size"])
    steps = trainer.get("steps_per_generation") or trainer.get("gradient_accumulation_steps", 1)
    return int(trainer.get("per_device_train_batch_size", 8)) * int(steps)


def check_shared_schedule(config: Mapping[str, Any]) -> None:
    """Reject C-GRPO's own generation-batch option: the pipeline gives every method the same schedule."""
    if config["cgrpo"]["options"]["min_generation_prompts"] is not None:
        raise ConfigError(
            "config key cgrpo.options.min_generation_prompts would give C-GRPO a generation schedule of its own; "
            "set training.steps_per_generation instead, which every method shares."
        )


def check_batch_sizes(config: Mapping[str, Any]) -> None:
    """Reject a run whose generation batch cannot hold whole groups of its group size (C-GRPO's largest budget), or
    a baseline that cannot train C-GRPO's prompts per step (`cgrpo.pipeline.configuration.methods`)."""
    for run in static_runs(config):
        try:
            spec = train_spec(config, run, "model", "splits", "initial-calibration")
        except ValueError as error:
            raise ConfigError(f"config key {error}") from None
        trainer, section = spec.trainer, METHODS[spec.method].section
        size = spec.num_generations or max(spec.budget_grid)
        key = "cgrpo.budget_grids" if spec.budget_grid else f"{section}.num_generations"
        batch = generation_batch_size(trainer)
        if batch % size:
            raise ConfigError(
                f"config key {key} has group size {size}, but {spec.method}'s generation batch of {batch} rows "
                f"(per_device_train_batch_size x steps_per_generation, from training and {section}.trainer) does not "
                f"hold whole groups of {size}: make the batch a multiple of {size}."
            )
