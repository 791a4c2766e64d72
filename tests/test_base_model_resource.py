"""The shipped base model of the default experiment: what it was built with, and how a rebuild compares to it."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import load_script

from cgrpo.pipeline.jobs.base_model import SETTINGS_FILE, BootstrapSettings

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "resources" / "base_model" / "arithmetic"
SCRIPT = REPO / "benchmarks" / "base_model.py"


def _default_config() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def test_the_default_experiments_use_the_shipped_model():
    for name in ("config.yaml", "delta_sweep.yaml"):
        base_model = yaml.safe_load((REPO / "config" / name).read_text())["base_model"]
        assert base_model["bootstrap"] is False and base_model["path"] == "resources/base_model/arithmetic", name


def test_shipped_model_was_built_with_the_configured_recipe():
    recorded = json.loads((SHIPPED / SETTINGS_FILE).read_text())
    configured = dataclasses.asdict(BootstrapSettings(**_default_config()["base_model"]["options"]))
    assert recorded == json.loads(json.dumps(configured))


@pytest.fixture(scope="module")
def script():
    return load_script(SCRIPT, "base_model_benchmark")


def _eval_args() -> argparse.Namespace:
    return argparse.Namespace(
        eval_size=50, eval_seed=123_456, num_samples=2, temperature=1.0, max_new_tokens=40, batch_size=256
    )


@pytest.mark.slow
@pytest.mark.long
def test_the_rebuild_check_accepts_the_shipped_model_and_rejects_another(script, bootstrapped_model_dir):
    # The check itself (benchmarks/base_model.py --reference): a rebuild on the machine that built the shipped model
    # is bit-identical; whether one elsewhere is within the tolerance is what the script measures there.
    same = script.compare(SHIPPED, SHIPPED, _eval_args())
    assert same["identical_weights"] and same["differences"] == [0.0, 0.0, 0.0] and same["within_tolerance"]
    other = script.compare(Path(bootstrapped_model_dir), SHIPPED, _eval_args())
    assert not other["identical_weights"] and not other["within_tolerance"]
    assert other["reference"] == same["reference"]


def _dry_run(workdir: Path, *configfiles: Path, experiment: str = "default") -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--workflow-profile",
        "none",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "-n",
        "--cores",
        "1",
        "--configfile",
        *map(str, configfiles),
        "--",
        f"results/{experiment}/base_model/source.json",
    ]
    return subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120, check=False
    )


@pytest.mark.long
def test_the_rebuild_override_needs_no_shipped_model(tmp_path):
    # Without the shipped model in the working directory, only the override (which bootstraps) passes the dry run.
    default = REPO / "config" / "config.yaml"
    missing = _dry_run(tmp_path, default)
    assert (
        missing.returncode != 0 and "resources/base_model/arithmetic' does not exist" in missing.stdout + missing.stderr
    )
    rebuild_override = REPO / "config" / "overrides" / "rebuild_base_model.yaml"
    rebuild = _dry_run(tmp_path, default, rebuild_override, experiment="rebuilt_base_model")
    assert rebuild.returncode == 0, rebuild.stdout + rebuild.stderr
