"""GSM8K: grade-school math word problems, from the Hugging Face Hub cache or a local file."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from datasets import Dataset, load_dataset

from .base import Task

HUB_ID = "openai/gsm8k"
HUB_CONFIG = "main"
# datasets builder for each supported local file extension
_LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def _local_path(source: str, split: str) -> Path:
    """The file that holds ``split``: ``source`` with ``{split}`` filled in, if it has the placeholder."""
    if "{split}" in source:
        return Path(source.format(split=split))
    if split != "train":
        raise ValueError(
            f"Local GSM8K file {source!r} holds one split, so split {split!r} cannot be served; "
            "put '{split}' in the path or make a separate task for that file."
        )
    return Path(source)


def load_local(source: str, split: str = "train") -> Dataset:
    """Load a GSM8K-format jsonl/json/parquet/csv file, chosen by extension."""
    path = _local_path(source, split)
    builder = _LOCAL_BUILDERS.get(path.suffix)
    if builder is None:
        raise ValueError(f"Unsupported GSM8K file type {path.suffix!r}; use one of {', '.join(_LOCAL_BUILDERS)}.")
    if not path.is_file():
        raise FileNotFoundError(f"GSM8K file {path} does not exist; check the task's 'source' option.")
    return load_dataset(builder, data_files=str(path), split="train")


def load_hub(source: str = HUB_ID, split: str = "train", config: str = HUB_CONFIG) -> Dataset:
    """Load GSM8K from the Hub id ``source``; offline this reads the local Hugging Face cache."""
    return load_dataset(source, config, split=split)


def gsm8k_task(source: str = HUB_ID, *, answer_format: str = "hash", chat: bool = False) -> Task:
    """GSM8K from a Hub id or a local file path (see :func:`load_local` for the file formats)."""
    loader = partial(load_local, source) if Path(source).suffix in _LOCAL_BUILDERS else partial(load_hub, source)
    return Task(name="gsm8k", loader=loader, answer_format=answer_format, chat=chat)
