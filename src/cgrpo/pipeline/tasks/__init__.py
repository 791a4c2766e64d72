"""Tasks by name: ``get_task("gsm8k", source=..., answer_format="boxed", chat=True)``, ``get_task("code")``.

A task of your own is a factory returning a :class:`Task`, registered with :func:`register_task` in a module the
pipeline's config lists under ``plugins`` (docs/recipe-task.md).
"""

from __future__ import annotations

import difflib
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


def register_task(name: str, factory: Callable[..., Task]) -> Callable[..., Task]:
    """Make ``get_task(name, **options)`` build ``factory(**options)``; return ``factory``.

    Raises ValueError for a name taken by another factory: a plug-in module imported twice registers the same one.
    """
    if not (isinstance(name, str) and name.isidentifier()):
        raise ValueError(f"A task name is a Python identifier such as 'my_task', got {name!r}.")
    if TASKS.get(name, factory) is not factory:
        raise ValueError(f"A task named {name!r} is registered already; register yours under another name.")
    TASKS[name] = factory
    return factory


def get_task(name: str, **options) -> Task:
    """The task registered as ``name``, built with ``options`` (see each task's factory)."""
    if name not in TASKS:
        close = difflib.get_close_matches(name, available_tasks(), n=1)
        hint = f"did you mean {close[0]!r}, or " if close else ""
        raise ValueError(
            f"Unknown task {name!r}; {hint}choose one of {', '.join(available_tasks())}, or register your own with "
            "cgrpo.pipeline.tasks.register_task in a module listed under plugins (docs/recipe-task.md)."
        )
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
    "register_task",
]
