"""Typed specs of the pipeline's steps, built from the validated config: the experiment's policy in one place.

The Snakemake rules (`workflow/rules/common.smk`) call the builders here with their wildcards and inputs and hand the
result, as a plain dict (`to_dict`), to the step's script; the step's library function reads it back (`from_dict`).
Run names, and the spelling of grids and deltas in them, are built and parsed here and nowhere else.

The policy: every run is evaluated on the first budget grid (so that eval metrics compare across runs), savings are
measured against GRPO at G = max(first grid), the initial calibration of a grid uses the split seed (one calibration
serves every training seed), and a method's trainer options are `training` updated with `<method>.trainer`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..user_code import VERIFIER_TIMEOUT_S
from .tasks.files import hub_offline

__all__ = [
    "CalibrationSpec",
    "EvaluationSpec",
    "RUN_NAME_PATTERN",
    "RunName",
    "TrainSpec",
    "calibration_spec",
    "check_model_source",
    "cgrpo_run_name",
    "dapo_run_name",
    "evaluation_spec",
    "format_delta",
    "format_grid",
    "grpo_run_name",
    "method_trainer",
    "parse_delta",
    "parse_grid",
    "parse_run_name",
    "task_spec",
    "train_cgrpo_spec",
    "train_dapo_spec",
    "train_grpo_spec",
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


def cgrpo_run_name(seed: int, grid: Sequence[int], delta: Any, recalibrate_every: int) -> str:
    """``cgrpo_s<seed>_g<grid>_d<delta>_r<recalibrate_every>``."""
    return f"cgrpo_s{int(seed)}_g{format_grid(grid)}_d{format_delta(delta)}_r{int(recalibrate_every)}"


def grpo_run_name(seed: int, group_size: int, matched: bool = False) -> str:
    """``grpo_s<seed>_G<group_size>``, with ``_matched`` for a compute-matched baseline."""
    return f"grpo_s{int(seed)}_G{int(group_size)}" + ("_matched" if matched else "")


def dapo_run_name(seed: int, group_size: int) -> str:
    """``dapo_s<seed>_G<group_size>``: GRPO with DAPO's dynamic sampling."""
    return f"dapo_s{int(seed)}_G{int(group_size)}"


_RUN_NAME = re.compile(
    r"(?P<base>base)"
    r"|cgrpo_s(?P<cgrpo_seed>\d+)_g(?P<grid>\d+(?:-\d+)*)_d(?P<delta>auto|[0-9.]+(?:e-?[0-9]+)?)_r(?P<recal>\d+)"
    r"|grpo_s(?P<grpo_seed>\d+)_G(?P<group_size>\d+)(?P<matched>_matched)?"
    r"|dapo_s(?P<dapo_seed>\d+)_G(?P<dapo_size>\d+)"
)


# The same grammar without group names, for Snakemake's `run` wildcard constraint.
RUN_NAME_PATTERN = re.sub(r"\(\?P<\w+>", "(?:", _RUN_NAME.pattern)


@dataclass(frozen=True)
class RunName:
    """What a run name says: the method (``"base"``, ``"cgrpo"``, ``"grpo"`` or ``"dapo"``) and its settings."""

    method: str
    seed: int | None = None
    budget_grid: tuple[int, ...] | None = None
    delta: str | float | None = None
    recalibrate_every: int | None = None
    num_generations: int | None = None
    compute_matched: bool = False


def parse_run_name(name: str) -> RunName:
    """Inverse of :func:`cgrpo_run_name`, :func:`grpo_run_name` and :func:`dapo_run_name` (and ``"base"``)."""
    match = _RUN_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"{name!r} is not a run name; expect base, cgrpo_s0_g2-4-8_dauto_r50, grpo_s0_G8 or dapo_s0_G8.")
    if match["base"]:
        return RunName("base")
    if match["cgrpo_seed"] is not None:
        return RunName("cgrpo", int(match["cgrpo_seed"]), tuple(parse_grid(match["grid"])),
                       parse_delta(match["delta"]), int(match["recal"]))
    if match["dapo_seed"] is not None:
        return RunName("dapo", int(match["dapo_seed"]), num_generations=int(match["dapo_size"]))
    return RunName("grpo", int(match["grpo_seed"]), num_generations=int(match["group_size"]),
                   compute_matched=match["matched"] is not None)


# --------------------------------------------------------------------------- model sources


def check_model_source(location: str, offline: bool | None = None) -> None:
    """Raise a ValueError naming `base_model.path` unless `location` is a saved model folder or a reachable hub id.

    A location that exists must be a folder with `config.json`. One that does not exist is a hub id ("org/name"),
    unless it is spelled like a path (absolute, starting with ".", or with more than one "/"). Offline (`offline`, by
    default the `HF_HUB_OFFLINE` variable), a hub id must already be in the local Hugging Face cache.
    """
    path = Path(location)
    if path.exists():
        if not (path / "config.json").is_file():
            raise ValueError(f"base_model.path {location!r} has no config.json; point it at a folder saved with "
                             "save_pretrained.")
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


class _Spec:
    """Plain-dict round trip, for Snakemake params and for callers that build specs by hand."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | _Spec):
        if isinstance(data, cls):
            return data
        names = {field.name for field in fields(cls)}
        unknown, missing = set(data) - names, {f.name for f in fields(cls) if f.name not in data}
        if unknown or missing:
            raise ValueError(
                f"{cls.__name__} got unknown keys {sorted(unknown)} and lacks {sorted(missing)}; build it with "
                "cgrpo.pipeline.specs."
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
    """The initial calibration of one budget grid (rule calibrate, `cgrpo.pipeline.runs.calibrate_initial`)."""

    budget_grid: list[int]
    cgrpo: dict[str, Any]
    trainer: dict[str, Any]
    peft: dict[str, Any] | None


@dataclass(frozen=True)
class TrainSpec(_StepSpec):
    """One training run (rules train_cgrpo, train_grpo and train_dapo, `cgrpo.pipeline.runs.train_run`).

    C-GRPO runs set `budget_grid`, `delta`, `recalibrate_every`, `cgrpo` (the `CGRPOConfig` options of
    `cgrpo.options`, dynamic sampling's `drop_unanimous` and `max_sampling_rounds` among them) and
    `initial_calibration`; GRPO runs set `num_generations` and `compute_matched`; DAPO runs set `num_generations` and
    `dynamic` (`prompts_per_round`, `max_sampling_rounds`). `reference_budget` is the G savings are measured against.
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


@dataclass(frozen=True)
class EvaluationSpec(_StepSpec):
    """The evaluation of one model (rule evaluate, `cgrpo.pipeline.evaluation.evaluate_model`).

    `evaluation` holds the resolved settings: `budget_grid`, the nonconformity `score`, `temperature`,
    `max_new_tokens`, `batch_size`, the fixed `deltas`, the automatic delta's `delta_margin` and `split_delta`, and the
    sampling `backend` (hf or vllm).
    """

    run: str
    evaluation: dict[str, Any]


# --------------------------------------------------------------------------- builders from the config


def method_trainer(config: Mapping[str, Any], method: str) -> dict[str, Any]:
    """`GRPOConfig` options of a method: `training` updated with `<method>.trainer` (`training` alone for the base)."""
    if method not in ("cgrpo", "grpo", "dapo"):
        return dict(config["training"])
    return {**config["training"], **config[method]["trainer"]}


def task_spec(config: Mapping[str, Any]) -> dict[str, Any]:
    """The task's name and factory options, as every spec carries them."""
    return {"name": config["task"]["name"], "options": dict(config["task"]["options"])}


def _evaluation_grid(config: Mapping[str, Any]) -> list[int]:
    # Every run is scored on the same grid, so that its eval metrics compare across runs.
    return list(config["cgrpo"]["budget_grids"][0])


def calibration_spec(config: Mapping[str, Any], grid: str, model: str, splits: str) -> CalibrationSpec:
    """The initial calibration of the grid spelled `grid`; it uses the split seed, since it serves every seed."""
    return CalibrationSpec(
        model=model, splits=splits, task=task_spec(config), budget_grid=parse_grid(grid), seed=config["splits"]["seed"],
        cgrpo=dict(config["cgrpo"]["options"]), trainer=method_trainer(config, "cgrpo"), peft=config["peft"],
    )


def train_cgrpo_spec(config: Mapping[str, Any], run: str, model: str, splits: str, calibration: str) -> TrainSpec:
    """The C-GRPO run named `run`, starting from the initial calibration in `calibration`."""
    name = parse_run_name(run)
    return TrainSpec(
        run=run, method="cgrpo", model=model, splits=splits, task=task_spec(config), seed=name.seed,
        trainer=method_trainer(config, "cgrpo"), peft=config["peft"], reference_budget=max(name.budget_grid),
        budget_grid=list(name.budget_grid), delta=name.delta, recalibrate_every=name.recalibrate_every,
        cgrpo=dict(config["cgrpo"]["options"]), initial_calibration=calibration,
    )


def train_grpo_spec(config: Mapping[str, Any], run: str, model: str, splits: str) -> TrainSpec:
    """The fixed-group GRPO run named `run`; its savings are measured against G = max(first grid)."""
    name = parse_run_name(run)
    return TrainSpec(
        run=run, method="grpo", model=model, splits=splits, task=task_spec(config), seed=name.seed,
        trainer=method_trainer(config, "grpo"), peft=config["peft"],
        reference_budget=max(_evaluation_grid(config)), num_generations=name.num_generations,
        compute_matched=name.compute_matched,
    )


def train_dapo_spec(config: Mapping[str, Any], run: str, model: str, splits: str) -> TrainSpec:
    """The DAPO run named `run`: GRPO at its G with dynamic sampling; savings are measured against G = max(first grid)."""
    name = parse_run_name(run)
    dapo = config["dapo"]
    return TrainSpec(
        run=run, method="dapo", model=model, splits=splits, task=task_spec(config), seed=name.seed,
        trainer=method_trainer(config, "dapo"), peft=config["peft"],
        reference_budget=max(_evaluation_grid(config)), num_generations=name.num_generations,
        dynamic={"prompts_per_round": dapo["prompts_per_round"], "max_sampling_rounds": dapo["max_sampling_rounds"]},
    )


def evaluation_spec(config: Mapping[str, Any], run: str, model: str, splits: str) -> EvaluationSpec:
    """The evaluation of `run` (or ``"base"``): its training seed, the first grid, and sampling as in training.

    The base model is evaluated with the split seed and the `training` options; unset (null) evaluation options take
    the training temperature (TRL's 1.0 when unset) and completion length (64 new tokens when unset: TRL's own default
    depends on its version).
    """
    name = parse_run_name(run)
    trainer = method_trainer(config, name.method)
    evaluation = config["evaluation"]
    grid = _evaluation_grid(config)
    settings = {
        "budget_grid": grid,
        "score": config["cgrpo"]["options"]["score"],
        "temperature": float(evaluation["temperature"] if evaluation["temperature"] is not None
                             else trainer.get("temperature", 1.0)),
        "max_new_tokens": int(evaluation["max_new_tokens"] if evaluation["max_new_tokens"] is not None
                              else trainer.get("max_completion_length", 64)),
        "batch_size": int(evaluation["batch_size"]),
        "deltas": [float(delta) for delta in evaluation["deltas"]],
        "delta_margin": float(config["cgrpo"]["options"]["delta_margin"]),
        "split_delta": bool(evaluation["split_delta"]),
        "backend": evaluation.get("backend", "hf"),
        "verifier_timeout_s": config["cgrpo"]["options"].get("verifier_timeout_s", VERIFIER_TIMEOUT_S),
    }
    seed = name.seed if name.seed is not None else config["splits"]["seed"]
    return EvaluationSpec(run=run, model=model, splits=splits, task=task_spec(config), seed=seed, evaluation=settings)
