"""The layout: the trainer library stands apart from the experiment pipeline built on it, the pipeline's rooms import
one way, no import circle, and no module or folder too large to read."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


def test_importing_the_trainer_loads_no_pipeline_module_snakemake_or_matplotlib():
    code = (
        "import sys\n"
        "from cgrpo import CGRPOConfig, CGRPOTrainer\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('snakemake', 'matplotlib') or m.startswith('cgrpo.pipeline')]\n"
        "print(sorted(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


PACKAGE = Path(__file__).resolve().parents[1] / "src" / "cgrpo"
# The pipeline's rooms in import order: each may import the library and the rooms before it, never one after it.
PIPELINE_ROOMS = ("sandbox", "tasks", "metrics", "configuration", "jobs", "analysis", "planning")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every project module and the project modules it imports (at any depth of the file, lazy imports included)."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                found.add(module)
                found.update(f"{module}.{alias.name}" for alias in node.names)
        graph[name] = {module for module in found if module in paths and module != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph`, or None."""
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return trail[trail.index(target) :] + [target]
            if target not in state and (found := visit(target, [*trail, target])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node])):
            return found
    return None


def test_no_import_circle_among_the_project_modules():
    assert _cycle(_imports()) is None


def test_the_circle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def _room(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "pipeline" and parts[2] in PIPELINE_ROOMS else None


def test_pipeline_rooms_import_one_way_and_the_library_never_imports_the_pipeline():
    wrong = []
    for module, targets in _imports().items():
        for target in targets:
            if not module.startswith("cgrpo.pipeline") and target.startswith("cgrpo.pipeline"):
                wrong.append(f"{module} -> {target}")
            source_room, target_room = _room(module), _room(target)
            if source_room and target_room and PIPELINE_ROOMS.index(target_room) > PIPELINE_ROOMS.index(source_room):
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_every_pipeline_folder_is_a_room_of_the_map():
    folders = {path.name for path in (PACKAGE / "pipeline").iterdir() if (path / "__init__.py").is_file()}
    assert folders == set(PIPELINE_ROOMS)


def test_no_module_over_550_lines_and_no_folder_over_15_modules():
    long = {
        str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 550
    }
    crowded = {
        str(folder.relative_to(PACKAGE)): n
        for folder in [PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").is_file())]
        if (n := len(list(folder.glob("*.py")))) > 15
    }
    assert (long, crowded) == ({}, {})


def test_the_public_names_import_from_where_the_readme_says():
    code = (
        "import cgrpo, cgrpo.stopping\n"
        "from cgrpo import CGRPOConfig, CGRPOTrainer, DynamicSamplingConfig, DynamicSamplingGRPOTrainer\n"
        "from cgrpo.stopping import StoppingRule, register, rule_names\n"
        "print(CGRPOTrainer.__module__, DynamicSamplingGRPOTrainer.__module__, sorted(rule_names())[:1])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[:2] == ["cgrpo.trainer", "cgrpo.dapo.trainer"]
