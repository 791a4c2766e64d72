"""cgrpo.pipeline.configuration.provenance on its own: spec files that change only with their spec, and the experiment's record.

The workflow's use of it (what reruns, and which config is refused) is in test_reruns.py.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from cgrpo.pipeline.configuration.checks import ConfigError
from cgrpo.pipeline.configuration.provenance import (
    RECORD,
    canonical,
    claim_experiment_folder,
    config_changes,
    experiment_config,
    write_spec,
)

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "config.schema.yaml"


def resolved(path: Path = REPO / "config" / "smoke.yaml") -> dict:
    config = yaml.safe_load(path.read_text())
    validate(config, schema=str(SCHEMA))
    return config


def age(path: Path) -> int:
    """Set `path`'s modification time an hour back, so that a rewrite cannot share it; return it."""
    past = path.stat().st_mtime_ns - 3600 * 10**9
    os.utime(path, ns=(past, past))
    return past


def test_a_spec_file_is_rewritten_only_when_its_spec_changes(tmp_path):
    path = tmp_path / "specs" / "train" / "grpo_s0_G8.json"
    spec = {"trainer": {"learning_rate": 1e-4, "beta": 0.0}, "run": "grpo_s0_G8"}
    assert write_spec(path, spec) == str(path)
    written = age(path)
    # The same settings in another key order are the same spec.
    write_spec(path, {"run": "grpo_s0_G8", "trainer": {"beta": 0.0, "learning_rate": 1e-4}})
    assert path.stat().st_mtime_ns == written
    write_spec(path, {**spec, "trainer": {"learning_rate": 5e-5, "beta": 0.0}})
    assert path.stat().st_mtime_ns > written
    assert json.loads(path.read_text())["trainer"]["learning_rate"] == 5e-5
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_canonical_sorts_every_level_and_keeps_list_order():
    data = {"b": {"y": 1, "x": [3, 1, 2]}, "a": (1, 2)}
    assert list(canonical(data)) == ["a", "b"]
    assert list(canonical(data)["b"]) == ["x", "y"]
    assert canonical(data)["b"]["x"] == [3, 1, 2] and canonical(data)["a"] == [1, 2]


def test_config_changes_name_every_differing_key():
    old = {"training": {"learning_rate": 1e-4, "max_steps": 2}, "seeds": [0], "peft": None}
    new = {"training": {"learning_rate": 5e-5, "max_steps": 2, "bf16": True}, "seeds": [0, 1], "peft": None}
    assert config_changes(old, new) == [
        "seeds: [0] -> [0, 1]",
        "training.bf16: unset -> true",
        "training.learning_rate: 0.0001 -> 5e-05",
    ]
    assert config_changes(old, copy.deepcopy(old)) == []


def test_the_first_config_claims_the_folder_and_another_is_refused(tmp_path):
    folder = tmp_path / "results" / "smoke"
    config = resolved()
    claim_experiment_folder(folder, config)
    record = folder / RECORD
    # The whole resolved config, but for the planning flag.
    assert yaml.safe_load(record.read_text()) == experiment_config(config)
    assert "replace_results" not in yaml.safe_load(record.read_text())
    written = age(record)
    claim_experiment_folder(folder, copy.deepcopy(config))
    assert record.stat().st_mtime_ns == written

    other = copy.deepcopy(config)
    other["training"]["learning_rate"] = 5e-5
    other["seeds"] = [0, 1]
    other["evaluation"]["deltas"] = [0.3]
    other["statistics"]["seed"] = 1
    with pytest.raises(ConfigError) as refused:
        claim_experiment_folder(folder, other)
    message = str(refused.value)
    assert message.startswith(f"{folder}/ holds the results of another config (evaluation.deltas: [0.2] -> [0.3]; ")
    assert "; 1 more; its whole config is in" in message and "learning_rate" not in message
    assert "--config replace_results=True" in message
    assert record.stat().st_mtime_ns == written

    claim_experiment_folder(folder, {**other, "replace_results": True})
    assert yaml.safe_load(record.read_text()) == experiment_config(other)
    claim_experiment_folder(folder, other)


def test_a_dry_run_checks_the_folder_but_records_nothing(tmp_path):
    folder = tmp_path / "results" / "smoke"
    config = resolved()
    claim_experiment_folder(folder, config, record=False)
    assert not (folder / RECORD).exists()
    claim_experiment_folder(folder, config)
    recorded = (folder / RECORD).read_text()
    other = copy.deepcopy(config)
    other["training"]["learning_rate"] = 5e-5
    with pytest.raises(ConfigError, match="holds the results of another config"):
        claim_experiment_folder(folder, other, record=False)
    claim_experiment_folder(folder, {**other, "replace_results": True}, record=False)
    assert (folder / RECORD).read_text() == recorded


def test_a_key_the_schema_gained_since_the_record_is_not_a_change(tmp_path):
    folder = tmp_path / "results" / "smoke"
    config = resolved()
    claim_experiment_folder(folder, config)
    record = folder / RECORD
    old = yaml.safe_load(record.read_text())
    del old["statistics"]["coverage_splits"]
    record.write_text(yaml.safe_dump(old))
    with pytest.raises(ConfigError, match=r"statistics.coverage_splits: unset -> 200"):
        claim_experiment_folder(folder, config)
    claim_experiment_folder(folder, config, lambda recorded: validate(recorded, schema=str(SCHEMA)))
    # The record is brought up to date with the key's default.
    assert yaml.safe_load(record.read_text())["statistics"]["coverage_splits"] == 200
