"""The deprecation warnings about names TRL uses on its own, which a user of the project's trainers cannot act on.

transformers 5 renamed gradient checkpointing to activation checkpointing and warns (FutureWarning) about the old
names, which TRL still uses: its configs default to `gradient_checkpointing=True`, and its generation context calls
`is_gradient_checkpointing`, `gradient_checkpointing_disable` and `gradient_checkpointing_enable`. Code that passes
neither name would print four warnings about TRL, not about itself, so the configs and trainers silence exactly these
around TRL's calls.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["TRL_RENAME_WARNING", "quiet_trl_renames"]

TRL_RENAME_WARNING = r"`(is_)?gradient_checkpointing\w*` is deprecated"


@contextmanager
def quiet_trl_renames() -> Iterator[None]:
    """Ignore :data:`TRL_RENAME_WARNING` inside the block, and only it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=TRL_RENAME_WARNING, category=FutureWarning)
        yield
