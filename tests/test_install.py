"""The install lines for GPU users (docs/clusters.md, "Installing for GPUs") and the extras they install agree with
each other: pinned versions read with `packaging`, TRL's own vLLM range read from the installed TRL's metadata."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# What vLLM's wheels require, read from their metadata on PyPI (`pip install --dry-run --no-deps --report r.json
# vllm==V`, 2026-12-05): bump this with the `vllm` extra's pin.
VLLM_REQUIRES = {"0.31.0": {"torch": SpecifierSet("==2.13.0"), "transformers": SpecifierSet(">=5.10.4,<5.18.0")}}


def pins(extra: str) -> dict[str, Version]:
    """The exact versions an extra pins, by distribution name."""
    requirements = [Requirement(line) for line in PYPROJECT["project"]["optional-dependencies"][extra]]
    exact = {}
    for requirement in requirements:
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"the {extra} extra leaves {requirement} unpinned"
        exact[requirement.name] = Version(specifier.version)
    return exact


def gpu_install_lines() -> list[str]:
    """The commands of the code block after the `gpu-install` marker in docs/clusters.md."""
    text = (REPO / "docs" / "clusters.md").read_text()
    block = text.split("<!-- gpu-install -->")[1].split("\n\n")[1]
    return [line.strip() for line in block.splitlines()]


def test_the_vllm_extra_pins_a_vllm_that_its_trl_admits():
    vllm = pins("vllm")
    assert set(vllm) == {"vllm", "trl"}
    project_trl = next(Requirement(line) for line in PYPROJECT["project"]["dependencies"] if line.startswith("trl"))
    assert vllm["trl"] in project_trl.specifier
    # The two vLLM environments share one TRL release.
    assert pins("vllm-cpu")["trl"] == vllm["trl"]
    admitted = trl_requirement("vllm", 'extra == "vllm"')
    assert vllm["vllm"] in admitted, f"TRL {vllm['trl']} admits vLLM {admitted}, not {vllm['vllm']}"


def trl_requirement(name: str, marker: str | None = None) -> SpecifierSet:
    """The pinned TRL's requirement on `name` (under `marker`, or unconditional), from the installed TRL's metadata."""
    pinned = pins("vllm")["trl"]
    if Version(importlib.metadata.version("trl")) != pinned:
        pytest.skip(f"TRL {pinned}'s metadata is needed; {importlib.metadata.version('trl')} is installed")
    requirements = [Requirement(line) for line in importlib.metadata.requires("trl")]
    return next(
        requirement.specifier
        for requirement in requirements
        if requirement.name == name and (str(requirement.marker) == marker if marker else requirement.marker is None)
    )


def test_the_gpu_install_lines_give_the_torch_and_transformers_that_vllm_needs():
    vllm = pins("vllm")["vllm"]
    needs = VLLM_REQUIRES[str(vllm)]
    lines = gpu_install_lines()
    (torch_pin,) = {match for line in lines for match in re.findall(r"torch==([\d.]+)", line)}
    assert Version(torch_pin) in needs["torch"]
    # The CPU install line of the README pins the same torch, so one torch release serves both.
    readme = (REPO / "README.md").read_text()
    assert f"torch=={torch_pin}" in readme.split("<!-- run-command -->")[1].splitlines()[1]
    assert any("--index-url https://download.pytorch.org/whl/cu13" in line for line in lines)
    assert any('pip install -e ".[vllm' in line for line in lines)
    # A transformers release that both vLLM and the pinned TRL accept exists (pip resolves one below vLLM's bound).
    both = needs["transformers"] & trl_requirement("transformers")
    assert any(Version(f"5.{minor}.0") in both for minor in range(10, 18))
