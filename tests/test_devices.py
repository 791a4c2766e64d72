"""A GPU of its own for each GPU job of a local run (`cgrpo.pipeline.jobs.devices`, workflow/profiles/gpu-node).

No GPU here: device ids are only names to the claim, so these tests check what it does with them, in real processes
and in a real Snakemake run, and that every GPU job's script claims before anything can initialize CUDA.
"""

from __future__ import annotations

import ast
import fcntl
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from cgrpo.pipeline.jobs.devices import DEVICES_VARIABLE, LOCKS_VARIABLE, claim_devices, node_devices

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "workflow" / "profiles"

# A job that claims as the pipeline's GPU scripts do, then records what it got and when it held it.
CLAIMING_JOB = """
import json, os, sys, time

from cgrpo.pipeline.jobs.devices import claim_devices

os.environ.update(claim_devices({count}))
start = time.time()
time.sleep({hold_s})
record = {{"devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start, "end": time.time()}}
{write}
"""


def _overlaps(records: list[dict]) -> int:
    """The most records whose [start, end] intervals hold a common moment."""
    return max(sum(other["start"] <= record["start"] < other["end"] for other in records) for record in records)


def _assert_one_job_per_device(records: list[dict]) -> None:
    by_device: dict[str, list[dict]] = {}
    for record in records:
        by_device.setdefault(record["devices"], []).append(record)
    for device, held in by_device.items():
        held.sort(key=lambda record: record["start"])
        assert all(a["end"] <= b["start"] for a, b in zip(held, held[1:])), f"device {device} held twice at once"


def test_a_run_offers_the_first_devices_of_the_node():
    assert node_devices(3, None) == ["0", "1", "2"]
    # A node (or an allocation) that lists its devices offers those, UUIDs included.
    assert node_devices(2, "4, 6,7") == ["4", "6"]
    assert node_devices(1, "GPU-8f2a") == ["GPU-8f2a"]
    with pytest.raises(ValueError) as error:
        node_devices(8, "0,1,2,3")
    message = str(error.value)
    assert message.startswith("--resources gpu=8 lets 8 GPU jobs run at once, but CUDA_VISIBLE_DEVICES lists 4")
    assert message.endswith("give gpu=4, or list as many devices as gpu.") and message.count(". ") == 0


def test_concurrent_processes_hold_distinct_devices_and_wait_for_a_free_one(tmp_path):
    # Five processes, two devices: at most two hold one at a time, and the others wait for one to come free.
    env = {**os.environ, DEVICES_VARIABLE: "0,1", LOCKS_VARIABLE: str(tmp_path / "locks")}
    code = CLAIMING_JOB.format(count=1, hold_s=0.5, write="print(json.dumps(record))")
    processes = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env) for _ in range(5)
    ]
    records = [json.loads(process.communicate(timeout=60)[0]) for process in processes]
    assert all(process.returncode == 0 for process in processes)
    assert {record["devices"] for record in records} == {"0", "1"}
    _assert_one_job_per_device(records)
    assert _overlaps(records) == 2


def test_a_job_that_finds_no_free_device_says_why_in_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv(DEVICES_VARIABLE, "0,1")
    monkeypatch.setenv(LOCKS_VARIABLE, str(tmp_path))
    # Another process's locks on both devices (an open file of this test's is another holder to flock).
    held = [open(tmp_path / f"gpu-{device}.lock", "a") for device in ("0", "1")]
    for handle in held:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with pytest.raises(RuntimeError) as error:
        claim_devices(1, wait_s=0.3)
    message = str(error.value)
    assert message.startswith("This job waited 0.3 s in vain for 1 free GPU(s) among 0,1")
    assert message.endswith("give each run on this node devices of its own (CUDA_VISIBLE_DEVICES).")
    assert message.count(". ") == 0
    for handle in held:
        handle.close()


def test_a_job_without_a_gpu_or_a_run_without_devices_claims_nothing(monkeypatch):
    monkeypatch.delenv(DEVICES_VARIABLE, raising=False)
    assert claim_devices(1) == {}
    monkeypatch.setenv(DEVICES_VARIABLE, "0")
    assert claim_devices(0) == {}


SNAKEFILE = """
from cgrpo.pipeline.jobs.devices import offer_devices


onstart:
    offer_devices(workflow)


rule all:
    input:
        expand("out/train_{i}.json", i=range(6)),
        "out/split.json",


# Named as the pipeline's GPU rule, so that the profile's set-resources give it one `gpu`.
rule train:
    output:
        "out/train_{i}.json",
    script:
        "job.py"


rule split:
    output:
        "out/split.json",
    script:
        "job.py"
"""


def test_a_snakemake_run_on_the_gpu_node_profile_gives_concurrent_jobs_distinct_devices(tmp_path):
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    write = "json.dump(record, open(snakemake.output[0], 'w'))"
    (tmp_path / "job.py").write_text(
        CLAIMING_JOB.format(count='snakemake.resources.get("gpu", 0)', hold_s=1.0, write=write)
    )
    # A node whose scheduler or user listed three devices: the run hands out those three.
    env = {key: value for key, value in os.environ.items() if key not in (DEVICES_VARIABLE, LOCKS_VARIABLE)}
    env["CUDA_VISIBLE_DEVICES"] = "5,6,7"
    command = [sys.executable, "-m", "snakemake", "--workflow-profile", str(PROFILES / "gpu-node")]
    # The profile's threads per GPU job (4) for three jobs at once, on a machine that has three GPUs.
    result = subprocess.run(
        [*command, "--directory", str(tmp_path), "--cores", "12", "--resources", "gpu=3"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:]
    records = [json.loads((tmp_path / "out" / f"train_{i}.json").read_text()) for i in range(6)]
    assert {record["devices"] for record in records} <= {"5", "6", "7"}
    _assert_one_job_per_device(records)
    # Jobs did run side by side (or distinct devices would prove nothing), never more than `gpu` of them.
    assert 2 <= _overlaps(records) <= 3
    # A job without `gpu` claims nothing and sees the node's devices as it found them.
    assert json.loads((tmp_path / "out" / "split.json").read_text())["devices"] == "5,6,7"
    # One lock file per device claimed, in the run's .snakemake folder.
    locks = {path.name for path in (tmp_path / ".snakemake" / "gpu_slots").iterdir()}
    assert locks == {f"gpu-{record['devices']}.lock" for record in records}


def _rule_scripts() -> dict[str, str]:
    """Every rule of the workflow with the script it runs."""
    found = {}
    for path in (REPO / "workflow" / "rules").glob("*.smk"):
        for rule, body in re.findall(r"^(?:rule|checkpoint) (\w+):\n(.*?)(?=^\S|\Z)", path.read_text(), re.M | re.S):
            script = re.search(r"script:\s*\n\s*\"\.\./scripts/(\w+\.py)\"", body)
            if script:
                found[rule] = script.group(1)
    return found


def test_the_gpu_node_profile_gives_every_job_that_loads_a_model_one_gpu():
    node = yaml.safe_load((PROFILES / "gpu-node" / "config.yaml").read_text())
    one_gpu = yaml.safe_load((PROFILES / "gpu" / "config.yaml").read_text())
    gpu_rules = {rule for rule, resources in node["set-resources"].items() if resources.get("gpu")}
    # The one-GPU profile's rules, and the learning curves' sampling, which loads every milestone model.
    assert gpu_rules == set(one_gpu["set-resources"]) | {"curve"}
    assert all(node["set-resources"][rule]["gpu"] == 1 for rule in gpu_rules)
    (count,) = [int(item.split("=")[1]) for item in node["resources"] if item.startswith("gpu=")]
    assert count > 1
    # As many GPU jobs as GPUs fit in the cores, with cores to spare for the jobs without a model.
    assert count * max(node["set-threads"][rule] for rule in gpu_rules) < node["cores"]


@pytest.mark.parametrize("script", sorted({"train.py", "calibrate.py", "evaluate.py", "format_rate.py", "curve.py"}))
def test_every_gpu_job_claims_its_device_before_any_other_import(script):
    tree = ast.parse((REPO / "workflow" / "scripts" / script).read_text())
    body = [node for node in tree.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    claim = next(index for index, node in enumerate(body) if "claim_devices(snakemake.resources" in ast.unparse(node))
    before = [ast.unparse(node) for node in body[:claim]]
    # Only the interrupt handler, which imports nothing heavy, comes first (tests/test_interrupts.py).
    assert before == [
        "from cgrpo.pipeline.interrupts import report_interrupts",
        "report_interrupts(snakemake)",
        "import os",
        "from cgrpo.pipeline.jobs.devices import claim_devices, log_claim",
    ]
    assert ast.unparse(body[claim]) == "os.environ.update(claim_devices(snakemake.resources.get('gpu', 0)))"
    # The claim goes into the job's log once the log is set up.
    calls = [ast.unparse(node) for node in body if isinstance(node, ast.Expr)]
    assert calls.index("log_claim()") == next(i for i, call in enumerate(calls) if call.startswith("log_to_file")) + 1


def test_the_gpu_scripts_are_the_rules_that_hold_a_gpu():
    node = yaml.safe_load((PROFILES / "gpu-node" / "config.yaml").read_text())
    scripts = _rule_scripts()
    assert {scripts[rule] for rule in node["set-resources"]} == {
        "train.py",
        "calibrate.py",
        "evaluate.py",
        "format_rate.py",
        "curve.py",
    }
    claiming = {
        path.name for path in (REPO / "workflow" / "scripts").glob("*.py") if "claim_devices" in path.read_text()
    }
    assert claiming == {scripts[rule] for rule in node["set-resources"]}


def test_the_workflow_offers_devices_as_it_starts():
    common = (REPO / "workflow" / "rules" / "common.smk").read_text()
    onstart = textwrap.dedent(common.split("\nonstart:\n")[1].split("\n\n\n")[0])
    assert "offer_devices(workflow)" in onstart
