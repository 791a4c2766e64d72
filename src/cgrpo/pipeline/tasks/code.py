"""Python code tasks: the answer is a program, and a completion passes when the task's tests pass against it.

Two sources, one task (``get_task("code", source=...)``):

* ``source="generated"`` (the default): short function-writing problems generated offline from ``seed``, e.g.
  ``"Write a function scale(x) that takes an integer x, multiplies it by 3, then adds 1, and returns the result."``
  with the reference program ``def scale(x):\\n    x = x * 3\\n    x = x + 1\\n    return x`` and three tests
  ``assert scale(4) == 13``. One line per operation, like the arithmetic task's one step per operation, so that a tiny
  model can be fine-tuned on them; 1 to 3 operations on integers, lists or strings make difficulty vary.
* MBPP format (``text``, ``code``, ``test_list``, optional ``test_setup_code``; the sanitized variant's ``prompt`` and
  ``test_imports`` work too): a local ``.json``/``.jsonl``/``.parquet`` file (``{split}`` in the path is replaced by
  the split name) or a Hub id, ``google-research-datasets/mbpp`` (config ``full``) by default with ``source="mbpp"``.

Rows become ``question``, ``answer`` (the reference program), ``tests`` (assert statements) and ``setup``. Prompts
show the first ``prompt_tests`` tests (MBPP's custom is all three; one shows the function's name and signature
without handing over every expected value). The program is taken from the completion by :func:`extract_program`,
and :class:`CodeVerifier` runs it against all the tests in :mod:`cgrpo.pipeline.sandbox`::

    task = get_task("code")
    task.verifier(completions=["def f(x):\\n    return x + 1"], tests=["assert f(1) == 2"])  # [True]
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import json
import logging
import random
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from datasets import Dataset, load_dataset

from ..sandbox import ISOLATION_MODES, Limits, RunResult, check_syntax, prepare_tests, run_tests_many
from .base import Prompt, Task, generated_pool
from .files import DataSource, load_split_file
from .rewards import completion_text

logger = logging.getLogger(__name__)

GENERATED = "generated"
MBPP_HUB_ID = "google-research-datasets/mbpp"
_LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# The columns to_code_rows reads, each with the names MBPP's variants give it.
_MBPP_COLUMNS = (("question", "text", "prompt"), ("answer", "code"), ("tests", "test_list"))
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
    name, clause = rng.choice((("sum", "sums it"), ("max", "takes the largest element"),
                               ("min", "takes the smallest element"), ("len", "counts its elements")))
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
    return {"question": question, "answer": program, "tests": tests, "setup": "", "family": family,
            "num_ops": num_ops}


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
    :mod:`cgrpo.pipeline.splits` drops. Every test compares a call with a literal, so no program can pass by tampering
    with the harness (:mod:`cgrpo.pipeline.sandbox`).
    """
    if num_examples < 1:
        raise ValueError(f"num_examples must be positive, got {num_examples}; ask for at least one problem.")
    if (not ops_weights or len(ops_weights) > 3 or min(ops_weights) < 0 or len(family_weights) != len(FAMILIES)
            or min(family_weights) < 0):
        raise ValueError(
            f"Weights ops={tuple(ops_weights)} families={tuple(family_weights)} are invalid; give 1 to 3 non-negative "
            f"weights for 1, 2, 3 operations and one per family ({', '.join(FAMILIES)})."
        )
    rng = random.Random(seed)
    rows = [_function_problem(rng, ops_weights, family_weights) for _ in range(num_examples)]
    return Dataset.from_list(rows)


# ---------------------------------------------------------------------------------------------------- MBPP format
def _first(row: dict, *names: str, default: Any = None) -> Any:
    for name in names:
        if name in row and row[name] is not None:
            return row[name]
    return default


def to_code_rows(dataset: Dataset) -> Dataset:
    """MBPP rows (``text``/``prompt``, ``code``, ``test_list``, ``test_setup_code``/``test_imports``) as code-task rows
    (``question``, ``answer``, ``tests``, ``setup``); rows already in that form pass through. Raises ValueError for a
    row without a question, a program or tests, or with a test that is not valid Python."""
    rows = []
    for index, row in enumerate(dataset):
        question = _first(row, "question", "text", "prompt")
        program = _first(row, "answer", "code")
        tests = _first(row, "tests", "test_list")
        setup = _first(row, "setup", "test_setup_code", default="")
        if not setup and row.get("test_imports"):
            setup = "\n".join(row["test_imports"])
        if not isinstance(question, str) or not isinstance(program, str) or not tests or isinstance(tests, str):
            raise ValueError(
                f"Code row {index} lacks a question ('text' or 'prompt'), a program ('code') or a list of tests "
                f"('test_list'); columns present: {sorted(row)}."
            )
        tests = [str(test) for test in tests]
        try:
            prepare_tests(tests)
        except ValueError as error:
            raise ValueError(f"Code row {index}: {error}") from error
        rows.append({"question": question, "answer": program, "tests": tests, "setup": str(setup or "")})
    return Dataset.from_list(rows)


def load_code_file(source: str, split: str = "train") -> Dataset:
    """An MBPP-format ``.json``/``.jsonl``/``.parquet`` file as code-task rows."""
    return to_code_rows(load_split_file(source, split, _LOCAL_BUILDERS, "code task"))


def load_code_hub(source: str = MBPP_HUB_ID, split: str = "train", config: str | None = None) -> Dataset:
    """An MBPP-format dataset from the Hub id ``source`` (MBPP's config defaults to ``full``); offline this reads the
    local Hugging Face cache."""
    if config is None and source == MBPP_HUB_ID:
        config = "full"
    return to_code_rows(load_dataset(source, config, split=split))


# ---------------------------------------------------------------------------------------------- programs and tests
_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)(?:^[ \t]*```|\Z)", re.DOTALL | re.MULTILINE)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}


def _defines_function(code: str) -> bool:
    try:
        return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for node in ast.parse(code).body)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False


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
    if head.strip() and _defines_function(head):
        return head.strip()
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(text[len(head):])]
    python = [body for tag, body in blocks if tag in _PYTHON_TAGS and body.strip()]
    for body in python:
        if _defines_function(body):
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

    def __init__(self, limits: Limits | None = None, workers: int = 2, isolation: str = "auto",
                 cache_size: int = 4096) -> None:
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
                    results[index] = RunResult(passed=False, status="invalid_tests",
                                               tests_passed=[False] * len(group["tests"]), detail=str(error))
                continue
            programs = list(dict.fromkeys(program for _, program, _ in group["jobs"]))
            outcomes = dict(zip(programs, run_tests_many(programs, prepared, group["setup"], self.limits,
                                                          self.isolation, self.workers)))
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


def code_correctness_reward(completions, tests, setup=None, verifier: CodeVerifier | None = None,
                            **kwargs) -> list[float]:
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
            defined = {node.name for node in ast.parse(program).body
                       if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            defined = set()
        rewards.append(float(bool(defined) and (name is None or name in defined)))
    return rewards


# ----------------------------------------------------------------------------------------------------------- task
@dataclass(frozen=True)
class CodeTask(Task):
    """A code task: prompts show a problem and its first ``prompt_tests`` tests, answers are programs.

    ``verifier`` is a :class:`CodeVerifier`; ``reward_funcs`` are ``[correctness, format]`` like the math tasks', the
    first backed by the same verifier (and its cache).
    """

    prompt_tests: int = 1

    def load(self, split: str = "train") -> Dataset:
        dataset = super().load(split)
        if "tests" not in dataset.column_names:
            raise ValueError(f"Task {self.name!r} data lacks a 'tests' column; give each example its asserts.")
        return dataset

    def format_prompt(self, question: str, tests: Sequence[str] = ()) -> Prompt:
        """The prompt: the problem and its first ``prompt_tests`` tests; plain text ends by opening a python block."""
        shown = list(tests)[: self.prompt_tests]
        if self.chat:
            lead = "this test" if len(shown) == 1 else "these tests"
            example = f"\nYour code should pass {lead}:\n" + "\n".join(shown) if shown else ""
            return [{"role": "user", "content": f"{question}{example}\nWrite the function in a ```python code block."}]
        example = "Tests:\n" + "".join(f"{test}\n" for test in shown)
        return f"Question: {question}\n{example}Answer:\n```python\n"

    def gold(self, solution: str) -> str:
        """The reference program."""
        return solution.strip()

    def extract(self, completion: str) -> str | None:
        """The program of a completion (:func:`extract_program`)."""
        return extract_program(completion)

    @property
    def reward_funcs(self) -> list[Callable[..., list[float]]]:
        """TRL reward functions ``[correctness, format]``; weight them with ``reward_weights``."""
        return [partial(code_correctness_reward, verifier=self.verifier), code_format_reward]

    def to_prompt_dataset(self, raw: Dataset) -> Dataset:
        """TRL's prompt format: ``prompt``, ``answer`` (the reference program), ``question``, ``tests``, ``setup``."""
        questions, tests = list(raw["question"]), [list(t) for t in raw["tests"]]
        setups = list(raw["setup"]) if "setup" in raw.column_names else [""] * len(questions)
        return Dataset.from_dict(
            {
                "prompt": [self.format_prompt(question, t) for question, t in zip(questions, tests)],
                "answer": [self.gold(solution) for solution in raw["answer"]],
                "question": questions,
                "tests": tests,
                "setup": [setup or "" for setup in setups],
            }
        )


def code_task(
    source: str = GENERATED,
    *,
    chat: bool = False,
    answer_format: str = "hash",
    prompt_tests: int = 1,
    num_examples: int = 2000,
    seed: int = 0,
    ops_weights: Sequence[float] = POOL_OPS_WEIGHTS,
    family_weights: Sequence[float] = FAMILY_WEIGHTS,
    hub_config: str | None = None,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    workers: int = 2,
    isolation: str = "auto",
) -> CodeTask:
    """The code task on ``source``: ``"generated"`` (``num_examples`` problems from ``seed``; ``ops_weights`` and
    ``family_weights`` set the mix), ``"mbpp"`` (the Hub's MBPP, config ``hub_config``, default ``full``), another
    Hub id, or a local MBPP-format file. ``timeout_s``, ``memory_mb``, ``workers`` and ``isolation`` configure the
    verifier's sandbox (:class:`cgrpo.pipeline.sandbox.Limits`). ``answer_format`` is accepted only as ``"hash"``, the
    math tasks' default, which a workflow config merged over the default experiment's carries along; it has no
    effect, since answers are programs."""
    if answer_format != "hash":
        raise ValueError(
            f"answer_format {answer_format!r} applies to math tasks; code answers are programs, so leave it 'hash'."
        )
    if prompt_tests < 0:
        raise ValueError(f"prompt_tests must be at least 0, got {prompt_tests}.")
    data = None
    if source == GENERATED:
        loader = partial(generated_pool, generate=generate_functions, what="generated code task",
                         num_examples=num_examples, seed=seed, ops_weights=tuple(ops_weights),
                         family_weights=tuple(family_weights))
    elif Path(source).suffix in _LOCAL_BUILDERS:
        loader = partial(load_code_file, source)
        data = DataSource(source, True, _MBPP_COLUMNS, "code task")
    else:
        hub_id = MBPP_HUB_ID if source == "mbpp" else source
        loader = partial(load_code_hub, hub_id, config=hub_config)
        data = DataSource(hub_id, False, _MBPP_COLUMNS, "code task")
    verifier = CodeVerifier(Limits(timeout_s=timeout_s, memory_mb=memory_mb), workers=workers, isolation=isolation)
    return CodeTask(name="code", loader=loader, chat=chat, verifier=verifier, prompt_tests=int(prompt_tests),
                    source=data)
