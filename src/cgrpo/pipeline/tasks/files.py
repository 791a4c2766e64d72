"""A task's local data files: one file per split (``{split}`` in the path), or one file that serves ``train``."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datasets import Dataset, load_dataset


def load_split_file(source: str, split: str, builders: Mapping[str, str], what: str) -> Dataset:
    """The rows of ``split`` from the local file ``source``, read with the datasets builder of its extension.

    ``builders`` maps the extensions a task accepts to datasets builders; ``what`` names the data in error messages.
    """
    path = _split_path(source, split, what)
    builder = builders.get(path.suffix)
    if builder is None:
        raise ValueError(f"Unsupported {what} file type {path.suffix!r}; use one of {', '.join(builders)}.")
    if not path.is_file():
        raise FileNotFoundError(f"{what} file {path} does not exist; check the task's 'source' option.")
    return load_dataset(builder, data_files=str(path), split="train")


def _split_path(source: str, split: str, what: str) -> Path:
    if "{split}" in source:
        return Path(source.format(split=split))
    if split != "train":
        raise ValueError(
            f"Local {what} file {source!r} holds one split, so split {split!r} cannot be served; "
            "put '{split}' in the path."
        )
    return Path(source)


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids reaching the Hugging Face Hub."""
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class DataSource:
    """Where a task's examples come from, checked when a workflow is planned rather than when a job reads them.

    ``location`` is a local file (``{split}`` in it for one file per split) when ``local``, else a hub id.
    ``columns`` lists the columns a row needs, each as the alternative names it may have.
    """

    location: str
    local: bool
    columns: tuple[tuple[str, ...], ...]
    what: str

    def check(self, splits: Iterable[str], offline: bool) -> None:
        """Raise ValueError naming ``task.options.source`` unless every split in ``splits`` can be read: a local file
        that exists and has the needed columns, or (offline) a hub id in the local Hugging Face cache."""
        if not self.local:
            if offline and not _in_hub_cache(self.location):
                raise ValueError(
                    f"task.options.source {self.location!r} is a hub id that is not in the local cache, and "
                    f"HF_HUB_OFFLINE is set; download it first (huggingface-cli download --repo-type dataset "
                    f"{self.location}) or point the source at a local file."
                )
            return
        for split in splits:
            path = _split_path(self.location, split, self.what)
            if not path.is_file():
                raise ValueError(f"task.options.source: {self.what} file {path} does not exist; fix the path.")
            present = _columns(path)
            missing = [" or ".join(names) for names in self.columns if not set(names) & set(present)]
            if missing:
                raise ValueError(
                    f"task.options.source: {self.what} file {path} lacks column(s) {', '.join(missing)} (it has "
                    f"{', '.join(present) or 'none'}); add them or point the source at a file in the task's format."
                )


def _in_hub_cache(hub_id: str) -> bool:
    # load_dataset offline reads either cache: the hub's download cache or datasets' own prepared-data cache.
    from datasets import config
    from huggingface_hub import constants

    return (Path(constants.HF_HUB_CACHE) / f"datasets--{hub_id.replace('/', '--')}").is_dir() or (
        Path(config.HF_DATASETS_CACHE) / hub_id.replace("/", "___")
    ).is_dir()


def _columns(path: Path) -> list[str]:
    """The column names of a local data file, read from its first row or header only."""
    if path.suffix == ".parquet":
        import pyarrow.parquet

        return list(pyarrow.parquet.read_schema(path).names)
    with path.open(encoding="utf-8") as handle:
        if path.suffix == ".csv":
            return next(csv.reader(handle), [])
        if path.suffix == ".jsonl":
            row = _first_line_row(handle)
        else:
            try:
                data = json.load(handle)
            except json.JSONDecodeError:
                # datasets' json builder reads JSON Lines under a .json name too.
                handle.seek(0)
                data = _first_line_row(handle)
            row = data[0] if isinstance(data, list) and data else data
    return sorted(row) if isinstance(row, dict) else []


def _first_line_row(handle) -> Any:
    return json.loads(next((line for line in handle if line.strip()), "{}"))
