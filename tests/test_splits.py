"""Splits: disjointness, the manifest, edits after writing and overlap refusal across folders."""

from __future__ import annotations

import json
import re

import pytest

from cgrpo.pipeline.tasks import get_task
from cgrpo.pipeline.tasks.splits import (
    ManifestMismatchError,
    SplitLeakError,
    content_hash,
    load_split,
    load_splits,
    make_splits,
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
