"""Typed specs of the pipeline's steps, built from the validated config: the experiment's policy in one place.

The Snakemake rules (`workflow/rules/common.smk`) call the builders here with their wildcards and inputs and hand the
result, as a plain dict (`to_dict`), to the step's script; the step's library function reads it back (`from_dict`).
The specs of training and evaluation runs, which depend on the method a run name names, are built by
`cgrpo.pipeline.configuration.methods` from the pieces here.

The policy: every run is evaluated on the first budget grid (so that eval metrics compare across runs), savings are
measured against GRPO at G = max(first grid), the initial calibration of a grid uses the split seed (one calibration
serves every training seed) unless `cgrpo.calibrate_per_seed` draws one per seed, and a method's trainer options are
`training` updated with `<method>.trainer`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ...support.models import GGUF_SUFFIX, model_location
from ...support.user_code import VERIFIER_TIMEOUT_S
from ...support.vllm_colocate import CPU_OPTIONS
from ..tasks.files import hub_offline

__all__ = [
    "CalibrationSpec",
    "EvaluationSpec",
    "FormatRateSpec",
    "TrainSpec",
    "base_model_path",
    "calibration_seed",
    "calibration_spec",
    "check_model_source",
    "evaluation_grid",
    "evaluation_settings",
    "format_delta",
    "format_grid",
    "format_rate_spec",
    "method_trainer",
    "parse_delta",
    "parse_grid",
    "pool_samples",
    "replay_grid",
    "task_spec",
]


# --------------------------------------------------------------------------- spelling and run names


def format_grid(grid: Sequence[int]) -> str:
    """A budget grid as paths and run names spell it: [2, 4, 8] -> "2-4-8"."""
    return "-".join(str(int(k)) for k in grid)


def parse_grid(text: str) -> list[int]:
    """Inverse of :func:`format_grid`."""
    return [int(k) for k in text.split("-")]


def format_delta(delta: Any) -> str:
    """``"auto"`` or the shortest spelling of a fixed delta (0.1 -> ``"0.1"``)."""
    return "auto" if delta == "auto" else f"{float(delta):g}"


def parse_delta(text: str) -> str | float:
    """Inverse of :func:`format_delta`: ``"auto"`` or a float."""
    return "auto" if text == "auto" else float(text)


# --------------------------------------------------------------------------- model sources


def base_model_path(config: Mapping[str, Any]) -> str:
    """Where a configured (not bootstrapped) base model loads from: `base_model.path`, with `base_model.gguf_file`
    joined to it and ``package:<module>`` made the installed package's folder (see `cgrpo.support.models.model_location`)."""
    base_model = config["base_model"]
    return model_location(base_model["path"], base_model.get("gguf_file"))


def check_model_source(location: str, offline: bool | None = None) -> None:
    """Raise a ValueError naming `base_model.path` unless `location` is a saved model folder, a GGUF file or a
    reachable hub id.

    A location that exists must be a folder with `config.json`, or a `.gguf` file. One that does not exist is a hub id ("org/name"),
    unless it is spelled like a path (absolute, starting with ".", or with more than one "/"). Offline (`offline`, by
    default the `HF_HUB_OFFLINE` variable), a hub id must already be in the local Hugging Face cache.
    """
    path = Path(location)
    if location.endswith(GGUF_SUFFIX):
        if not path.is_file():
            raise ValueError(
                f"base_model.path {location!r} is no GGUF file; fix base_model.path or base_model.gguf_file."
            )
        return
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"base_model.path {location!r} has no config.json; point it at a folder saved with save_pretrained."
            )
        return
    if path.is_absolute() or location.startswith(".") or location.count("/") > 1:
        raise ValueError(
            f"base_model.path {location!r} does not exist; fix the path or set base_model.bootstrap: true."
        )
    offline = hub_offline() if offline is None else offline
    if offline:
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(location, "config.json"), str):
            raise ValueError(
                f"base_model.path {location!r} is a hub id that is not in the local cache, and HF_HUB_OFFLINE is set; "
                f"download it first (huggingface-cli download {location}) or point the path at a local folder."
            )


# --------------------------------------------------------------------------- specs


# A spec field added after results existed: left out of the spec while at its default, so that the spec files of
# existing results, and so their cached outputs, stay as they were.
OPTIONAL = {"optional": True}


class _Spec:
    """Plain-dict round trip, for Snakemake params and for callers that build specs by hand."""

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for spec_field in fields(self):
            if spec_field.metadata.get("optional") and data[spec_field.name] == spec_field.default:
                del data[spec_field.name]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | _Spec):
        if isinstance(data, cls):
            return data
        names = {field.name for field in fields(cls)}
        needed = [f for f in fields(cls) if not f.metadata.get("optional")]
        unknown, missing = set(data) - names, {f.name for f in needed if f.name not in data}
        if unknown or missing:
            raise ValueError(
                f"{cls.__name__} got unknown keys {sorted(unknown)} and lacks {sorted(missing)}; build it with "
                "cgrpo.pipeline.configuration.specs."
            )
        return cls(**data)


@dataclass(frozen=True)
class _StepSpec(_Spec):
    """What every step loads: the model (a path or hub id), the split folder, the task and the seed."""

    model: str
    splits: str
    task: dict[str, Any]
    seed: int


@dataclass(frozen=True)
class CalibrationSpec(_StepSpec):
    """The initial calibration of one budget grid (rule calibrate, `cgrpo.pipeline.jobs.runs.calibrate_initial`).

    `prompt_seed` draws the calibration prompts from the calibration split with that seed (None: the split's first
    ones), so that which prompts calibrate varies between seeds.
    """

    budget_grid: list[int]
    cgrpo: dict[str, Any]
    trainer: dict[str, Any]
    peft: dict[str, Any] | None
    prompt_seed: int | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class TrainSpec(_StepSpec):
    """One training run (rules train_cgrpo and train, `cgrpo.pipeline.jobs.runs.train_run`).

    C-GRPO runs set `budget_grid`, `delta`, `recalibrate_every`, `cgrpo` (the `CGRPOConfig` options of
    `cgrpo.options`, dynamic sampling's `drop_unanimous` and `max_sampling_rounds` among them) and
    `initial_calibration`; GRPO runs set `num_generations` and `compute_matched`; DAPO runs set `num_generations` and
    `dynamic` (`prompts_per_round`, `max_sampling_rounds`). `reference_budget` is the G savings are measured against.
    With a rollout budget, `budget` holds it (`rollouts`, `include_calibration`, `milestones`: see
    :func:`budget_spec`); `calibration_prompt_seed` draws a calibrated rule's calibration prompts as
    `CalibrationSpec.prompt_seed` does.
    """

    run: str
    method: str
    trainer: dict[str, Any]
    peft: dict[str, Any] | None
    reference_budget: int
    budget_grid: list[int] | None = None
    delta: str | float | None = None
    recalibrate_every: int | None = None
    cgrpo: dict[str, Any] | None = None
    initial_calibration: str | None = None
    num_generations: int | None = None
    compute_matched: bool = False
    dynamic: dict[str, Any] | None = None
    budget: dict[str, Any] | None = field(default=None, metadata=OPTIONAL)
    calibration_prompt_seed: int | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class CurveSpec(_StepSpec):
    """The learning curve of one run (rule curve, `cgrpo.pipeline.jobs.curves.evaluate_curve`): every milestone model
    the run kept (`record`, its run.json; None for the base model, whose curve is its one point at no rollouts),
    sampled on the eval split with `evaluation` (`samples` per prompt, `temperature`, `max_new_tokens`,
    `batch_size`)."""

    run: str
    record: str | None
    evaluation: dict[str, Any]


@dataclass(frozen=True)
class EvaluationSpec(_StepSpec):
    """The evaluation of one model (rule evaluate, `cgrpo.pipeline.jobs.evaluation.evaluate_model`).

    `evaluation` holds the resolved settings: `budget_grid`, the nonconformity `score`, `temperature`,
    `max_new_tokens`, `batch_size`, the fixed `deltas`, the automatic delta's `delta_margin` and `split_delta`, the
    sampling `backend` (hf or vllm), and `pool_samples` where the replay asks for more samples per prompt than the
    grid's largest budget.
    """

    run: str
    evaluation: dict[str, Any]


@dataclass(frozen=True)
class FormatRateSpec(_StepSpec):
    """The base model's format rate before training (rule format_rate, `cgrpo.pipeline.jobs.format_rate`).

    The train split's first `prompts` prompts, `samples` each, drawn as the base model's evaluation draws them
    (`evaluation`: its `temperature`, `max_new_tokens`, `batch_size` and `backend`).
    """

    prompts: int
    samples: int
    evaluation: dict[str, Any]


# --------------------------------------------------------------------------- builders from the config


def method_trainer(config: Mapping[str, Any], section: str | None) -> dict[str, Any]:
    """`GRPOConfig` options of a method: `training` updated with `<section>.trainer` (`training` alone for None)."""
    if section is None:
        return dict(config["training"])
    return {**config["training"], **config[section]["trainer"]}


def cgrpo_options(options: Mapping[str, Any], trainer: Mapping[str, Any]) -> dict[str, Any]:
    """C-GRPO's trainer options as a job's spec holds them: `stream_increments` only where the job trains with vLLM,
    the one place it changes anything, so that the specs (and cached results) of every other job stay as they were
    before the option existed."""
    options = dict(options)
    if not trainer.get("use_vllm"):
        options.pop("stream_increments", None)
    return options


def task_spec(config: Mapping[str, Any]) -> dict[str, Any]:
    """The task's name and factory options, as every spec carries them."""
    return {"name": config["task"]["name"], "options": dict(config["task"]["options"])}


def evaluation_grid(config: Mapping[str, Any]) -> list[int]:
    """The grid every run is scored on (the first), so that eval metrics compare across runs."""
    return list(config["cgrpo"]["budget_grids"][0])


def replay_grid(config: Mapping[str, Any]) -> list[int]:
    """The grid the replay's rules stop along: `replay.budget_grid`, else the evaluation grid."""
    return list(config["replay"].get("budget_grid") or evaluation_grid(config))


def pool_samples(config: Mapping[str, Any], run: str) -> int:
    """Samples per calibration and eval prompt the evaluation of `run` draws: the evaluation grid's largest budget,
    or the replay grid's where `run` is replayed and that is larger."""
    largest = max(evaluation_grid(config))
    return max(largest, max(replay_grid(config))) if run in config["replay"]["models"] else largest


def calibration_seed(config: Mapping[str, Any], run_seed: int) -> int:
    """The seed of the initial calibration a run of seed `run_seed` starts from: its own with
    `cgrpo.calibrate_per_seed`, else the split seed, the one calibration every seed shares."""
    return int(run_seed) if config["cgrpo"]["calibrate_per_seed"] else int(config["splits"]["seed"])


def calibration_spec(config: Mapping[str, Any], grid: str, seed: int, model: str, splits: str) -> CalibrationSpec:
    """The initial calibration of the grid spelled `grid`, drawn with `seed` (see :func:`calibration_seed`)."""
    return CalibrationSpec(
        model=model,
        splits=splits,
        task=task_spec(config),
        budget_grid=parse_grid(grid),
        seed=int(seed),
        # Calibration samples whole groups in one call: it never streams.
        cgrpo=cgrpo_options(config["cgrpo"]["options"], {}),
        trainer=calibration_trainer_options(config),
        peft=config["peft"],
        prompt_seed=calibration_prompt_seed(config, int(seed)),
    )


def calibration_prompt_seed(config: Mapping[str, Any], seed: int) -> int | None:
    """The seed a calibration of seed `seed` draws its prompts with (`cgrpo.resample_calibration_prompts`), or None
    for the calibration split's first prompts."""
    return int(seed) if config["cgrpo"].get("resample_calibration_prompts") else None


# The learning-rate schedule over the budget where the config leaves `budget.lr_schedule` out: transformers' default,
# a linear decay to zero, spread over the budget instead of the steps.
LR_SCHEDULE = {"shape": "linear", "warmup_share": 0.0, "end_factor": 0.0}


def budget_spec(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """Every run's rollout budget (`budget`): the rollouts that end it, whether calibration counts, its milestones,
    `budget.milestones` equal parts of the budget, and the learning-rate schedule over it (`lr_schedule`, the
    arguments of `cgrpo.BudgetLRSchedule`); None where the step count ends training."""
    budget = config.get("budget") or {}
    if budget.get("rollouts") is None:
        return None
    rollouts, parts = int(budget["rollouts"]), int(budget["milestones"])
    return {
        "rollouts": rollouts,
        "include_calibration": bool(budget["include_calibration"]),
        "milestones": [-(-rollouts * part // parts) for part in range(1, parts + 1)],
        "lr_schedule": {**LR_SCHEDULE, **(budget.get("lr_schedule") or {})},
    }


def budget_max_steps(rollouts: int, trainer: Mapping[str, Any], width: int, smallest_group: int) -> int:
    """Optimizer steps enough for a run to spend `rollouts`, so that the budget, never the step count, ends it.

    A step trains `per_device_train_batch_size * gradient_accumulation_steps / width` prompts (groups `width` rows
    wide), each of which drew at least `smallest_group` rollouts; one generation batch more covers the batch that
    crosses the budget.
    """
    prompts = max(
        1, int(trainer["per_device_train_batch_size"]) * int(trainer.get("gradient_accumulation_steps", 1)) // width
    )
    span = int(trainer.get("steps_per_generation") or 1) * int(trainer.get("num_iterations", 1))
    return -(-rollouts // (prompts * smallest_group)) + span


# GRPOConfig options that shape only the optimizer's steps (their size, number and loss) and what training saves or
# logs. The calibration job builds a trainer to sample, never to train: its spec leaves them out, so that editing one
# does not rerun the calibration.
TRAINING_ONLY_OPTIONS = frozenset(
    {
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "beta",
        "learning_rate",
        "logging_steps",
        "loss_type",
        "lr_scheduler_kwargs",
        "lr_scheduler_type",
        "max_grad_norm",
        "max_steps",
        "num_train_epochs",
        "optim",
        "optim_args",
        "report_to",
        "save_steps",
        "save_strategy",
        "save_total_limit",
        "warmup_ratio",
        "warmup_steps",
        "weight_decay",
    }
)


def calibration_trainer_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """`GRPOConfig` options of the calibration job: C-GRPO's less :data:`TRAINING_ONLY_OPTIONS`, with a colocated
    vLLM engine when `cgrpo.calibration_backend` is vllm; where training runs on CPU, vLLM's CPU options fill the
    `vllm_*` keys the config leaves unset (`vllm_max_model_length`: 256 tokens of prompt and completion, unless set)."""
    trainer = {key: value for key, value in method_trainer(config, "cgrpo").items() if key not in TRAINING_ONLY_OPTIONS}
    if config["cgrpo"].get("calibration_backend", "training") != "vllm":
        return trainer
    cpu = {key: value for key, value in CPU_OPTIONS.items() if key not in trainer} if trainer.get("use_cpu") else {}
    return {**trainer, **cpu, "use_vllm": True, "vllm_mode": "colocate"}


def evaluation_settings(config: Mapping[str, Any], trainer: Mapping[str, Any]) -> dict[str, Any]:
    """Resolved evaluation settings of a model trained with `trainer` options.

    Unset (null) evaluation options take the training temperature (TRL's 1.0 when unset) and completion length (64
    new tokens when unset: TRL's own default depends on its version).
    """
    evaluation = config["evaluation"]
    options = config["cgrpo"]["options"]
    return {
        "budget_grid": evaluation_grid(config),
        "score": options["score"],
        "temperature": float(
            evaluation["temperature"] if evaluation["temperature"] is not None else trainer.get("temperature", 1.0)
        ),
        "max_new_tokens": int(
            evaluation["max_new_tokens"]
            if evaluation["max_new_tokens"] is not None
            else trainer.get("max_completion_length", 64)
        ),
        "batch_size": int(evaluation["batch_size"]),
        "deltas": [float(delta) for delta in evaluation["deltas"]],
        "delta_margin": float(options["delta_margin"]),
        "split_delta": bool(evaluation["split_delta"]),
        "backend": evaluation.get("backend", "hf"),
        "verifier_timeout_s": options.get("verifier_timeout_s", VERIFIER_TIMEOUT_S),
        "coverage_splits": int(config["statistics"]["coverage_splits"]),
        "statistics_seed": int(config["statistics"]["seed"]),
    }


def format_rate_spec(config: Mapping[str, Any], model: str, splits: str) -> FormatRateSpec:
    """The format-rate check of `format_check`, on the base model, seeded with the split seed."""
    settings = evaluation_settings(config, method_trainer(config, None))
    check = config["format_check"]
    return FormatRateSpec(
        model=model,
        splits=splits,
        task=task_spec(config),
        seed=int(config["splits"]["seed"]),
        prompts=int(check["prompts"]),
        samples=int(check["samples"]),
        evaluation={key: settings[key] for key in ("temperature", "max_new_tokens", "batch_size", "backend")},
    )


def replay_spec(config: Mapping[str, Any], records: list[str]) -> dict[str, Any]:
    """The replay of `records` (cgrpo.pipeline.analysis.replay.run_replay), as plain data: the first grid, the score, the
    `replay` settings, the statistics seed and resamples of every other interval, and C-GRPO's first delta (None for
    the automatic one), which every rule is paired against."""
    replay = config["replay"]
    delta = config["cgrpo"]["deltas"][0]
    return {
        "records": list(records),
        "grid": replay_grid(config),
        "score": config["cgrpo"]["options"]["score"],
        "resplits": int(replay["resplits"]),
        "seed": int(config["statistics"]["seed"]),
        "resamples": int(config["statistics"]["bootstrap_resamples"]),
        "settings": {rule: list(values) for rule, values in replay["settings"].items()},
        "options": {rule: dict(options) for rule, options in replay["options"].items()},
        "plugins": list(config["plugins"]),
        "reference": None if delta == "auto" else float(delta),
    }
