"""Tasks by name: ``get_task("gsm8k", source=..., answer_format="boxed", chat=True)``, ``get_task("code")``."""

from __future__ import annotations

from collections.abc import Callable

from .answers import ANSWER_FORMATS, extract_answer, is_well_formed, normalize_number, parse_gold
from .arithmetic import arithmetic_task, generate_problems
from .base import Task
from .code import code_task, extract_program, generate_functions
from .gsm8k import gsm8k_task

TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": arithmetic_task,
    "code": code_task,
    "gsm8k": gsm8k_task,
}


def available_tasks() -> list[str]:
    """Names accepted by :func:`get_task`."""
    return sorted(TASKS)


def get_task(name: str, **options) -> Task:
    """The task registered as ``name``, built with ``options`` (see each task's factory)."""
    if name not in TASKS:
        raise ValueError(f"Unknown task {name!r}; choose one of {', '.join(available_tasks())}.")
    return TASKS[name](**options)


EXECUTION_SCORES = ("first_success", "pass_rate")


def check_task_score(task: Task, score: str) -> None:
    """Raise ValueError unless ``task`` can compute the nonconformity ``score``.

    ``aps`` compares extracted answers with a gold answer: math tasks, which have no verifier. ``first_success`` and
    ``pass_rate`` count verifier passes: execution tasks (code), whose answers are programs that no gold string
    judges.
    """
    if score == "aps" and task.verifier is not None:
        raise ValueError(
            f"score 'aps' compares answers with a gold answer, but task {task.name!r} judges programs by running "
            f"them; use {' or '.join(EXECUTION_SCORES)}."
        )
    if score in EXECUTION_SCORES and task.verifier is None:
        raise ValueError(
            f"score {score!r} counts verifier passes, but task {task.name!r} has no verifier; use 'aps' (answer "
            "agreement) for it."
        )
    if score != "aps" and score not in EXECUTION_SCORES:
        raise ValueError(f"Unknown score {score!r}; use aps, {', '.join(EXECUTION_SCORES)}.")


__all__ = [
    "ANSWER_FORMATS",
    "TASKS",
    "Task",
    "available_tasks",
    "check_task_score",
    "extract_answer",
    "extract_program",
    "generate_functions",
    "generate_problems",
    "get_task",
    "is_well_formed",
    "normalize_number",
    "parse_gold",
]
