"""Trainer builders of the pipeline's methods: each loads the model, data and reward functions as a user's script would.

`cgrpo.pipeline.configuration.methods` names one builder per method; every builder takes the run's spec, the trainer's output folder
and, for a method that starts from the pipeline's initial calibration, that calibration's record.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from trl import GRPOConfig

from ...config import CGRPOConfig
from ...support.models import gguf_parts, load_model, load_tokenizer
from ..configuration.specs import CalibrationSpec, TrainSpec
from ..tasks import get_task
from ..tasks.splits import load_split
from .timing import TimedGRPOTrainer

Spec = CalibrationSpec | TrainSpec


def cgrpo_trainer(spec: TrainSpec, output_dir: Path, initial: dict[str, Any] | None):
    """A C-GRPO run's trainer; `initial` holds the thresholds refitted from the initial calibration, and its cost."""
    return _cgrpo_trainer(spec, output_dir, spec.delta, spec.recalibrate_every, initial)


def ablation_trainer(spec: TrainSpec, output_dir: Path, initial: None = None):
    """C-GRPO's trainer with another stopping rule (`spec.cgrpo["stopping_rule"]`); a calibrated one calibrates itself
    on the calibration split, before the first step, with the trainer counting its cost."""
    from ...trainer import CGRPOTrainer

    torch.manual_seed(spec.seed)
    task = task_of(spec)
    args = CGRPOConfig(budget_grid=list(spec.budget_grid), **spec.cgrpo, **_trainer_options(spec, output_dir))
    return CGRPOTrainer(
        **_policy(spec),
        reward_funcs=task.reward_funcs,
        args=args,
        train_dataset=_split(spec, task, "train"),
        calibration_dataset=_split(spec, task, "calibration") if args.calibrated else None,
        answer_extractor=task.extract,
        verifier=task.verifier,
        peft_config=_peft_config(spec),
    )


def calibration_trainer(spec: CalibrationSpec, output_dir: Path):
    """A C-GRPO trainer for the initial calibration of `spec.budget_grid` (automatic delta; it never trains).

    With a colocated vLLM engine (`spec.trainer["use_vllm"]`) a GGUF checkpoint or an adapter, which TRL's engine
    cannot read by name, is loaded from a plain copy deleted once the trainer is built: calibration saves no model
    that would name the copy as its base.
    """
    if not spec.trainer.get("use_vllm"):
        return _cgrpo_trainer(spec, output_dir, "auto", 0, None)
    from .vllm_backend import plain_copy

    with plain_copy(spec.model) as model:
        return _cgrpo_trainer(replace(spec, model=model), output_dir, "auto", 0, None)


def grpo_trainer(spec: TrainSpec, output_dir: Path, initial: None = None) -> TimedGRPOTrainer:
    """A fixed-group GRPO run's trainer, at G = `spec.num_generations`."""
    torch.manual_seed(spec.seed)
    task = task_of(spec)
    args = GRPOConfig(num_generations=int(spec.num_generations), **_trainer_options(spec, output_dir))
    return TimedGRPOTrainer(
        **_policy(spec),
        reward_funcs=task.reward_funcs,
        args=args,
        train_dataset=_split(spec, task, "train"),
        peft_config=_peft_config(spec),
    )


def dapo_trainer(spec: TrainSpec, output_dir: Path, initial: None = None):
    """A DAPO run's trainer: GRPO at G = `spec.num_generations` with dynamic sampling (`spec.dynamic`)."""
    from ...dapo.config import DynamicSamplingConfig
    from ...dapo.trainer import DynamicSamplingGRPOTrainer

    torch.manual_seed(spec.seed)
    task = task_of(spec)
    options = {**spec.dynamic, "filter_metric": _reward_name(task, spec.dynamic["filter_metric"])}
    args = DynamicSamplingConfig(
        num_generations=int(spec.num_generations), **options, **_trainer_options(spec, output_dir)
    )
    return DynamicSamplingGRPOTrainer(
        **_policy(spec),
        reward_funcs=task.reward_funcs,
        args=args,
        train_dataset=_split(spec, task, "train"),
        peft_config=_peft_config(spec),
    )


def _cgrpo_trainer(spec: Spec, output_dir: Path, delta, recalibrate_every: int, initial: dict[str, Any] | None):
    from ...trainer import CGRPOTrainer

    torch.manual_seed(spec.seed)
    task = task_of(spec)
    args = CGRPOConfig(
        budget_grid=list(spec.budget_grid),
        conformal_delta=None if delta == "auto" else float(delta),
        recalibrate_every=int(recalibrate_every),
        **spec.cgrpo,
        **_trainer_options(spec, output_dir),
    )
    return CGRPOTrainer(
        **_policy(spec),
        reward_funcs=task.reward_funcs,
        args=args,
        train_dataset=_split(spec, task, "train"),
        calibration_dataset=_split(spec, task, "calibration"),
        answer_extractor=task.extract,
        verifier=task.verifier,
        initial_thresholds=initial and initial["thresholds"],
        initial_calibration_rollouts=initial["rollouts"] if initial else 0,
        peft_config=_peft_config(spec),
    )


def _policy(spec: Spec) -> dict[str, Any]:
    """The trainer's `model` (and `processing_class`): the location, which TRL loads, or for a GGUF checkpoint, which
    TRL cannot load by name, the model and tokenizer loaded here in float32 as TRL would."""
    if gguf_parts(spec.model)[1] is None:
        return {"model": spec.model}
    return {
        "model": load_model(spec.model, dtype=torch.float32),
        "processing_class": load_tokenizer(spec.model, padding_side="left", truncation_side="left"),
    }


def _reward_name(task, metric: str) -> str | None:
    """The pipeline's `filter_metric` as the trainer takes it: `correctness` is the task's first reward function, the
    correctness reward of every task here (verl's `acc`), and `combined` the weighted sum (None)."""
    if metric == "combined":
        return None
    if metric != "correctness":
        return metric
    # Named as TRL names a reward function: a partial by the function it wraps.
    first = task.reward_funcs[0]
    return getattr(first, "func", first).__name__


def task_of(spec: Spec):
    """The task of a job's spec, built from its name and options."""
    return get_task(spec.task["name"], **spec.task["options"])


def _split(spec: Spec, task, name: str):
    dataset = task.to_prompt_dataset(load_split(spec.splits, name))
    seed = _calibration_prompt_seed(spec) if name == "calibration" else None
    # A calibration takes the first prompts of its set: shuffled with a seed, which prompts calibrate varies by seed.
    return dataset if seed is None else dataset.shuffle(seed=seed)


def _calibration_prompt_seed(spec: Spec) -> int | None:
    return spec.prompt_seed if isinstance(spec, CalibrationSpec) else spec.calibration_prompt_seed


def _trainer_options(spec: Spec, output_dir: Path) -> dict[str, Any]:
    # Checkpoints let a killed training job resume; two are kept so that one is complete whenever a job is killed.
    options = {
        "report_to": [],
        "save_strategy": "steps",
        "save_total_limit": 2,
        "logging_steps": 1,
        "seed": spec.seed,
        "data_seed": spec.seed,
    }
    options.update(spec.trainer)
    options["output_dir"] = str(output_dir)
    return options


def _peft_config(spec: Spec):
    if not spec.peft:
        return None
    from peft import LoraConfig

    return LoraConfig(task_type="CAUSAL_LM", **spec.peft)
