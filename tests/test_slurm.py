"""The SLURM profile against a real cluster: the smoke config run through ``workflow/profiles/slurm-local``.

Needs a SLURM cluster with a partition ``local`` on this machine and its filesystem: ``bash scripts/slurm-local.sh
start`` (root, Debian or Ubuntu; ``.ci/run`` does it) sets up a single-node one. Where ``sbatch`` is missing or the
cluster does not answer, the test is skipped with the reason. The same config is run once locally and once through
SLURM, each in its own temporary directory; every job of the SLURM run must have been submitted with ``sbatch`` and
left its SLURM log, and every table must equal the local run's, wall-clock columns aside.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from conftest import SLURM_PROFILE, require_cluster, run_smoke

# Measured in the run, so different between any two runs: training, generation, update, calibration and evaluation
# wall clock and CPU time (summary `*_wall_s` and `*_cpu_s`, by_method and paired "wall clock ..." and "CPU time ...")
# and the savings computed from them (`time_savings`, `cpu_time_savings`, "time savings incl. calibration ...").
TIMING_COLUMN = re.compile(r"wall|cpu|CPU|time.savings")
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (\S+)\)\.")

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """The smoke run, locally and through the slurm-local profile: {"local" | "slurm": (workdir, output)}."""
    # Before the local run, which takes minutes and is wasted where there is no cluster.
    require_cluster()
    smoke_run = request.getfixturevalue("smoke_run")
    workdir = tmp_path_factory.mktemp("smoke-slurm")
    # sbatch exports the environment to the jobs (--export=ALL): they run offline too.
    result = run_smoke(workdir, "--workflow-profile", str(SLURM_PROFILE))
    assert result.returncode == 0, f"slurm run failed:\n{result.stdout[-5000:]}"
    return {"local": smoke_run, "slurm": (workdir, result.stdout)}


def completed_jobs(output: str) -> dict[str, int]:
    """{rule: jobs} of the jobs Snakemake reports finished, the target rule `all` left out."""
    rules = re.findall(r"^Finished jobid: \d+ \(Rule: (\w+)\)$", output, flags=re.MULTILINE)
    counts: dict[str, int] = {}
    for rule in rules:
        if rule != "all":
            counts[rule] = counts.get(rule, 0) + 1
    return counts


def test_every_job_ran_under_slurm(runs):
    workdir, output = runs["slurm"]
    submitted = SUBMITTED.findall(output)
    assert submitted, output[-5000:]
    # Every job the run finished was submitted once, and the same jobs as the local run's.
    assert len(submitted) == sum(completed_jobs(output).values())
    assert completed_jobs(output) == completed_jobs(runs["local"][1])
    slurm_ids = [slurm_id for _, slurm_id, _ in submitted]
    assert len(set(slurm_ids)) == len(slurm_ids)
    # Each SLURM job left its log, named after its job id, under the run's .snakemake/slurm_logs/rule_<rule>/: the
    # output of the Snakemake job step that ran the rule inside the allocation.
    slurm_logs = workdir / ".snakemake" / "slurm_logs"
    logs = {path.stem: path for path in slurm_logs.rglob("*.log")}
    assert sorted(logs) == sorted(slurm_ids)
    for _, slurm_id, log in submitted:
        assert Path(log) == logs[slurm_id]
        rule = logs[slurm_id].relative_to(slurm_logs).parts[0].removeprefix("rule_")
        text = logs[slurm_id].read_text()
        assert "--executor slurm-jobstep" in text, log
        assert re.search(rf"^(rule|checkpoint) {rule}:$", text, flags=re.MULTILINE), log
    # And SLURM itself ran them to completion: finished jobs stay in squeue for MinJobAge (600 s on the local
    # cluster), so every job of the run is still listed.
    listed = subprocess.run(
        ["squeue", "--noheader", "--states=all", "--format=%i|%T"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    states = dict(line.split("|") for line in listed.split())
    assert {states.get(slurm_id) for slurm_id in slurm_ids} == {"COMPLETED"}, states


def _timeless_rows(table: pd.DataFrame) -> pd.DataFrame:
    """`table` without the rows measured against a time (frontier_at_cgrpo's CPU-seconds cost): their costs and
    interpolated accuracies follow the clock."""
    if "cost" not in table:
        return table
    return table[~table["cost"].astype(str).str.contains(TIMING_COLUMN)].reset_index(drop=True)


def test_slurm_tables_equal_local_tables(runs):
    local = runs["local"][0] / "results" / "smoke" / "tables"
    slurm = runs["slurm"][0] / "results" / "smoke" / "tables"
    names = sorted(path.name for path in local.glob("*.csv"))
    assert names and names == sorted(path.name for path in slurm.glob("*.csv"))
    dropped = set()
    for name in names:
        expected, actual = (_timeless_rows(pd.read_csv(folder / name)) for folder in (local, slurm))
        assert list(actual.columns) == list(expected.columns), name
        timing = [column for column in expected.columns if TIMING_COLUMN.search(column)]
        dropped.update(timing)
        pd.testing.assert_frame_equal(
            actual.drop(columns=timing), expected.drop(columns=timing), check_exact=True, obj=name
        )
    # The pattern did find the wall-clock columns.
    assert {"train_wall_s", "total_wall_s", "eval_wall_s", "time_savings", "total_cpu_s", "cpu_time_savings"} <= dropped
