"""The sandbox's tests, on the caller's side: split test statements so that the verdict is taken in the parent
(:func:`prepare_tests`), and judge what the harness reports (:func:`judge`) with bounded work.

:mod:`cgrpo.pipeline.sandbox.runner` runs them; docs/sandbox.md explains why a program cannot forge a pass of a
tamper-proof test (:attr:`PreparedTest.tamper_proof`), and what the other tests leave open.
"""

from __future__ import annotations

import ast
import math
import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# What the parent decodes of a reported value: its nesting, its number of items, and how many items of one set or
# dict may share a hash (a set of integers that all hash alike costs quadratic time to build and compare; no genuine
# answer has more than a handful of colliding items).
MAX_DEPTH = 100
MAX_ITEMS = 200_000
MAX_SAME_HASH = 16


@dataclass(frozen=True)
class PreparedTest:
    """One test, split for the sandbox.

    ``kind`` is ``"value"`` (the sandbox evaluates ``source`` and reports its value as plain data; the parent applies
    ``op`` to it and ``expected``: ``expected OP value`` when ``literal_first``, else ``value OP expected``; ``op`` is
    a comparison, ``isclose`` with ``options`` as keyword arguments, ``truthy`` or ``falsy``), ``"truth"`` (the sandbox
    evaluates the assert's whole condition ``source``; it passes if truthy) or ``"stmt"`` (the sandbox executes
    ``source``; it passes if nothing raises).
    """

    kind: str
    source: str
    op: str = ""
    expected: Any = None
    literal_first: bool = False
    options: tuple = ()

    @property
    def tamper_proof(self) -> bool:
        """True when the sandbox computes nothing but a call of the program's function on literal arguments and the
        parent judges the value: whatever the program patches, the value it reports is its own answer to that call.
        A value expression that computes more (``abs(f(1) - 3.14)``, ``check(f(2))``, ``set(f(x))``) also uses
        objects the program can replace, so it is not."""
        return self.kind == "value" and _is_call_on_literals(self.source)


# ----------------------------------------------------------------------------------------------- tests, in the parent
class _NotLiteral(Exception):
    pass


# Calls allowed in an expected value, evaluated in the parent on literal arguments: set((4, 5)), float("inf"), ...
_LITERAL_CALLS = {
    "set": set,
    "frozenset": frozenset,
    "tuple": tuple,
    "list": list,
    "dict": dict,
    "float": float,
    "int": int,
    "complex": complex,
    "str": str,
    "bool": bool,
    "bytes": bytes,
}


def _literal(node: ast.AST, depth: int = 0) -> Any:
    """The value of a literal expression node, evaluated without running any code; raises _NotLiteral otherwise."""
    if depth > 100:
        raise _NotLiteral
    if isinstance(node, ast.Constant) and not isinstance(node.value, type(Ellipsis)):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_literal(item, depth + 1) for item in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise _NotLiteral
        return {_literal(key, depth + 1): _literal(value, depth + 1) for key, value in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _literal(node.operand, depth + 1)
        if type(operand) not in (int, float, complex):
            raise _NotLiteral
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        # Only complex literals: 1 + 2j, -1.5 - 0.5j.
        left, right = _literal(node.left, depth + 1), _literal(node.right, depth + 1)
        if type(left) not in (int, float) or type(right) is not complex:
            raise _NotLiteral
        return left + right if isinstance(node.op, ast.Add) else left - right
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _LITERAL_CALLS
        and not node.keywords
        and len(node.args) <= 1
        and not any(isinstance(a, ast.Starred) for a in node.args)
    ):
        args = [_literal(arg, depth + 1) for arg in node.args]
        try:
            return _LITERAL_CALLS[node.func.id](*args)
        except (TypeError, ValueError, OverflowError) as error:
            raise _NotLiteral from error
    raise _NotLiteral


def _is_call_on_literals(source: str) -> bool:
    node = ast.parse(source, mode="eval").body
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return False
    arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
    return all(keyword.arg is not None for keyword in node.keywords) and all(
        _trusted_literal(argument)[0] for argument in arguments
    )


def _trusted_literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, _literal(node)
    except (_NotLiteral, RecursionError, MemoryError, TypeError):  # TypeError: unhashable set items or dict keys
        return False, None


def _segment(text: str, node: ast.AST) -> str:
    return ast.get_source_segment(text, node) or ast.unparse(node)


_COMPARISONS = {
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
}
_OPERATORS = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "in": lambda a, b: a in b,
    "not in": lambda a, b: a not in b,
    "is": operator.is_,
    "is not": operator.is_not,
}


def _expression(text: str, node: ast.AST) -> str:
    source = _segment(text, node)
    try:
        ast.parse(source, mode="eval")
    except SyntaxError:  # a segment that needs its surrounding parentheses
        source = ast.unparse(node)
    return source


def _is_isclose(node: ast.AST) -> bool:
    function = node.func if isinstance(node, ast.Call) else None
    return (
        isinstance(function, ast.Attribute)
        and function.attr == "isclose"
        and isinstance(function.value, ast.Name)
        and function.value.id == "math"
    ) or (isinstance(function, ast.Name) and function.id == "isclose")


def _value_test(text: str, condition: ast.AST) -> PreparedTest | None:
    """The condition as a value the parent judges, or None when it is not of a form the parent can judge."""
    if isinstance(condition, ast.Compare) and len(condition.ops) == 1 and type(condition.ops[0]) in _COMPARISONS:
        op = _COMPARISONS[type(condition.ops[0])]
        left, right = condition.left, condition.comparators[0]
        for literal, other, literal_first in ((right, left, False), (left, right, True)):
            ok, value = _trusted_literal(literal)
            # Identity means something only for the singletons; a decoded int is never the literal's object.
            if ok and (op not in ("is", "is not") or value is None or type(value) is bool):
                return PreparedTest(
                    kind="value", source=_expression(text, other), op=op, expected=value, literal_first=literal_first
                )
        return None
    if _is_isclose(condition) and len(condition.args) == 2:
        options = []
        for keyword in condition.keywords:
            ok, value = _trusted_literal(keyword.value)
            if keyword.arg not in ("rel_tol", "abs_tol") or not ok:
                return None
            options.append((keyword.arg, value))
        for literal, other in ((condition.args[1], condition.args[0]), (condition.args[0], condition.args[1])):
            ok, value = _trusted_literal(literal)
            if ok and type(value) in (int, float):
                return PreparedTest(
                    kind="value", source=_expression(text, other), op="isclose", expected=value, options=tuple(options)
                )
        return None
    if isinstance(condition, ast.UnaryOp) and isinstance(condition.op, ast.Not):
        return PreparedTest(kind="value", source=_expression(text, condition.operand), op="falsy")
    if isinstance(condition, (ast.Call, ast.Name, ast.Subscript, ast.Attribute)):
        return PreparedTest(kind="value", source=_expression(text, condition), op="truthy")
    return None


def _prepare_one(text: str) -> PreparedTest:
    try:
        module = ast.parse(text, mode="exec")
    except SyntaxError as error:
        raise ValueError(f"Test {text!r} is not valid Python ({error.msg}); fix the dataset's tests.") from error
    if not module.body:
        raise ValueError(f"Test {text!r} is empty; give each test as an assert statement.")
    statement = module.body[0]
    if len(module.body) == 1 and isinstance(statement, ast.Assert):
        prepared = _value_test(text, statement.test)
        return prepared or PreparedTest(kind="truth", source=_expression(text, statement.test))
    return PreparedTest(kind="stmt", source=text)


def prepare_tests(tests: Sequence[str]) -> list[PreparedTest]:
    """Split test statements (``"assert f(1) == 2"``) for :func:`run_tests`; raises ValueError for invalid tests."""
    if isinstance(tests, str):
        # ValueError, not TypeError: callers catch a dataset's bad tests as ValueError.
        raise ValueError("tests must be a list of test statements, not one string; wrap it in a list.")  # noqa: TRY004
    return [test if isinstance(test, PreparedTest) else _prepare_one(str(test)) for test in tests]


def forgeable_tests(tests: Sequence[str]) -> list[str]:
    """The tests of ``tests`` that are not tamper-proof (a program could pass them by patching what they call or by
    forging the result record); raises ValueError for invalid tests."""
    return [str(test) for test, prepared in zip(tests, prepare_tests(tests)) if not prepared.tamper_proof]


# ------------------------------------------------------------------------------------- reported values, in the parent
class _Budget:
    """Counts the items decoded from one reported value, so that decoding stays linear in a bounded size."""

    def __init__(self) -> None:
        self.items = 0

    def take(self, count: int) -> None:
        self.items += count
        if self.items > MAX_ITEMS:
            raise ValueError("reported value too large")


def _check_hashes(keys: list) -> None:
    counts = Counter(hash(key) for key in keys)  # hash values are ints, which do not collide with each other
    if counts and max(counts.values()) > MAX_SAME_HASH:
        raise ValueError("reported set or dict has too many items of one hash")


def _decode(item: Any, budget: _Budget, depth: int = 0) -> Any:
    if depth > MAX_DEPTH or type(item) is not list or not item:
        raise ValueError("malformed or too deeply nested value")
    tag = item[0]
    if tag == "N":
        return None
    if tag == "b":
        return bool(item[1])
    if tag == "i":
        return int(item[1], 16)
    if tag == "f":
        return float.fromhex(item[1])
    if tag == "c":
        return complex(float.fromhex(item[1]), float.fromhex(item[2]))
    if tag == "s":
        if type(item[1]) is not str:
            raise ValueError("bad string")
        return item[1]
    if tag == "y":
        return bytes.fromhex(item[1])
    if tag in ("l", "t", "S", "F"):
        budget.take(len(item[1]))
        items = [_decode(value, budget, depth + 1) for value in item[1]]
        if tag in ("S", "F"):
            _check_hashes(items)
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d":
        budget.take(2 * len(item[1]))
        pairs = [(_decode(key, budget, depth + 1), _decode(value, budget, depth + 1)) for key, value in item[1]]
        _check_hashes([key for key, _ in pairs])
        return dict(pairs)
    raise ValueError(f"unknown tag {tag!r}")


def decode(item: Any) -> Any:
    """A value the harness reported, as plain Python data; ValueError when it is malformed or past the bounds."""
    return _decode(item, _Budget())


def judge(test: PreparedTest, result: Any) -> bool:
    """Whether the harness's ``result`` for ``test`` (``["ok", value]`` or ``["error", message]``) passes it."""
    try:
        if result[0] != "ok":
            return False
        value = decode(result[1])
        if test.kind != "value" or test.op == "truthy":
            return bool(value)
        if test.op == "falsy":
            return not value
        if test.op == "isclose":
            return type(value) in (int, float) and math.isclose(value, test.expected, **dict(test.options))
        left, right = (test.expected, value) if test.literal_first else (value, test.expected)
        return bool(_OPERATORS[test.op](left, right))
    except Exception:  # noqa: BLE001 - a malformed record, or values that do not compare, is a fail
        return False


__all__ = [
    "MAX_DEPTH",
    "MAX_ITEMS",
    "MAX_SAME_HASH",
    "PreparedTest",
    "decode",
    "forgeable_tests",
    "judge",
    "prepare_tests",
]
