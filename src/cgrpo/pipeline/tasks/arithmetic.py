"""A seeded generator of short GSM8K-format arithmetic word problems (the embedded default task).

Each problem chains 1 to 3 operations on small, medium or large numbers, e.g.
``"Ann has 3 bags of 4 pens, gets 5 more. How many pens?"`` with the worked answer
``"3*4=12 12+5=17 #### 17"``. Mixing sizes and chain lengths makes difficulty vary from prompt to
prompt: a tiny model solves one-digit sums almost always and chains of two-digit sums rarely or never.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from functools import partial

from datasets import Dataset

from .answers import format_answer
from .base import Task, generated_pool

NAMES = ("Ann", "Bob", "Eve", "Max", "Sam", "Tom", "Lia", "Ben", "Kim", "Joe", "Amy", "Dan")
ITEMS = ("pens", "cups", "eggs", "cards", "books", "coins", "shells", "stamps", "beads", "rocks", "keys", "toys")
# Operand ranges per size: (starting amount, later operands). "medium" keeps a two-digit running total but
# one-digit steps; "large" adds two-digit numbers, which a tiny model rarely gets right.
SIZES = {"small": ((2, 9), (2, 9)), "medium": ((10, 99), (2, 9)), "large": ((10, 99), (10, 99))}
# Weights of small, medium and large numbers, in the task's pool and in the base model's SFT data (cgrpo.pipeline.jobs.base_model).
SIZE_WEIGHTS = (0.6, 0.3, 0.1)
# Weights of 1, 2 and 3 operations in the base model's SFT data.
OPS_WEIGHTS = (0.45, 0.35, 0.2)
# Weights of 1, 2 and 3 operations in the task's pool: more chains than the SFT data, so that many prompts are ones
# the bootstrapped model usually, not always, gets right. Their first two answers often disagree while a majority
# agrees by k = 4, 8 or 16, which is where the conformal thresholds of the intermediate budgets decide (docs/history.md,
# "The thresholds and the choices behind them"); the SFT mix left prompts mostly either always or never right.
POOL_OPS_WEIGHTS = (0.2, 0.4, 0.4)
# Probability that the first operation is a product ("3 bags of 4 pens").
MUL_PROBABILITY = 0.4
# The strata of `difficulty`, as (operation weights, size weights); "medium" is the task's own mix (None). A tiny
# model solves one-digit single sums almost always and chains of three two-digit sums almost never: prompts whose
# groups agree whatever the budget, which a stopping rule can stop early.
STRATA = {"easy": ((1, 0, 0), (1, 0, 0)), "medium": None, "hard": ((0, 0, 1), (0, 0, 1))}


def _first_clause(rng: random.Random, size: str, name: str, item: str) -> tuple[int, str, list[str]]:
    """The starting amount: a plain count, or a product of one-digit bags and their contents."""
    (start_low, start_high), (low, high) = SIZES[size]
    if rng.random() < MUL_PROBABILITY:
        bags, contents = rng.randint(2, 9), rng.randint(low, high)
        return bags * contents, f"{name} has {bags} bags of {contents} {item}", [f"{bags}*{contents}={bags * contents}"]
    value = rng.randint(start_low, start_high)
    return value, f"{name} has {value} {item}", []


def _problem(rng: random.Random, ops_weights, size_weights, answer_format: str) -> tuple[str, str, int, str, str]:
    """One problem as (question, worked answer, number of operations, size, item)."""
    num_ops = rng.choices(range(1, len(ops_weights) + 1), ops_weights)[0]
    size = rng.choices(list(SIZES), size_weights)[0]
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    value, clause, steps = _first_clause(rng, size, name, item)
    clauses = [clause]
    low, high = SIZES[size][1]
    while len(steps) < num_ops:
        operand = rng.randint(low, high)
        # Subtract only when the result stays positive, so every count makes sense.
        if operand < value and rng.random() < 0.5:
            steps.append(f"{value}-{operand}={value - operand}")
            clauses.append(f"loses {operand}")
            value -= operand
        else:
            steps.append(f"{value}+{operand}={value + operand}")
            clauses.append(f"gets {operand} more")
            value += operand
    question = ", ".join(clauses) + f". How many {item}?"
    answer = " ".join([*steps, format_answer(str(value), answer_format)])
    return question, answer, num_ops, size, item


def generate_problems(
    num_examples: int,
    seed: int,
    *,
    answer_format: str = "hash",
    ops_weights: Sequence[float] = OPS_WEIGHTS,
    size_weights: Sequence[float] = SIZE_WEIGHTS,
    difficulty: Mapping[str, float] | None = None,
) -> Dataset:
    """``num_examples`` problems with columns ``question``, ``answer``, ``num_ops``, ``size``, ``item`` and, with
    ``difficulty``, ``stratum``.

    ``ops_weights[i]`` weighs chains of ``i + 1`` operations; ``size_weights`` weighs the ``SIZES``
    small, medium and large. ``difficulty`` mixes the ``STRATA`` by weight (``{"easy": 0.4, "medium": 0.2, "hard":
    0.4}``): each problem draws its stratum, then its chain length and sizes from the stratum's weights, the
    ``"medium"`` stratum from ``ops_weights`` and ``size_weights``. The same arguments always give the same problems.
    Small operand ranges repeat, so the result can hold duplicates; :mod:`cgrpo.pipeline.tasks.splits` deduplicates
    before carving splits.
    """
    if num_examples < 1:
        raise ValueError(f"num_examples must be positive, got {num_examples}; ask for at least one problem.")
    if len(size_weights) != len(SIZES) or min(size_weights) < 0 or min(ops_weights, default=-1) < 0:
        raise ValueError(
            f"Weights ops={tuple(ops_weights)} size={tuple(size_weights)} are invalid; give non-negative "
            f"weights, at least one for ops and one per size ({', '.join(SIZES)})."
        )
    rng = random.Random(seed)
    columns = ["question", "answer", "num_ops", "size", "item"]
    if difficulty is None:
        rows = [_problem(rng, ops_weights, size_weights, answer_format) for _ in range(num_examples)]
    else:
        strata = _check_difficulty(difficulty)
        chosen = rng.choices(list(strata), list(strata.values()), k=num_examples)
        rows = [
            (*_problem(rng, *(STRATA[name] or (ops_weights, size_weights)), answer_format), name) for name in chosen
        ]
        columns.append("stratum")
    return Dataset.from_dict({name: list(values) for name, values in zip(columns, zip(*rows), strict=True)})


def _check_difficulty(difficulty: Mapping[str, float]) -> dict[str, float]:
    """The difficulty mix as stratum weights, or one sentence on what is wrong with it."""
    unknown = sorted(set(difficulty) - set(STRATA))
    if unknown or not difficulty:
        raise ValueError(
            f"difficulty {dict(difficulty)!r} names no stratum or unknown ones {unknown}; weigh some of "
            f"{', '.join(STRATA)} (e.g. {{easy: 0.4, medium: 0.2, hard: 0.4}})."
        )
    weights = {name: float(weight) for name, weight in difficulty.items()}
    if min(weights.values()) < 0 or not sum(weights.values()) > 0:
        raise ValueError(f"difficulty weights must be non-negative and not all zero, got {weights}.")
    return weights


def arithmetic_task(
    *,
    num_examples: int = 2000,
    seed: int = 0,
    answer_format: str = "hash",
    chat: bool = False,
    ops_weights: Sequence[float] = POOL_OPS_WEIGHTS,
    size_weights: Sequence[float] = SIZE_WEIGHTS,
    system_prompt: str | None = None,
    worked_examples: int = 0,
    difficulty: Mapping[str, float] | None = None,
) -> Task:
    """The GSM8K task with a loader that generates ``num_examples`` problems from ``seed`` (mixing ``difficulty``'s
    strata, see :func:`generate_problems`); ``system_prompt`` and ``worked_examples`` as in :class:`Task`."""
    if difficulty is not None:
        _check_difficulty(difficulty)
    loader = partial(
        generated_pool,
        generate=generate_problems,
        what="arithmetic task",
        num_examples=num_examples,
        seed=seed,
        answer_format=answer_format,
        ops_weights=tuple(ops_weights),
        size_weights=tuple(size_weights),
        difficulty=None if difficulty is None else dict(difficulty),
    )
    return Task(
        name="arithmetic",
        loader=loader,
        answer_format=answer_format,
        chat=chat,
        system_prompt=system_prompt,
        worked_examples=worked_examples,
    )
