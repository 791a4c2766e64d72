"""A run's learning curve: every milestone model its rollout budget kept, sampled on the eval split (rule curve), and
its final model (the budget's) on the validation split where the splits have one.

Each point is a milestone of the run's record (`run.json`'s `budget`): the rollouts generated up to it (as budgeted,
and training's alone), the training's CPU and wall seconds, and each eval prompt's sampled accuracy (the share of
`samples` answers that are right: mean@k per prompt). The base model's curve is its one point, at no rollouts and no
seconds. Every model of every run with the same seed is sampled with the same seeds, so that the draws of two
methods' models at a milestone differ by the models alone.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from ..configuration.specs import CurveSpec
from ..metrics.accuracy import correct_flags
from ..tasks import get_task
from ..tasks.splits import VALIDATION, load_split, split_names
from .evaluation import sampler

logger = logging.getLogger(__name__)

__all__ = ["evaluate_curve"]


def evaluate_curve(spec: CurveSpec | dict[str, Any], out_path: str | Path) -> None:
    """Sample every milestone model of `spec.run` (or the base model) and write its curve as JSON to `out_path`."""
    spec = CurveSpec.from_dict(spec)
    start = time.perf_counter()
    task = get_task(spec.task["name"], **spec.task["options"])
    if task.verifier is not None:
        raise ValueError(
            f"Learning curves grade answers against a gold answer, which task {task.name!r} has not; run the budget "
            "experiment on a math task."
        )
    eval_set = task.to_prompt_dataset(load_split(spec.splits, "eval"))
    validation = VALIDATION in split_names(spec.splits)
    validation_set = task.to_prompt_dataset(load_split(spec.splits, VALIDATION)) if validation else None
    points = [_base_point()] if spec.record is None else _milestones(Path(spec.record))
    for point in points:
        model = spec.model if spec.record is None else str(Path(spec.record).parent / point.pop("model"))
        logger.info("Learning curve of %s: sampling the model at %d rollouts.", spec.run, point["rollouts"])
        point["per_prompt"] = _per_prompt_accuracy(spec, task, model, eval_set, "curve")
        # Choices (the best fixed G, a learning rate) are made at the budget on prompts the results never report.
        if validation and point is points[-1]:
            point["validation_per_prompt"] = _per_prompt_accuracy(spec, task, model, validation_set, VALIDATION)
    record = {"run": spec.run, "samples": spec.evaluation["samples"], "points": points}
    record["curve_wall_s"] = time.perf_counter() - start
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(record, indent=1) + "\n")


def _base_point() -> dict[str, Any]:
    return {"milestone": 0, "step": 0, "rollouts": 0, "train_rollouts": 0, "cpu_s": 0.0, "wall_s": 0.0}


def _milestones(path: Path) -> list[dict[str, Any]]:
    budget = json.loads(path.read_text()).get("budget")
    if not budget or not budget.get("milestones"):
        raise ValueError(
            f"{path} records no milestone models: it was trained without a rollout budget; set budget.rollouts and "
            "train it again."
        )
    return [dict(milestone) for milestone in budget["milestones"]]


def _per_prompt_accuracy(spec: CurveSpec, task, model: str, prompts, purpose: str) -> list[float]:
    """Each prompt's share of right answers among `samples` drawn from `model`, seeded by `purpose`."""
    sample = sampler(model, spec.evaluation, spec.seed)
    completions = sample(prompts["prompt"], purpose, num_samples=spec.evaluation["samples"])
    return [
        sum(correct_flags([task.extract(text) for text in texts], gold)) / len(texts)
        for texts, gold in zip(completions, prompts["answer"])
    ]
