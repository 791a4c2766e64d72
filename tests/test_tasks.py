"""Tasks: registry, arithmetic generator, GSM8K loader, answer extraction, prompts and rewards."""

from __future__ import annotations

import json
import operator
import re

import pytest

from cgrpo.pipeline.tasks import available_tasks, extract_answer, get_task, is_well_formed, normalize_number, parse_gold
from cgrpo.pipeline.tasks.arithmetic import ITEMS, generate_problems

GSM8K_ROWS = [
    {
        "question": "Natalia sold 48 clips in April and half as many in May. How many in all?",
        "answer": "She sold 48/2 = <<48/2=24>>24 in May.\nSo 48+24 = <<48+24=72>>72.\n#### 72",
    },
    {"question": "A shop earns $1,200 a day. How much in 10 days?", "answer": "1200*10 = 12000\n#### 12,000"},
]


def test_registry_lists_tasks_and_rejects_unknown_names():
    assert {"arithmetic", "gsm8k"} <= set(available_tasks())
    with pytest.raises(ValueError, match="arithmetic"):
        get_task("nope")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,234", "1234"),
        ("+5", "5"),
        ("3.0", "3"),
        ("-0", "0"),
        ("-0.00", "0"),
        ("26.", "26"),
        ("\u22127", "-7"),
        ("12 345", "12345"),
        ("007", "7"),
        ("0.50", "0.5"),
        ("$18", "18"),
        ("123456789012345678901234567890.000", "123456789012345678901234567890"),
        ("abc", None),
        ("", None),
        ("+", None),
        ("3..", None),
        ("1e5", None),
        ("5/2", None),
    ],
)
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("7*3=21 21+5=26 #### 26", "26"),
        ("#### 1 then #### 2", "2"),  # the last marker counts
        ("no marker 26", None),
        ("#### twenty", None),
        ("#### 26 apples", None),
        ("####", None),
        ("#### 26\nThanks!", "26"),
        ("#### \u221212.", "-12"),
        ("#### 1,000,000,000,000,000,000,000", "1000000000000000000000"),
        ("#### 99999999999999999999999999.5", "99999999999999999999999999.5"),
    ],
)
def test_extract_hash_answers(completion, expected):
    assert extract_answer(completion) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (r"so \boxed{26}", "26"),
        (r"\boxed{1} \boxed{2}", "2"),
        (r"\boxed{\frac{1}{2}}", None),
        (r"\boxed{26", None),
        ("#### 26", None),
        # LaTeX markup around the number (issue #12)
        (r"\boxed{1{,}234}", "1234"),
        (r"\boxed{\$12}", "12"),
        (r"\boxed{12\%}", "12"),
        (r"\boxed{\text{12}}", "12"),
        (r"\boxed{\text{1,234}}", "1234"),
        (r"\boxed{-\$5}", "-5"),
        (r"\boxed{\textbf{7}}", "7"),
        (r"\boxed{12\,000}", "12000"),
        (r"\boxed{\mathrm{3.50}}", "3.5"),
        (r"\boxed{\mathbf{\$1{,}000}}", "1000"),
        (r"\boxed{$42$}", "42"),
        (r"\boxed{90^\circ}", "90"),
        (r"\boxed{90^{\circ}}", "90"),
        (r"\boxed{1\!000}", "1000"),
        (r"\boxed{\text{twelve}}", None),
        (r"\boxed{\sqrt{2}}", None),
        (r"\boxed{12\text{ apples}}", None),
        (r"\boxed{\$}", None),
        (r"\boxed{x = 5}", None),
    ],
)
def test_extract_boxed_answers(completion, expected):
    assert extract_answer(completion, "boxed") == expected


@pytest.mark.parametrize(
    ("completion", "hash_ok", "boxed_ok"),
    [
        ("1+2=3 #### 3", True, False),
        ("#### 3  \n", True, False),
        ("#### 3\nmore", False, False),
        ("#### x", False, False),
        (r"1+2=3 \boxed{3} ", False, True),
        (r"\boxed{3} and more", False, False),
        (r"\boxed{\text{\$1{,}234}}", False, True),
        (r"\boxed{\frac{1}{2}}", False, False),
    ],
)
def test_format_check(completion, hash_ok, boxed_ok):
    assert is_well_formed(completion, "hash") is hash_ok
    assert is_well_formed(completion, "boxed") is boxed_ok


def test_gold_parsing_and_malformed_gold():
    assert parse_gold(GSM8K_ROWS[1]["answer"]) == "12000"
    with pytest.raises(ValueError, match="does not end"):
        parse_gold("no final answer")


def test_unknown_answer_format_is_rejected():
    with pytest.raises(ValueError, match="answer_format"):
        get_task("arithmetic", answer_format="latex")


def test_generator_is_deterministic_and_seed_dependent():
    first, again, other = (generate_problems(50, seed) for seed in (3, 3, 4))
    assert first.to_list() == again.to_list()
    assert first["question"] != other["question"]


def test_generator_spreads_difficulty_and_keeps_answers_short():
    problems = generate_problems(2000, 0)
    assert set(problems["num_ops"]) == {1, 2, 3}
    assert set(problems["size"]) == {"small", "medium", "large"}
    assert set(problems["item"]) == set(ITEMS)
    assert all(question.endswith(f"How many {item}?") for question, item in zip(problems["question"], problems["item"]))
    assert max(len(answer) for answer in problems["answer"]) <= 40


def test_worked_answers_are_correct_chains():
    operations = {"+": operator.add, "-": operator.sub, "*": operator.mul}
    for example in generate_problems(300, 1):
        steps = [re.fullmatch(r"(\d+)([-+*])(\d+)=(\d+)", step).groups() for step in example["answer"].split()[:-2]]
        assert len(steps) == example["num_ops"]
        for (left, op, right, result), following in zip(steps, [*steps[1:], None]):
            assert operations[op](int(left), int(right)) == int(result) > 0
            assert following is None or following[0] == result
        assert steps[-1][3] == parse_gold(example["answer"])


def test_arithmetic_is_the_gsm8k_task_with_a_generating_loader():
    arithmetic, gsm8k = get_task("arithmetic", num_examples=5), get_task("gsm8k")
    example = arithmetic.load()[0]
    assert arithmetic.format_prompt(example["question"]) == gsm8k.format_prompt(example["question"])
    assert arithmetic.gold(example["answer"]) == arithmetic.extract(example["answer"])
    with pytest.raises(ValueError, match="one pool"):
        arithmetic.load("test")


def test_boxed_format_changes_prompt_generator_and_rewards():
    task = get_task("arithmetic", num_examples=5, answer_format="boxed")
    example = task.load()[0]
    assert example["answer"].endswith("}") and "\\boxed{" in example["answer"]
    assert "\\boxed{<answer>}" in task.format_prompt("q")
    data = task.to_prompt_dataset(task.load())
    correctness, formatting = task.reward_funcs
    assert correctness(completions=[example["answer"]], answer=[data[0]["answer"]]) == [1.0]
    assert formatting(completions=[example["answer"], "#### 3"]) == [1.0, 0.0]


def test_chat_prompts_are_conversations():
    task = get_task("arithmetic", num_examples=3, chat=True)
    prompt = task.to_prompt_dataset(task.load())[0]["prompt"]
    assert prompt[0]["role"] == "user" and "#### <answer>" in prompt[0]["content"]


def test_worked_examples_come_first_and_leave_every_split():
    plain = get_task("arithmetic", num_examples=40, chat=True)
    task = get_task("arithmetic", num_examples=40, chat=True, system_prompt="Solve it.", worked_examples=2)
    shown = [question for question, _ in task.examples]
    assert shown == list(dict.fromkeys(plain.load()["question"]))[:2]
    pool = task.load()["question"]
    assert not set(shown) & set(pool) and len(pool) == len(plain.load()) - sum(
        q in shown for q in plain.load()["question"]
    )
    prompt = task.format_prompt("Q?")
    assert [turn["role"] for turn in prompt] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert prompt[0]["content"] == "Solve it." and prompt[-1]["content"].startswith("Q?\n")
    assert [turn["content"] for turn in prompt[2:5:2]] == [answer for _, answer in task.examples]
    assert task.prompt_record()["worked_examples"][0] == {"question": shown[0], "answer": task.examples[0][1]}


def test_worked_examples_in_plain_prompts_end_with_the_question():
    task = get_task("arithmetic", num_examples=20, system_prompt="Solve it.", worked_examples=1)
    (question, answer), prompt = task.examples[0], task.format_prompt("Q?")
    assert prompt == f"Solve it.\n\nQuestion: {question}\nEnd with '#### <answer>'.\nAnswer: {answer}\n\n" + (
        "Question: Q?\nEnd with '#### <answer>'.\nAnswer: "
    )
    assert (
        get_task("arithmetic", num_examples=20).format_prompt("Q?")
        == "Question: Q?\nEnd with '#### <answer>'.\nAnswer: "
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"worked_examples": -1}, "worked_examples is -1"),
        ({"system_prompt": " "}, "system_prompt is empty"),
    ],
)
def test_prompt_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        get_task("arithmetic", num_examples=3, **options)


def test_more_worked_examples_than_questions_is_an_error():
    with pytest.raises(ValueError, match="fewer than worked_examples 4; lower worked_examples"):
        get_task("arithmetic", num_examples=3, worked_examples=4).load()


def test_rewards_accept_strings_and_conversational_completions():
    correctness, formatting = get_task("gsm8k").reward_funcs
    texts = ["3+4=7 #### 7", "#### 8", "I think 7"]
    messages = [[{"role": "assistant", "content": text}] for text in texts]
    for completions in (texts, messages):
        assert correctness(completions=completions, answer=["7"] * 3, prompts=["p"] * 3) == [1.0, 0.0, 0.0]
        assert formatting(completions=completions, answer=["7"] * 3) == [1.0, 1.0, 0.0]
    assert [fn.func.__name__ for fn in (correctness, formatting)] == ["correctness_reward", "format_reward"]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_gsm8k_loads_local_files(tmp_path, suffix):
    path = tmp_path / f"gsm8k{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in GSM8K_ROWS))
    else:
        import pandas as pd

        pd.DataFrame(GSM8K_ROWS).to_csv(path, index=False)
    task = get_task("gsm8k", source=str(path))
    data = task.to_prompt_dataset(task.load())
    assert data["answer"] == ["72", "12000"]
    assert data[0]["prompt"].startswith("Question: Natalia") and data[0]["prompt"].endswith("Answer: ")


def test_gsm8k_worked_examples_come_from_train_and_leave_the_test_split_too(tmp_path):
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in GSM8K_ROWS))
    # The same question in the test split, differently spaced and cased, is still one the prompt shows solved.
    shown_again = {**GSM8K_ROWS[0], "question": GSM8K_ROWS[0]["question"].upper().replace(" ", "  ")}
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in (shown_again, GSM8K_ROWS[1])))
    task = get_task("gsm8k", source=str(tmp_path / "{split}.jsonl"), worked_examples=1)
    assert task.examples == ((GSM8K_ROWS[0]["question"], GSM8K_ROWS[0]["answer"]),)
    assert task.load("test")["question"] == [GSM8K_ROWS[1]["question"]]
    assert task.load("train")["question"] == [GSM8K_ROWS[1]["question"]]


def test_gsm8k_local_split_placeholder_and_errors(tmp_path):
    (tmp_path / "test.jsonl").write_text(json.dumps(GSM8K_ROWS[0]) + "\n")
    assert get_task("gsm8k", source=str(tmp_path / "{split}.jsonl")).load("test").num_rows == 1
    with pytest.raises(ValueError, match="holds one split"):
        get_task("gsm8k", source=str(tmp_path / "test.jsonl")).load("test")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        get_task("gsm8k", source=str(tmp_path / "missing.jsonl")).load()
    (tmp_path / "bad.jsonl").write_text(json.dumps({"problem": "x", "answer": "#### 1"}) + "\n")
    with pytest.raises(ValueError, match="question"):
        get_task("gsm8k", source=str(tmp_path / "bad.jsonl")).load()


def test_a_difficulty_mix_draws_each_problem_from_its_stratum():
    problems = generate_problems(600, 0, difficulty={"easy": 0.5, "hard": 0.5})
    strata = problems["stratum"]
    assert set(strata) == {"easy", "hard"} and 200 < strata.count("easy") < 400
    easy = [row for row in problems if row["stratum"] == "easy"]
    hard = [row for row in problems if row["stratum"] == "hard"]
    assert {(row["num_ops"], row["size"]) for row in easy} == {(1, "small")}
    assert {(row["num_ops"], row["size"]) for row in hard} == {(3, "large")}
    assert generate_problems(600, 0, difficulty={"easy": 0.5, "hard": 0.5})["question"] == problems["question"]


def test_the_medium_stratum_is_the_task_own_mix_and_no_mix_leaves_the_pool_as_it_was():
    medium = generate_problems(200, 0, difficulty={"medium": 1.0}, ops_weights=(0, 1, 0))
    assert set(medium["num_ops"]) == {2}
    # Without a difficulty mix the generator draws exactly what it drew before the option existed.
    assert "stratum" not in generate_problems(20, 0).column_names


@pytest.mark.parametrize(
    ("difficulty", "message"),
    [({"trivial": 1.0}, "unknown ones \\['trivial'\\]"), ({}, "names no stratum"), ({"easy": -1.0}, "non-negative")],
)
def test_a_bad_difficulty_mix_is_refused_with_the_strata_named(difficulty, message):
    with pytest.raises(ValueError, match=message):
        get_task("arithmetic", difficulty=difficulty)
