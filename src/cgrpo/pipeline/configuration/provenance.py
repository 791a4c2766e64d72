"""What a results folder was made with: every job's resolved spec in a file of its own, and the experiment's config.

Snakemake reruns a job when one of its inputs is newer than its outputs. Every job that reads settings from the config
has its resolved spec in `results/<experiment>/specs/<step>/<job>.json`, an input of the job, which
:func:`planned_spec` writes while a run plans the workflow, and only when the content changed: a changed setting
then reruns exactly the jobs whose spec holds it (and, through their outputs, what depends on them), and an unchanged
config reruns nothing. Snakemake's own `params` trigger is not enough: it ignores params computed from a job's
input, and it needs the records in `.snakemake/`, which a copied or cleaned tree lacks. A command that only looks at
the plan (a dry run, `--dag`, `--summary`, `--report`) writes nothing under `results/`: a spec that changed goes to a
scratch copy outside it, which shows Snakemake the same newer input.

`results/<experiment>/config.yaml` records the resolved config that the folder's results come from
(:func:`claim_experiment_folder`): a run writes it before its first job (a command that only looks writes nothing),
and planning another config into the same folder stops, naming the keys that differ, unless `replace_results` is set.
An override that leaves `experiment` alone, or config files given in another order, then cannot replace another
experiment's results unasked.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from .checks import ConfigError

__all__ = [
    "RECORD",
    "REPLACE_KEY",
    "canonical",
    "claim_experiment_folder",
    "config_changes",
    "experiment_config",
    "planned_spec",
    "write_spec",
]

RECORD = "config.yaml"
REPLACE_KEY = "replace_results"
RECORD_HEADER = (
    "# The resolved config this folder's results come from, written by cgrpo.pipeline.configuration.provenance (docs/pipeline.md,\n"
    '# "When the config changes"). Rerun it with --configfile <this file> --replace-workflow-config.\n'
)
# The error names this many changed keys; the record holds the rest.
SHOWN_CHANGES = 3
_UNSET = object()


def canonical(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` as plain JSON values with every mapping's keys sorted.

    Equal settings then compare and print equal whatever order the config files gave their keys in.
    """
    return json.loads(_spec_text(data))


def _spec_text(data: Mapping[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def _write_atomically(path: Path, text: str) -> None:
    # A cluster job's own Snakemake process reads these files while planning: it must never see half of one.
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(text)
    os.replace(partial, path)


def write_spec(path: str | Path, spec: Mapping[str, Any]) -> str:
    """Write `spec` to `path` as JSON unless the file holds exactly that already; return `path`.

    The file's modification time moves only when the spec changes, and that is what makes Snakemake rerun the job.
    """
    path = Path(path)
    text = _spec_text(spec)
    if not (path.is_file() and path.read_text() == text):
        _write_atomically(path, text)
    return str(path)


@cache
def _scratch() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="cgrpo-planned-specs-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def planned_spec(path: str | Path, spec: Mapping[str, Any], write: bool) -> str:
    """The spec file a job's plan takes as its input: `path`, written as :func:`write_spec` does when `write` (a run).

    A command that only looks at the plan (`write` False) must leave `results/` as it found it, yet show the jobs a
    changed spec reruns: `path` when it holds `spec` already, else a scratch copy outside the working directory, whose
    fresh modification time is what Snakemake compares with the job's outputs.
    """
    if write:
        return write_spec(path, spec)
    path = Path(path)
    if path.is_file() and path.read_text() == _spec_text(spec):
        return str(path)
    return write_spec(_scratch() / path.as_posix().lstrip("/"), spec)


def experiment_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """What defines an experiment's results: `config` without `replace_results`, which says only how to plan."""
    return {key: value for key, value in canonical(config).items() if key != REPLACE_KEY}


def _show(value: Any) -> str:
    return "unset" if value is _UNSET else json.dumps(value)


def config_changes(recorded: Mapping[str, Any], config: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every key whose value differs between `recorded` and `config`, as ``"training.learning_rate: 0.0001 -> 5e-05"``
    (``unset`` for a key one side lacks), in key order."""
    changes = []
    for key in sorted(set(recorded) | set(config), key=str):
        old, new = recorded.get(key, _UNSET), config.get(key, _UNSET)
        name = f"{prefix}{key}"
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            changes += config_changes(old, new, f"{name}.")
        elif old != new:
            changes.append(f"{name}: {_show(old)} -> {_show(new)}")
    return changes


def claim_experiment_folder(
    folder: str | Path,
    config: Mapping[str, Any],
    fill_defaults: Callable[[dict[str, Any]], None] | None = None,
    record: bool = True,
) -> None:
    """Record `config` in `folder`/config.yaml as the config its results come from; raise ConfigError when the
    folder records another one and `replace_results` is not set.

    `fill_defaults` gives the recorded config, in place, the defaults of keys the schema gained since it was written,
    so that they do not count as changes. With `replace_results` set, `config` takes the folder over: its record is
    replaced, and the jobs whose specs changed rerun. `record=False` (planning, and every command that only looks)
    only checks; a run records when it starts its jobs.
    """
    folder = Path(folder)
    path = folder / RECORD
    current = experiment_config(config)
    text = RECORD_HEADER + yaml.safe_dump(current, sort_keys=False)
    if path.is_file():
        recorded = yaml.safe_load(path.read_text()) or {}
        if fill_defaults is not None:
            fill_defaults(recorded)
        changes = config_changes(experiment_config(recorded), current)
        if changes and not config.get(REPLACE_KEY):
            shown = "; ".join(changes[:SHOWN_CHANGES])
            if len(changes) > SHOWN_CHANGES:
                shown += f"; {len(changes) - SHOWN_CHANGES} more"
            raise ConfigError(
                f"{folder}/ holds the results of another config ({shown}; its whole config is in {path}): set "
                f"`experiment` to a new name to keep both, or add `--config {REPLACE_KEY}=True` to rerun in {folder}/ "
                "the jobs the change affects, replacing their results."
            )
        if path.read_text() == text:
            return
    if record:
        _write_atomically(path, text)
