"""The code task's generated problems: short function-writing problems generated offline from a seed, e.g.
``"Write a function scale(x) that takes an integer x, multiplies it by 3, then adds 1, and returns the result."`` with
the reference program ``def scale(x):\\n    x = x * 3\\n    x = x + 1\\n    return x`` and three tests
``assert scale(4) == 13``. One line per operation, like the arithmetic task's one step per operation, so that a tiny
model can be fine-tuned on them; 1 to 3 operations on integers, lists or strings make difficulty vary.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from datasets import Dataset

# Weights of 1, 2 and 3 operations: SFT data for a bootstrapped model, and the task's pool (more chains, so that many
# prompts are ones a bootstrapped model usually, not always, solves; as in the arithmetic task).
OPS_WEIGHTS = (0.45, 0.35, 0.2)
POOL_OPS_WEIGHTS = (0.2, 0.4, 0.4)
FAMILIES = ("int", "list", "str")
FAMILY_WEIGHTS = (0.5, 0.25, 0.25)
FUNCTION_NAMES = ("f", "g", "h", "calc", "step", "apply", "change", "compute", "scale", "shift", "mix", "turn")
NUM_TESTS = 3


# ------------------------------------------------------------------------------------------------ generated problems
@dataclass(frozen=True)
class _Op:
    clause: str  # "multiplies it by 3"
    code: str  # "x = x * 3"
    apply: Callable[[Any], Any]


def _int_op(rng: random.Random, var: str) -> _Op:
    kind = rng.choice(("add", "sub", "mul", "div", "mod", "square"))
    if kind == "square":
        return _Op("squares it", f"{var} = {var} * {var}", lambda v: v * v)
    if kind in ("add", "sub"):
        k = rng.randint(1, 9)
        if kind == "add":
            return _Op(f"adds {k}", f"{var} = {var} + {k}", lambda v: v + k)
        return _Op(f"subtracts {k}", f"{var} = {var} - {k}", lambda v: v - k)
    if kind == "mul":
        k = rng.randint(2, 9)
        return _Op(f"multiplies it by {k}", f"{var} = {var} * {k}", lambda v: v * k)
    if kind == "div":
        k = rng.randint(2, 5)
        return _Op(f"divides it by {k} rounding down", f"{var} = {var} // {k}", lambda v: v // k)
    k = rng.randint(2, 9)
    return _Op(f"takes the remainder modulo {k}", f"{var} = {var} % {k}", lambda v: v % k)


def _list_op(rng: random.Random) -> _Op:
    name, clause = rng.choice(
        (
            ("sum", "sums it"),
            ("max", "takes the largest element"),
            ("min", "takes the smallest element"),
            ("len", "counts its elements"),
        )
    )
    function = {"sum": sum, "max": max, "min": min, "len": len}[name]
    return _Op(clause, f"x = {name}(xs)", function)


def _str_op(rng: random.Random) -> _Op:
    kind = rng.choice(("reverse", "upper", "repeat", "append", "drop"))
    if kind == "reverse":
        return _Op("reverses it", "s = s[::-1]", lambda v: v[::-1])
    if kind == "upper":
        return _Op("makes it upper case", "s = s.upper()", lambda v: v.upper())
    if kind == "repeat":
        k = rng.randint(2, 3)
        return _Op(f"repeats it {k} times", f"s = s * {k}", lambda v: v * k)
    if kind == "append":
        c = rng.choice("xyz")
        return _Op(f"appends '{c}'", f"s = s + '{c}'", lambda v: v + c)
    return _Op("drops its first character", "s = s[1:]", lambda v: v[1:])


def _inputs(rng: random.Random, family: str) -> list[Any]:
    """``NUM_TESTS`` distinct inputs for a family: small integers, short lists of digits, short lowercase words."""
    seen, values = set(), []
    while len(values) < NUM_TESTS:
        if family == "int":
            value = rng.randint(0, 20)
        elif family == "list":
            value = [rng.randint(0, 9) for _ in range(rng.randint(1, 5))]
        else:
            value = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 5)))
        if repr(value) not in seen:
            seen.add(repr(value))
            values.append(value)
    return values


_JOIN = {1: "{0}", 2: "{0}, then {1}", 3: "{0}, then {1}, then {2}"}
_TAKES = {"int": "an integer x", "list": "a list of integers xs", "str": "a string s"}
_PARAM = {"int": "x", "list": "xs", "str": "s"}


def _function_problem(rng: random.Random, ops_weights: Sequence[float], family_weights: Sequence[float]) -> dict:
    family = rng.choices(FAMILIES, family_weights)[0]
    num_ops = rng.choices(range(1, len(ops_weights) + 1), ops_weights)[0]
    name = rng.choice(FUNCTION_NAMES)
    if family == "int":
        ops = [_int_op(rng, "x") for _ in range(num_ops)]
    elif family == "list":
        ops = [_list_op(rng)] + [_int_op(rng, "x") for _ in range(num_ops - 1)]
    else:
        ops = [_str_op(rng) for _ in range(num_ops)]
    param = _PARAM[family]
    result = "x" if family == "list" else param
    clauses = _JOIN[len(ops)].format(*(op.clause for op in ops))
    question = f"Write a function {name}({param}) that takes {_TAKES[family]}, {clauses}, and returns the result."
    body = "".join(f"    {op.code}\n" for op in ops)
    program = f"def {name}({param}):\n{body}    return {result}"
    tests = []
    for value in _inputs(rng, family):
        expected = value
        for op in ops:
            expected = op.apply(expected)
        tests.append(f"assert {name}({value!r}) == {expected!r}")
    return {"question": question, "answer": program, "tests": tests, "setup": "", "family": family, "num_ops": num_ops}


def generate_functions(
    num_examples: int,
    seed: int,
    *,
    ops_weights: Sequence[float] = OPS_WEIGHTS,
    family_weights: Sequence[float] = FAMILY_WEIGHTS,
) -> Dataset:
    """``num_examples`` function-writing problems: ``question``, ``answer`` (the reference program), ``tests``,
    ``setup`` (empty), ``family`` (``int``, ``list`` or ``str``) and ``num_ops``.

    The same arguments always give the same problems; the pool can hold duplicates, which
    :mod:`cgrpo.pipeline.tasks.splits` drops. Every test compares a call with a literal, so no program can pass by tampering
    with the harness (:mod:`cgrpo.pipeline.sandbox.runner`).
    """
    if num_examples < 1:
        raise ValueError(f"num_examples must be positive, got {num_examples}; ask for at least one problem.")
    if (
        not ops_weights
        or len(ops_weights) > 3
        or min(ops_weights) < 0
        or len(family_weights) != len(FAMILIES)
        or min(family_weights) < 0
    ):
        raise ValueError(
            f"Weights ops={tuple(ops_weights)} families={tuple(family_weights)} are invalid; give 1 to 3 non-negative "
            f"weights for 1, 2, 3 operations and one per family ({', '.join(FAMILIES)})."
        )
    rng = random.Random(seed)
    rows = [_function_problem(rng, ops_weights, family_weights) for _ in range(num_examples)]
    return Dataset.from_list(rows)
