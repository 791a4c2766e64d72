"""The code task's verifier: take the program out of a completion (:func:`extract_program`), run it against the
problem's tests in :mod:`cgrpo.pipeline.sandbox.runner` (:class:`CodeVerifier`), and the rewards built on it."""

from __future__ import annotations

import ast
import builtins
import hashlib
import json
import logging
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

from ..sandbox.runner import (
    ISOLATION_MODES,
    Limits,
    RunResult,
    check_syntax,
    defines_function,
    prepare_tests,
    run_tests_many,
)
from .rewards import completion_text

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------- programs and tests
_TAG = re.compile(r"[ \t]*([\w+.-]*)")
_CLOSING = re.compile(r"^[ \t]*```", re.MULTILINE)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(tag, body)`` of each fenced block: an opening ````` ```tag ````` ends its line, the body runs to a line that
    starts with ````` ``` ````` or to the end. One pass, each character read a bounded number of times (a regular
    expression with a lazy body was quadratic in the number of fences)."""
    blocks, position = [], 0
    while (start := text.find("```", position)) >= 0:
        newline = text.find("\n", start)
        if newline < 0:
            break
        tag = _TAG.match(text, start + 3, newline).group(1)
        closing = _CLOSING.search(text, newline + 1)
        blocks.append((tag, text[newline + 1 : closing.start() if closing else len(text)]))
        if closing is None:
            break
        position = closing.end()
    return blocks


def extract_program(completion: str | list[dict]) -> str | None:
    """The program of a completion, or None when there is none.

    Code before the first ````` fence counts when it compiles and defines a function (completions of a prompt that
    opened a ```` ```python ```` block: the model writes the code and closes the fence); otherwise the first fenced
    block tagged ``python`` (or untagged) that defines a function, else the code before the first fence when it
    compiles (``f = lambda x: ...`` and then prose after the closing fence), else the first such block; without any
    fence, the whole completion.
    """
    text = completion_text(completion).replace("\r\n", "\n")
    head = text.split("```", 1)[0]
    if "```" not in text:
        return text.strip() or None
    if head.strip() and defines_function(head):
        return head.strip()
    blocks = [(tag.lower(), body) for tag, body in _fenced_blocks(text[len(head) :])]
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS and body.strip()]
    for body in python:
        if defines_function(body):
            return body.strip()
    if head.strip() and check_syntax(head) is None:
        return head.strip()  # the fence it ends is the prompt's; what follows it is prose, not a block
    if python:
        return python[0].strip()
    return head.strip() or None


def entry_point(tests: Sequence[str]) -> str | None:
    """The function the tests call: the first called name that is not a builtin (``similar_elements`` in
    ``assert set(similar_elements(a, b)) == set((4, 5))``)."""
    for test in tests:
        try:
            tree = ast.parse(test)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not hasattr(builtins, node.func.id):
                return node.func.id
    return None


def _tests_key(tests: Sequence[str], setup: str) -> str:
    return json.dumps([list(tests), setup])


class CodeVerifier:
    """``verifier(completions=[...], tests=[...], setup="", **other_columns) -> list[bool]``: extracts each completion's
    program and runs it against ``tests`` in the sandbox, ``workers`` at a time. Never raises for what a program does
    (invalid tests raise ValueError); ``counts`` tallies run statuses (``passed``, ``failed``, ``timeout``, ...).

    Results are cached by program, tests and setup (``cache_size`` entries), so the correctness reward and the
    C-GRPO outcomes of the same completions run each program once and always agree.
    """

    def __init__(
        self, limits: Limits | None = None, workers: int = 2, isolation: str = "auto", cache_size: int = 4096
    ) -> None:
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"Unknown isolation {isolation!r}; use one of {', '.join(ISOLATION_MODES)}.")
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}.")
        self.limits = limits or Limits()
        self.workers = int(workers)
        self.isolation = isolation
        self.cache_size = int(cache_size)
        self.counts: Counter = Counter()
        self._cache: OrderedDict[str, RunResult] = OrderedDict()
        self._invalid: set[str] = set()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"], state["_lock"] = OrderedDict(), None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __call__(self, completions: Sequence, tests: Sequence[str], setup: str | None = "", **_columns) -> list[bool]:
        return [result.passed for result in self.run(completions, tests, setup or "")]

    def run(self, completions: Sequence, tests: Sequence[str], setup: str = "") -> list[RunResult]:
        """One :class:`RunResult` per completion, in order."""
        return self.run_jobs([(completion, tests, setup) for completion in completions])

    def run_jobs(self, jobs: Sequence[tuple[Any, Sequence[str], str]]) -> list[RunResult]:
        """Results of ``(completion, tests, setup)`` jobs, in order: programs that share their tests run together."""
        results: list[RunResult | None] = [None] * len(jobs)
        pending: dict[str, dict[str, Any]] = {}
        for index, (completion, tests, setup) in enumerate(jobs):
            tests, setup = [str(test) for test in tests], str(setup or "")
            program = extract_program(completion)
            key = self._key(program, tests, setup)
            cached = self._lookup(key)
            if cached is not None:
                results[index] = cached
                continue
            group = pending.setdefault(_tests_key(tests, setup), {"tests": tests, "setup": setup, "jobs": []})
            group["jobs"].append((index, program, key))
        for group in pending.values():
            try:
                prepared = prepare_tests(group["tests"])
            except ValueError as error:  # the dataset's fault: every program fails, training goes on
                self._warn_invalid(group["tests"], error)
                for index, _, _ in group["jobs"]:
                    results[index] = RunResult(
                        passed=False,
                        status="invalid_tests",
                        tests_passed=[False] * len(group["tests"]),
                        detail=str(error),
                    )
                continue
            programs = list(dict.fromkeys(program for _, program, _ in group["jobs"]))
            outcomes = dict(
                zip(
                    programs,
                    run_tests_many(programs, prepared, group["setup"], self.limits, self.isolation, self.workers),
                )
            )
            for index, program, key in group["jobs"]:
                results[index] = outcomes[program]
                self._store(key, outcomes[program])
        for result in results:
            self.counts[result.status] += 1
        logger.debug("Code verifier statuses so far: %s", dict(self.counts))
        return results

    def _warn_invalid(self, tests: Sequence[str], error: ValueError) -> None:
        key = _tests_key(tests, "")
        with self._lock:
            if key in self._invalid:
                return
            self._invalid.add(key)
        logger.warning("Code verifier: invalid tests, every completion of this prompt fails: %s", error)

    def _key(self, program: str | None, tests: Sequence[str], setup: str) -> str:
        return hashlib.sha256(json.dumps([program, list(tests), setup]).encode()).hexdigest()

    def _lookup(self, key: str) -> RunResult | None:
        with self._lock:
            result = self._cache.get(key)
            if result is not None:
                self._cache.move_to_end(key)
            return result

    def _store(self, key: str, result: RunResult) -> None:
        if self.cache_size < 1 or result.status == "sandbox_error":
            return
        with self._lock:
            self._cache[key] = result
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)


# -------------------------------------------------------------------------------------------------------- rewards
def _per_completion(column: Any, count: int, default: Any) -> list:
    return [default] * count if column is None else list(column)


def code_correctness_reward(
    completions, tests, setup=None, verifier: CodeVerifier | None = None, **kwargs
) -> list[float]:
    """1.0 where the completion's program passes all its prompt's ``tests``, else 0.0 (TRL columns: one test list per
    completion)."""
    verifier = verifier or CodeVerifier()
    setups = _per_completion(setup, len(completions), "")
    jobs = list(zip(completions, tests, setups, strict=True))
    return [float(result.passed) for result in verifier.run_jobs(jobs)]


def code_format_reward(completions, tests=None, **kwargs) -> list[float]:
    """1.0 where the completion holds a program that compiles and defines the function its tests call, else 0.0."""
    test_lists = _per_completion(tests, len(completions), [])
    rewards = []
    for completion, test_list in zip(completions, test_lists, strict=True):
        program = extract_program(completion)
        if program is None or check_syntax(program) is not None:
            rewards.append(0.0)
            continue
        name = entry_point(test_list)
        try:
            defined = {
                node.name
                for node in ast.parse(program).body
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            defined = set()
        rewards.append(float(bool(defined) and (name is None or name in defined)))
    return rewards
