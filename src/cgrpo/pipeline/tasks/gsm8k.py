"""GSM8K: grade-school math word problems, from the Hugging Face Hub cache or a local file."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from datasets import Dataset, load_dataset

from .base import REQUIRED_COLUMNS, Task
from .files import DataSource, load_split_file

HUB_ID = "openai/gsm8k"
HUB_CONFIG = "main"
# datasets builder for each supported local file extension
_LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


def load_local(source: str, split: str = "train") -> Dataset:
    """Load a GSM8K-format jsonl/json/parquet/csv file, chosen by extension."""
    return load_split_file(source, split, _LOCAL_BUILDERS, "GSM8K")


def load_hub(source: str = HUB_ID, split: str = "train", config: str = HUB_CONFIG) -> Dataset:
    """Load GSM8K from the Hub id ``source``; offline this reads the local Hugging Face cache."""
    return load_dataset(source, config, split=split)


def gsm8k_task(
    source: str = HUB_ID,
    *,
    answer_format: str = "hash",
    chat: bool = False,
    system_prompt: str | None = None,
    worked_examples: int = 0,
) -> Task:
    """GSM8K from a Hub id or a local file path (see :func:`load_local` for the file formats); ``system_prompt`` and
    ``worked_examples`` as in :class:`Task`."""
    local = Path(source).suffix in _LOCAL_BUILDERS
    loader = partial(load_local, source) if local else partial(load_hub, source)
    data = DataSource(source, local, tuple((column,) for column in REQUIRED_COLUMNS), "GSM8K")
    return Task(
        name="gsm8k",
        loader=loader,
        answer_format=answer_format,
        chat=chat,
        source=data,
        system_prompt=system_prompt,
        worked_examples=worked_examples,
    )
