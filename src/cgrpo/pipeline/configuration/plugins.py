"""Plugins: modules a workflow config lists under ``plugins``, imported so that the stopping rules they register exist.

The workflow imports them before it checks its config, and each training and replay job before it builds anything,
since every job is a fresh Python process.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from . import methods

__all__ = ["import_plugins"]


def import_plugins(modules: Iterable[str]) -> None:
    """Import each module and give every stopping rule registered by then its pipeline method."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ValueError(
                f"config key plugins lists {module!r}, which cannot be imported ({error}); install it or put its "
                "folder on PYTHONPATH."
            ) from None
    methods.add_rule_methods()
