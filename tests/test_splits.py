"""Splits: disjointness, the manifest, edits after writing, overlap refusal across folders, and problems that compute
the same thing in other words."""

from __future__ import annotations

import json
import logging
import re

import pytest

from cgrpo.pipeline.tasks import get_task
from cgrpo.pipeline.tasks.answers import computation_signature
from cgrpo.pipeline.tasks.splits import (
    ManifestMismatchError,
    SplitLeakError,
    content_hash,
    load_split,
    load_splits,
    make_splits,
    split_names,
)

SIZES = {"train": 300, "calibration": 60, "eval": 60}


@pytest.fixture(scope="module")
def pool():
    return get_task("arithmetic", num_examples=1000, seed=0).load()


def test_splits_are_disjoint_deduplicated_and_recorded(tmp_path, pool):
    manifest = json.loads(make_splits(pool, tmp_path, sizes=SIZES, seed=0).read_text())
    hashes = {name: manifest["splits"][name]["hashes"] for name in SIZES}
    assert {name: len(value) for name, value in hashes.items()} == SIZES
    assert len(set().union(*hashes.values())) == sum(SIZES.values())
    for name in SIZES:
        rows = load_split(tmp_path, name)
        assert [content_hash(row) for row in rows] == hashes[name]


def test_duplicates_never_straddle_splits(tmp_path):
    rows = [{"question": f"Q{i}", "answer": f"#### {i}"} for i in range(20)]
    noisy = rows + [{"question": f"  q{i} ", "answer": f"####  {i}"} for i in range(20)]  # same after normalising
    manifest = json.loads(make_splits(noisy, tmp_path, sizes={"train": 15, "eval": None}, seed=1).read_text())
    assert manifest["splits"]["eval"]["size"] == 5


def test_splits_are_seeded(tmp_path, pool):
    first = make_splits(pool, tmp_path / "a", sizes=SIZES, seed=0).read_text()
    assert make_splits(pool, tmp_path / "b", sizes=SIZES, seed=0).read_text() == first
    assert make_splits(pool, tmp_path / "c", sizes=SIZES, seed=1).read_text() != first


def test_order_of_the_sizes_does_not_change_the_splits(tmp_path, pool):
    # A YAML mapping has no order: a config dumped with sorted keys must carve the same splits.
    make_splits(pool, tmp_path / "a", sizes=SIZES, seed=0)
    make_splits(pool, tmp_path / "b", sizes=dict(reversed(SIZES.items())), seed=0)
    for name in SIZES:
        assert load_split(tmp_path / "a", name).to_list() == load_split(tmp_path / "b", name).to_list()


def test_too_small_pool_fails_before_writing(tmp_path, pool):
    with pytest.raises(ValueError, match="unique examples"):
        make_splits(pool, tmp_path / "out", sizes={"train": 10_000}, seed=0)
    assert not (tmp_path / "out").exists()


def test_eval_from_a_separate_pool_that_overlaps_train_is_refused_or_dropped(tmp_path):
    train_pool = [{"question": f"Q{i}", "answer": f"#### {i}"} for i in range(30)]
    test_pool = [{"question": f"Q{i}", "answer": f"#### {i}"} for i in range(25, 35)]  # 5 also in train_pool
    sizes = {"train": 20, "calibration": None, "eval": None}
    with pytest.raises(
        SplitLeakError,
        match="5 example\\(s\\) of the eval source split also occur in the training "
        "pool \\(e.g. 'Q25'\\); remove them .* or set splits.drop_overlap",
    ):
        make_splits(train_pool, tmp_path, sizes=sizes, seed=0, eval_pool=test_pool)
    assert not list(tmp_path.iterdir())
    make_splits(train_pool, tmp_path, sizes=sizes, seed=0, eval_pool=test_pool, drop_overlap=True)
    splits = load_splits({name: tmp_path / f"{name}.jsonl" for name in ("train", "calibration", "eval")})
    assert splits["eval"].num_rows == 10
    assert splits["train"].num_rows + splits["calibration"].num_rows == 25


def test_edited_file_is_refused(tmp_path, pool):
    make_splits(pool, tmp_path, sizes=SIZES, seed=0)
    path = tmp_path / "eval.jsonl"
    path.write_text(path.read_text().replace("has", "had", 1))
    with pytest.raises(ManifestMismatchError, match="modified after"):
        load_split(tmp_path, "eval")


def test_overlap_across_folders_is_refused_with_examples(tmp_path, pool):
    make_splits(pool, tmp_path / "a", sizes=SIZES, seed=0)
    make_splits(pool, tmp_path / "b", sizes=SIZES, seed=1)
    with pytest.raises(SplitLeakError, match=r"shares \d+ example\(s\) with split 'train'") as error:
        load_splits({"train": tmp_path / "a" / "train.jsonl", "eval": tmp_path / "b" / "eval.jsonl"})
    assert re.search(r"[0-9a-f]{12} '\w+ has ", str(error.value))  # names hashes and question prefixes
    assert isinstance(error.value, ValueError)


def test_overlap_inside_one_manifest_is_refused(tmp_path, pool):
    manifest_path = make_splits(pool, tmp_path, sizes=SIZES, seed=0)
    train = (tmp_path / "train.jsonl").read_text()
    (tmp_path / "calibration.jsonl").write_text(train)
    manifest = json.loads(manifest_path.read_text())
    manifest["splits"]["calibration"] = {**manifest["splits"]["train"], "file": "calibration.jsonl"}
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(SplitLeakError, match="300 example"):
        load_split(tmp_path, "calibration")


# ------------------------------------------------------------------------------------ near-duplicates by computation


def test_a_computation_signature_is_the_worked_answers_equations_whatever_the_wording():
    assert computation_signature("3*4=12 12+5=17 #### 17") == ("3*4=12", "12+5=17")
    # GSM8K's calculator annotations, thousands commas and trailing zeros normalised; the prose around them ignored.
    gsm8k = "She sold 1,200/2 = <<1,200/2=600>>600 clips, then (600+0.50)*2 = <<(600+0.50)*2=1201>>1201.\n#### 1201"
    assert computation_signature(gsm8k) == ("1200/2=600", "(600+0.5)*2=1201")
    # Operands in the order the solution writes them: three bags of four pens is not four bags of three.
    assert computation_signature("4*3=12 #### 12") != computation_signature("3*4=12 #### 12")
    assert computation_signature("#### 5") is None and computation_signature("return a + b") is None


def _arithmetic_rows(splits_folder):
    return {name: load_split(splits_folder, name).to_list() for name in ("train", "calibration", "eval")}


def test_computation_splits_hold_no_two_problems_with_the_same_operations_and_numbers(tmp_path, caplog):
    # One operation on one-digit numbers (config/smollm2_power.yaml's task): the same few sums and products recur with
    # other names and things, as the text-deduplicated splits show.
    pool = get_task("arithmetic", num_examples=2000, ops_weights=[1, 0, 0], size_weights=[1, 0, 0]).load()
    sizes = {"train": 16, "calibration": 32, "eval": 96}
    make_splits(pool, tmp_path / "text", sizes=sizes, seed=0)
    signatures = [
        computation_signature(row["answer"]) for rows in _arithmetic_rows(tmp_path / "text").values() for row in rows
    ]
    assert len(set(signatures)) < len(signatures)
    with caplog.at_level(logging.INFO, logger="cgrpo.pipeline.tasks.splits"):
        manifest = json.loads(
            make_splits(pool, tmp_path / "computation", sizes=sizes, seed=0, dedupe="computation").read_text()
        )
    rows = _arithmetic_rows(tmp_path / "computation")
    signatures = [computation_signature(row["answer"]) for split in rows.values() for row in split]
    assert None not in signatures and len(set(signatures)) == len(signatures) == sum(sizes.values())
    # The count is every text-distinct problem whose computation an earlier one already had.
    distinct_texts = len({content_hash(row) for row in pool})
    removed = distinct_texts - len({computation_signature(row["answer"]) for row in pool})
    assert removed > 0 and manifest["dedupe"] == {"by": "computation", "near_duplicates_removed": removed}
    assert f"Left out {removed} near-duplicate(s)" in caplog.text
    # Text deduplication writes the manifest it always wrote.
    assert "dedupe" not in json.loads((tmp_path / "text" / "manifest.json").read_text())


def test_a_validation_split_shares_no_computation_with_train_calibration_or_eval(tmp_path):
    # The budget configs' mix: choices made on the validation prompts must not have seen their arithmetic anywhere.
    pool = get_task("arithmetic", num_examples=4000, difficulty={"medium": 0.7, "hard": 0.3}).load()
    sizes = {"train": 256, "calibration": 48, "eval": 128, "validation": 64}
    make_splits(pool, tmp_path, sizes=sizes, seed=0, dedupe="computation")
    assert split_names(tmp_path) == list(sizes)
    signatures = {
        name: {computation_signature(row["answer"]) for row in load_split(tmp_path, name).to_list()} for name in sizes
    }
    assert {name: len(found) for name, found in signatures.items()} == sizes
    for name in ("train", "calibration", "eval"):
        assert not signatures["validation"] & signatures[name], name


def test_computation_dedupe_too_small_a_pool_fails_naming_the_fix(tmp_path):
    pool = get_task("arithmetic", num_examples=2000, ops_weights=[1, 0, 0], size_weights=[1, 0, 0]).load()
    with pytest.raises(ValueError, match="has 156 problems of distinct computations but splits .* give the pool other"):
        make_splits(pool, tmp_path, sizes={"train": 100, "eval": 100}, seed=0, dedupe="computation")
    with pytest.raises(ValueError, match="dedupe='words' is not a way to deduplicate; use one of text, computation"):
        make_splits(pool, tmp_path, sizes={"train": 1}, seed=0, dedupe="words")


def test_a_training_problem_computing_an_eval_problem_is_left_out_and_counted(tmp_path):
    def problem(who: str, a: int, b: int) -> dict:
        return {
            "question": f"{who} has {a} bags of {b} pens.",
            "answer": f"{a}*{b}=<<{a}*{b}={a * b}>>{a * b} #### {a * b}",
        }

    test_pool = [problem("Ann", a, 3) for a in range(2, 8)] + [problem("Eve", 2, 3)]  # one near-duplicate inside
    train_pool = [problem("Bob", a, 3) for a in range(5, 15)]  # 5, 6 and 7 compute eval problems
    sizes = {"train": None, "eval": None}
    manifest = json.loads(
        make_splits(train_pool, tmp_path, sizes=sizes, seed=0, eval_pool=test_pool, dedupe="computation").read_text()
    )
    assert manifest["dedupe"]["near_duplicates_removed"] == 1 + 3
    rows = {name: load_split(tmp_path, name).to_list() for name in sizes}
    assert len(rows["eval"]) == 6 and sorted(int(row["question"].split()[2]) for row in rows["train"]) == list(
        range(8, 15)
    )
