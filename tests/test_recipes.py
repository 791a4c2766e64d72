"""The recipes in docs/recipe-*.md, run as written: a stopping rule of one's own, a task of one's own, one's own model.

Each page marks its code blocks: `<!-- file: NAME -->` before a block the reader saves as NAME, `<!-- run -->` before
the shell command that runs it. The tests save the files into a folder laid out as the repository root (the
Snakefile, workflow/, config/ and resources/ linked in), run every Python file there as the reader would, and plan
the command (a dry run, in the test command); the tests marked long run the command itself, end to end, and read its
tables. The shipped tiny model stands in for the reader's own, so that nothing touches the network.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_workflow import REPO, job_counts

DOCS = REPO / "docs"
BLOCK = re.compile(
    r"^<!-- (file: (?P<name>\S+)|run) -->\n```(?P<language>\w+)\n(?P<code>.*?)^```$", re.MULTILINE | re.DOTALL
)
RECIPES = sorted(DOCS.glob("recipe-*.md"))


def marked_blocks(page: Path) -> tuple[dict[str, str], str]:
    """The files a recipe page has the reader save ({name: text}) and the one command it has them run."""
    files, commands = {}, []
    for block in BLOCK.finditer(page.read_text()):
        if block["name"]:
            files[block["name"]] = block["code"]
        else:
            commands.append(block["code"].strip())
    assert len(commands) == 1, f"{page.name} should mark one command to run, found {commands}"
    return files, commands[0]


def like_a_checkout(folder: Path, files: dict[str, str]) -> Path:
    """`folder` laid out as the repository root, with the recipe's files saved in it."""
    folder.mkdir(exist_ok=True)
    for name in ("Snakefile", "workflow", "config", "resources"):
        (folder / name).symlink_to(REPO / name)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def run(folder: Path, command: str, timeout: float) -> subprocess.CompletedProcess:
    # Offline, as every test; the shell finds the same snakemake and python as the test.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-c", command],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_every_recipe_page_is_linked_and_marks_its_files_and_command():
    assert {page.stem for page in RECIPES} == {"recipe-stopping-rule", "recipe-task", "recipe-own-model"}
    readme = (REPO / "README.md").read_text()
    for page in RECIPES:
        files, command = marked_blocks(page)
        assert files and command.startswith("snakemake "), page.name
        assert f"docs/{page.name}" in readme, page.name


@pytest.mark.slow
@pytest.mark.parametrize("page", RECIPES, ids=lambda page: page.stem)
def test_a_recipe_runs_its_python_and_plans_its_command(tmp_path, page):
    files, command = marked_blocks(page)
    folder = like_a_checkout(tmp_path / "checkout", files)
    printed = {}
    # A saved Python file that imports the recipe's module (`my_...`) is a script the reader runs; the module itself
    # is what the scripts and the config's plugins import.
    for name in files:
        if name.endswith(".py") and re.search(r"^import my_|^from my_", files[name], re.MULTILINE):
            result = run(folder, f"{sys.executable} {name}", timeout=600)
            assert result.returncode == 0, result.stdout[-3000:]
            printed[name] = result.stdout
    planned = run(folder, f"{command} -n", timeout=300)
    assert planned.returncode == 0, planned.stdout[-3000:]
    counts = job_counts(planned.stdout)
    assert counts["train_cgrpo"] >= 1 and counts["evaluate"] >= 2, counts
    # Looking writes nothing: the folder holds what the reader saved, and Snakemake's own records.
    assert not (folder / "results").exists()
    if page.stem == "recipe-stopping-rule":
        assert re.search(r"prompts per budget they stopped at: \{2: \d+", printed["train_with_lead.py"])
        assert "lead_s0_g2-4-8_t2" in planned.stdout and "lead_s0_g2-4-8_t3" in planned.stdout
    if page.stem == "recipe-task":
        assert "Question: Add " in printed["look_at_sum.py"]
        assert "reward functions: ['correctness_reward', 'format_reward']" in printed["look_at_sum.py"]


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.parametrize("page", RECIPES, ids=lambda page: page.stem)
def test_a_recipe_runs_end_to_end(tmp_path, page):
    files, command = marked_blocks(page)
    folder = like_a_checkout(tmp_path / "checkout", files)
    result = run(folder, command, timeout=1800)
    assert result.returncode == 0, result.stdout[-5000:]
    experiment = {"recipe-stopping-rule": "lead", "recipe-task": "sum", "recipe-own-model": "my_model"}[page.stem]
    tables = folder / "results" / experiment / "tables"
    summary = pd.read_csv(tables / "summary.csv")
    assert {"base", "cgrpo", "grpo"} <= set(summary["method"])
    if experiment == "lead":
        # Trained as an ablation, and replayed.
        assert set(summary.loc[summary["method"] == "lead", "run"]) == {"lead_s0_g2-4-8_t2", "lead_s0_g2-4-8_t3"}
        replayed = pd.read_csv(tables / "replay.csv")
        assert sorted(map(float, replayed.loc[replayed["rule"] == "lead", "setting"])) == [2, 3, 4]
    if experiment == "sum":
        split = (folder / "results" / "sum" / "splits" / "train.jsonl").read_text()
        assert '"question": "Add ' in split
    if experiment == "my_model":
        source = (folder / "results" / "my_model" / "base_model" / "source.json").read_text()
        assert "resources/base_model/arithmetic" in source
