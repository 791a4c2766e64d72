"""Tasks by name: ``get_task("gsm8k", source=..., answer_format="boxed", chat=True)``."""

from __future__ import annotations

from collections.abc import Callable

from .answers import ANSWER_FORMATS, extract_answer, is_well_formed, normalize_number, parse_gold
from .arithmetic import arithmetic_task, generate_problems
from .base import Task
from .gsm8k import gsm8k_task

TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": arithmetic_task,
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


__all__ = [
    "ANSWER_FORMATS",
    "TASKS",
    "Task",
    "available_tasks",
    "extract_answer",
    "generate_problems",
    "get_task",
    "is_well_formed",
    "normalize_number",
    "parse_gold",
]
