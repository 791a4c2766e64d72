"""The SLURM profiles retry a failed job and have SLURM requeue a preempted one, under option names that the installed
Snakemake and SLURM executor plugin accept: each profile is parsed by Snakemake's own command-line parser, which
rejects a key it does not know, and every `slurm-` key must name a field of the plugin's settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from snakemake.cli import parse_args

plugin = pytest.importorskip("snakemake_executor_plugin_slurm", reason="the slurm extra: pip install -e '.[slurm]'")

REPO = Path(__file__).resolve().parents[1]
PROFILES = ["slurm", "slurm-local"]


def profile_dir(name: str) -> Path:
    return REPO / "workflow" / "profiles" / name


@pytest.mark.parametrize("name", PROFILES)
def test_the_profile_retries_failed_jobs_and_requeues_preempted_ones(name):
    # As `snakemake --workflow-profile <dir>` reads it: an unknown key ends the parse with a usage error.
    _, args = parse_args(["--snakefile", str(REPO / "Snakefile"), "--workflow-profile", str(profile_dir(name))])
    assert args.retries >= 1, f"{name}: Snakemake gives up on a failed job at once"
    assert args.slurm_requeue is True, f"{name}: SLURM will not requeue a preempted job"


@pytest.mark.parametrize("name", PROFILES)
def test_every_slurm_key_is_a_setting_of_the_installed_plugin(name):
    settings = {field.name for field in dataclasses.fields(plugin.ExecutorSettings)}
    keys = [key for key in yaml.safe_load((profile_dir(name) / "config.yaml").read_text()) if key.startswith("slurm-")]
    assert "slurm-requeue" in keys
    for key in keys:
        assert key.removeprefix("slurm-").replace("-", "_") in settings, f"{name}: {key} is no setting of the plugin"
