"""The code task: generated function-writing problems, the MBPP-format loader, program extraction, the verifier and
the rewards (cgrpo.pipeline.tasks.code; issue #14)."""

from __future__ import annotations

import json
import pickle

import pytest
from datasets import Dataset

from cgrpo.pipeline.sandbox.runner import prepare_tests
from cgrpo.pipeline.tasks import (
    available_tasks,
    extract_program,
    generate_functions,
    get_task,
)
from cgrpo.pipeline.tasks.code import (
    CodeTask,
    CodeVerifier,
    code_correctness_reward,
    code_format_reward,
    entry_point,
    to_code_rows,
)
from cgrpo.pipeline.tasks.splits import load_split, make_splits

MBPP_ROWS = [
    {
        "task_id": 2,
        "text": "Write a function to find the shared elements from the given two lists.",
        "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))",
        "test_list": [
            "assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4), (5, 4, 3, 7))) == set((3, 4))",
        ],
        "test_setup_code": "",
        "challenge_test_list": [],
    },
    {
        "task_id": 3,
        "text": "Write a python function to find the area of a circle of radius r.",
        "code": "def circle_area(r):\n    return math.pi * r * r",
        "test_list": ["assert math.isclose(circle_area(1), 3.14159, rel_tol=0.001)", "assert circle_area(0) == 0"],
        "test_setup_code": "import math",
        "challenge_test_list": [],
    },
]


@pytest.fixture(scope="module")
def task() -> CodeTask:
    return get_task("code", num_examples=300, seed=0)


def test_registry_builds_the_code_task(task):
    assert "code" in available_tasks()
    assert isinstance(task, CodeTask) and task.name == "code" and callable(task.verifier)
    assert len(task.reward_funcs) == 2


def test_generator_is_deterministic_and_spread():
    first, again, other = (generate_functions(200, seed) for seed in (1, 1, 2))
    assert first.to_list() == again.to_list()
    assert first["question"] != other["question"]
    assert set(first["family"]) == {"int", "list", "str"} and set(first["num_ops"]) == {1, 2, 3}
    assert all(len(tests) == 3 for tests in first["tests"])
    # Short programs, one line per operation, for a tiny model to learn.
    assert max(len(program) for program in first["answer"]) < 120
    assert all(program.count("\n") == num_ops + 1 for program, num_ops in zip(first["answer"], first["num_ops"]))
    with pytest.raises(ValueError, match="weights"):
        generate_functions(5, 0, ops_weights=(1, 1, 1, 1))


def test_generated_tests_are_tamper_proof_and_references_pass(task):
    raw = task.load("train").select(range(24))
    assert all(test.tamper_proof for tests in raw["tests"] for test in prepare_tests(tests))
    jobs = [(program, tests, "") for program, tests in zip(raw["answer"], raw["tests"])]
    results = task.verifier.run_jobs(jobs)
    assert all(result.passed for result in results), [r for r in results if not r.passed][:1]
    # Each reference fails the other problems' tests (mostly: two problems can share a function by chance).
    shifted = [(program, tests, "") for program, tests in zip(raw["answer"], raw["tests"][1:] + raw["tests"][:1])]
    assert sum(result.passed for result in task.verifier.run_jobs(shifted)) <= 2


def test_prompts_show_the_first_test_and_open_a_code_block(task):
    data = task.to_prompt_dataset(task.load("train").select(range(3)))
    assert data.column_names == ["prompt", "answer", "question", "tests", "setup"]
    prompt, tests = data[0]["prompt"], data[0]["tests"]
    assert prompt.startswith("Question: ") and prompt.endswith("Answer:\n```python\n")
    assert tests[0] in prompt and tests[1] not in prompt
    chat = get_task("code", num_examples=5, chat=True, prompt_tests=2).to_prompt_dataset(task.load("train").select([0]))
    message = chat[0]["prompt"][0]
    assert message["role"] == "user" and tests[1] in message["content"] and "```python" in message["content"]
    assert tests[0] not in get_task("code", num_examples=5, prompt_tests=0).format_prompt("Q?", tests)


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("def f(x):\n    return x\n```\nThat is all.", "def f(x):\n    return x"),  # prompt opened the block
        ("Here you go:\n```python\ndef f(x):\n    return x\n```\nDone.", "def f(x):\n    return x"),
        ("```py\nprint(f(1))\n```\n```python\ndef f(x):\n    return x\n```", "def f(x):\n    return x"),
        ("def f(x):\n    return x", "def f(x):\n    return x"),  # no fence at all
        ("```\ndef f(x):\n    return x\n```", "def f(x):\n    return x"),
        ("```python\ndef f(x):\n    return x", "def f(x):\n    return x"),  # cut off before the closing fence
        ("f = lambda x: x + 1\n```\nThis uses a lambda.\n", "f = lambda x: x + 1"),  # no def, then prose
        ("Here it is:\n```python\nf = lambda x: x + 1\n```", "f = lambda x: x + 1"),  # prose head, no def
        ("   \n", None),
        ("```python\n```", None),
        ([{"role": "assistant", "content": "```python\ndef f(x):\n    return x\n```"}], "def f(x):\n    return x"),
    ],
)
def test_extract_program(completion, expected):
    assert extract_program(completion) == expected


def test_entry_point_skips_builtins_and_modules():
    assert entry_point(MBPP_ROWS[0]["test_list"]) == "similar_elements"
    assert entry_point(MBPP_ROWS[1]["test_list"]) == "circle_area"
    assert entry_point(["assert True"]) is None


def test_verifier_is_called_like_the_trainer_calls_it(task):
    example = task.to_prompt_dataset(task.load("train").select([0]))[0]
    columns = {key: value for key, value in example.items() if key != "prompt"}
    good = example["answer"] + "\n```"
    wrong = example["answer"].replace("return", "return 1 +", 1) + "\n```"
    passes = task.verifier(completions=[good, wrong, "no code here (", "", good], **columns)
    assert passes == [True, False, False, False, True]
    assert all(type(p) is bool for p in passes)


def test_hostile_completions_fail_and_the_verifier_goes_on(task):
    example = task.to_prompt_dataset(task.load("train").select([1]))[0]
    hostile = [
        "while True:\n    pass",
        "import os\nos._exit(0)",
        "import os\nwhile True:\n    os.fork()",
        "x = bytearray(10 ** 10)",
        "import sys\nsys.stdout.write('x' * (1 << 30))",
    ]
    verifier = CodeVerifier(task.verifier.limits.__class__(timeout_s=1.5))
    passes = verifier(
        completions=[h + "\n" + example["answer"] for h in hostile] + [example["answer"]],
        tests=example["tests"],
        setup=example["setup"],
    )
    assert passes == [False] * len(hostile) + [True]
    assert verifier.counts["passed"] == 1 and sum(verifier.counts.values()) == len(hostile) + 1


def test_rewards_follow_trl_columns_and_share_the_verifier_cache(task):
    data = task.to_prompt_dataset(task.load("train").select(range(2)))
    completions = [
        data[0]["answer"] + "\n```",
        "def nope(:\n```",
        data[1]["answer"] + "\n```",
        "```python\ndef f(x): return 0\n```",
    ]
    tests = [data[0]["tests"], data[0]["tests"], data[1]["tests"], data[1]["tests"]]
    setups = ["", "", "", ""]
    verifier = CodeVerifier()
    correctness = code_correctness_reward(
        completions, tests=tests, setup=setups, verifier=verifier, prompts=["p"] * 4, answer=["a"] * 4
    )
    assert correctness == [1.0, 0.0, 1.0, 0.0]
    runs = sum(verifier.counts.values())
    # The trainer's outcome check on the same completions is answered from the cache, with the same verdicts.
    assert verifier(completions=completions[:2], tests=tests[0]) == [True, False]
    assert len(verifier._cache) == 4 and sum(verifier.counts.values()) == runs + 2
    name_ok = f"def {entry_point(data[1]['tests'])}(x):\n    return 0"
    assert code_format_reward(completions + [name_ok], tests=tests + [data[1]["tests"]]) == [1.0, 0.0, 1.0, 0.0, 1.0]
    # The task's own reward functions are picklable partials over the task's verifier.
    correctness_func, format_func = task.reward_funcs
    assert correctness_func.keywords["verifier"] is task.verifier and format_func is code_format_reward
    assert pickle.loads(pickle.dumps(task.verifier)).limits == task.verifier.limits


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_mbpp_file_loads_and_verifies(tmp_path):
    path = tmp_path / "mbpp_{split}.jsonl"
    for split in ("train", "test"):
        _write_jsonl(tmp_path / f"mbpp_{split}.jsonl", MBPP_ROWS)
    with pytest.raises(ValueError, match=r"1 of 2 problems .* not tamper-proof .*allow_forgeable_tests: true"):
        get_task("code", source=str(path)).load("test")
    task = get_task("code", source=str(path), allow_forgeable_tests=True)
    raw = task.load("test")
    assert raw.column_names == ["question", "answer", "tests", "setup"]
    data = task.to_prompt_dataset(raw)
    for example in data:
        columns = {key: value for key, value in example.items() if key != "prompt"}
        assert task.verifier(completions=[example["answer"], "def x(): pass"], **columns) == [True, False]


def test_mbpp_sanitized_columns_and_bad_sources(tmp_path):
    sanitized = [
        {
            "prompt": "Add one.",
            "code": "def inc(x):\n    return x + 1",
            "test_imports": ["import math"],
            "test_list": ["assert inc(1) == 2"],
            "source_file": "x",
            "task_id": 7,
        }
    ]
    _write_jsonl(tmp_path / "s.jsonl", sanitized)
    row = get_task("code", source=str(tmp_path / "s.jsonl")).load()[0]
    assert (row["question"], row["setup"], row["tests"]) == ("Add one.", "import math", ["assert inc(1) == 2"])
    with pytest.raises(ValueError, match="test_list"):
        to_code_rows(Dataset.from_list([{"text": "q", "code": "c", "test_list": []}]))
    with pytest.raises(ValueError, match="row 0.*not valid Python"):
        to_code_rows(Dataset.from_list([{"text": "q", "code": "c", "test_list": ["assert f(1) =="]}]))
    with pytest.raises(FileNotFoundError):
        get_task("code", source=str(tmp_path / "missing.jsonl")).load()
    with pytest.raises(ValueError, match="one split"):
        get_task("code", source=str(tmp_path / "s.jsonl")).load("test")
    with pytest.raises(ValueError, match="one pool"):
        get_task("code", num_examples=5).load("test")
    with pytest.raises(ValueError, match="answer_format"):
        get_task("code", answer_format="boxed")


def test_generated_pool_survives_the_splits(tmp_path):
    task = get_task("code", num_examples=120, seed=3)
    make_splits(task.load("train"), tmp_path, sizes={"train": 60, "calibration": 20, "eval": 20}, seed=0)
    data = task.to_prompt_dataset(load_split(tmp_path, "calibration"))
    assert len(data) == 20 and all(isinstance(tests, list) and len(tests) == 3 for tests in data["tests"])
    example = data[0]
    columns = {key: value for key, value in example.items() if key != "prompt"}
    assert task.verifier(completions=[example["answer"]], **columns) == [True]


def test_invalid_tests_fail_every_completion_without_raising(caplog):
    verifier = CodeVerifier()
    assert verifier(completions=["def f(x):\n    return x", "x = 1"], tests=["assert f(1) =="]) == [False, False]
    assert verifier.counts["invalid_tests"] == 2 and "invalid tests" in caplog.text
