"""A changed setting reruns exactly the jobs it changes, and one results folder holds one config's results.

The finished smoke tree the tests plan on is made by hand, without running a job: an empty file or folder at every
output path a dry run plans, and the compute-matching record, all with one modification time, as a finished run leaves
them. So every test is a dry run of a few seconds (`cgrpo.pipeline.configuration.provenance`; docs/pipeline.md, "When the config
changes"). Making the tree and the tests on it take about 2 minutes together, so they are marked long: .ci/run runs
them in the long step, outside the test command's 10 minutes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml
from test_workflow import EMBEDDED, REPO, job_counts, snakemake, workdir_like_repo

SMOKE = REPO / "config" / "smoke.yaml"
OVERRIDES = REPO / "config" / "overrides"
# Not one of the smoke's fixed group sizes (8 and 2), so that the compute-matched GRPO run trains on its own.
MATCHED_G = 4
REFUSED = "results/smoke/ holds the results of another config"


def planned_outputs(output: str) -> list[str]:
    """Every output path of the jobs a dry run plans."""
    return [path for line in re.findall(r"^\s+output: (.+)$", output, re.MULTILINE) for path in line.split(", ")]


def dry_run(workdir: Path, *configfiles: Path, config: tuple[str, ...] = ()):
    extra = ("--config", *config) if config else ()
    return snakemake(workdir, "-n", "--cores", "1", "--configfile", str(SMOKE), *map(str, configfiles), *extra)


def touch_run(workdir: Path, *configfiles: Path, config: tuple[str, ...] = ()):
    """A run that marks the planned jobs done without running them: it records the config, as any run does."""
    extra = ("--config", *config) if config else ()
    return snakemake(workdir, "--touch", "--cores", "1", "--configfile", str(SMOKE), *map(str, configfiles), *extra)


def scheduled(result) -> dict[str, int]:
    """Jobs per rule that a successful dry run plans (without the target rule `all`)."""
    assert result.returncode == 0, result.stdout[-5000:]
    if "Nothing to be done" in result.stdout:
        return {}
    return {rule: n for rule, n in job_counts(result.stdout).items() if rule not in ("all", "total")}


def spec_times(workdir: Path) -> dict[Path, int]:
    return {path: path.stat().st_mtime_ns for path in (workdir / "results" / "smoke" / "specs").rglob("*.json")}


def override(tmp_path: Path, settings: dict) -> Path:
    path = tmp_path / "override.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


@pytest.fixture(scope="module")
def finished_smoke(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("finished-smoke")
    # The compute-matched run is planned only once the match_compute checkpoint's record exists: a second round.
    for _ in range(3):
        result = dry_run(workdir)
        assert result.returncode == 0, result.stdout[-5000:]
        missing = [workdir / name for name in planned_outputs(result.stdout) if not (workdir / name).exists()]
        if not missing:
            break
        for path in missing:
            if path.name == "model":
                path.mkdir(parents=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"num_generations": MATCHED_G}) if path.parent.name == "matched" else "")
    else:
        pytest.fail(f"the dry runs kept planning new outputs: {missing}")
    # A dry run records no config; a run does, and marking the jobs done (--touch) is one.
    touched = touch_run(workdir)
    assert touched.returncode == 0, touched.stdout[-5000:]
    # Snakemake reruns a job only for an input strictly newer than its outputs.
    now = time.time()
    for path in (workdir / "results").rglob("*"):
        os.utime(path, (now, now))
    return workdir


@pytest.fixture
def tree(finished_smoke, tmp_path) -> Path:
    """A copy of the finished smoke tree of this test's own (copytree keeps the modification times)."""
    return Path(shutil.copytree(finished_smoke, tmp_path / "tree", ignore=shutil.ignore_patterns(".snakemake")))


@pytest.mark.long
def test_an_unchanged_config_reruns_nothing_and_rewrites_no_spec(tree):
    before = spec_times(tree)
    assert {folder for path in before for folder in path.parts} >= {"specs", "calibrate", "train", "evaluate"}
    assert scheduled(dry_run(tree)) == {}
    assert spec_times(tree) == before
    # The folder's record is the whole resolved config: given alone, it is the same config.
    record = tree / "results" / "smoke" / "config.yaml"
    again = snakemake(tree, "-n", "--cores", "1", "--configfile", str(record), "--replace-workflow-config")
    assert scheduled(again) == {}
    assert spec_times(tree) == before


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # Every method trains with `training`; the base model, the splits, the calibration (which samples and never
        # takes an optimizer step) and the base model's evaluation do not. The compute-matched run is planned once its
        # checkpoint, match_compute, has rerun.
        (
            {"training": {"learning_rate": 5.0e-5}},
            {
                "train_cgrpo": 1,
                "train": 5,
                "match_compute": 1,
                "evaluate": 6,
                "aggregate": 1,
                "plots": 1,
            },
        ),
        # GRPO's own trainer options: its fixed-G and compute-matched runs alone, then their evaluations and tables.
        ({"grpo": {"trainer": {"learning_rate": 5.0e-5}}}, {"train": 3, "evaluate": 3, "aggregate": 1, "plots": 1}),
    ],
    ids=["training", "grpo.trainer"],
)
@pytest.mark.long
def test_a_changed_setting_reruns_the_jobs_whose_spec_holds_it(tree, tmp_path, change, expected):
    result = dry_run(tree, override(tmp_path, change), config=("replace_results=True",))
    assert scheduled(result) == expected
    planned = planned_outputs(result.stdout)
    assert "results/smoke/eval/base.json" not in planned
    assert ("results/smoke/runs/grpo_s0_G4_matched/run.json" in planned) == ("grpo" in change)


@pytest.mark.long
def test_another_config_is_refused_in_a_folder_with_results_until_it_takes_the_folder_over(tree, tmp_path):
    record = tree / "results" / "smoke" / "config.yaml"
    recorded, specs = record.read_text(), spec_times(tree)
    lower = override(tmp_path, {"training": {"learning_rate": 5.0e-5}})
    refused = dry_run(tree, lower)
    assert refused.returncode != 0
    assert f"{REFUSED} (training.learning_rate: 0.0001 -> 5e-05; its whole config is in results/smoke/config.yaml)" in (
        refused.stdout
    )
    assert "set `experiment` to a new name to keep both, or add `--config replace_results=True`" in refused.stdout
    # Refused before planning: nothing rewritten.
    assert record.read_text() == recorded and spec_times(tree) == specs

    assert scheduled(dry_run(tree, lower, config=("replace_results=True",)))
    # A dry run changes no result, so it does not take the folder over.
    assert record.read_text() == recorded
    assert dry_run(tree, lower).returncode != 0
    taken = touch_run(tree, lower, config=("replace_results=True",))
    assert taken.returncode == 0, taken.stdout[-5000:]
    # Taken over: the record is the new config (the flag is not part of it), and now the old one is refused.
    assert yaml.safe_load(record.read_text())["training"]["learning_rate"] == 5.0e-5
    assert "replace_results" not in yaml.safe_load(record.read_text())
    # --touch marked every planned job done, so nothing is left to run.
    assert scheduled(dry_run(tree, lower)) == {}
    back = dry_run(tree)
    assert back.returncode != 0 and f"{REFUSED} (training.learning_rate: 5e-05 -> 0.0001;" in back.stdout


LOOKING = {
    "dry run": ("-n",),
    "list rules": ("--list-rules",),
    "lint": ("--lint",),
    "dag": ("--dag",),
    "rule graph": ("--rulegraph",),
    "summary": ("--summary",),
    "report": ("--report", "report.html"),
}


def snapshot(workdir: Path) -> dict[str, tuple[bytes, int] | None]:
    """Every file under `workdir`/results with its bytes and modification time, and every folder (None)."""
    return {
        str(path.relative_to(workdir)): (path.read_bytes(), path.stat().st_mtime_ns) if path.is_file() else None
        for path in sorted((workdir / "results").rglob("*"))
    }


@pytest.mark.parametrize("command", LOOKING.values(), ids=LOOKING.keys())
@pytest.mark.long
def test_a_command_that_only_looks_leaves_results_as_it_found_them(tree, tmp_path, command):
    # A finished tree looked at with an edited setting, which a run would rerun and write new specs for.
    edited = ("--configfile", str(SMOKE), str(override(tmp_path, {"training": {"learning_rate": 5.0e-5}})))
    before = snapshot(tree)
    result = snakemake(tree, *command, "--cores", "1", *edited, "--config", "replace_results=True")
    assert snapshot(tree) == before, result.stdout[-3000:]
    if command == ("-n",):
        # The plan still shows the jobs the edit reruns.
        assert scheduled(result)["train_cgrpo"] == 1
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    result = snakemake(fresh, *command, "--cores", "1", "--configfile", str(SMOKE))
    assert not (fresh / "results").exists(), result.stdout[-3000:]


def test_overrides_in_another_order_do_not_write_into_the_folder_they_name(tmp_path):
    workdir = workdir_like_repo(tmp_path)
    long, one_step = OVERRIDES / "long.yaml", OVERRIDES / "one_step_generation.yaml"

    def plan(*configfiles: Path, run: tuple[str, ...] = ("-n",)):
        return snakemake(workdir, *run, "--cores", "1", "--configfile", str(EMBEDDED), *map(str, configfiles))

    # A run records its config, here one of the first two jobs alone; a dry run only checks it.
    first = plan(long, run=("--until", "split"))
    assert first.returncode == 0, first.stdout[-5000:]
    # long.yaml last names the folder, but one_step_generation.yaml before it changed the schedule.
    swapped = plan(one_step, long)
    assert swapped.returncode != 0
    assert "results/long/ holds the results of another config (cgrpo.ablations.rules:" in swapped.stdout
    assert plan(long, one_step).returncode == 0


def test_every_shipped_override_writes_into_a_folder_of_its_own():
    configs = {path.name: yaml.safe_load(path.read_text()) for path in (REPO / "config").glob("*.yaml")}
    overrides = {path.name: yaml.safe_load(path.read_text()) for path in OVERRIDES.glob("*.yaml")}
    assert overrides
    missing = [name for name, settings in overrides.items() if "experiment" not in settings]
    assert not missing, f"overrides without an experiment of their own: {missing}"
    names = [settings["experiment"] for settings in {**configs, **overrides}.values()]
    assert len(names) == len(set(names)), names
