"""Plugins: modules a workflow config lists under ``plugins``, imported so that the stopping rules and tasks they
register exist.

An entry is a module name on the Python path (``my_package.rules``) or the path of a ``.py`` file, relative to the
working directory (``my_rules.py``). The workflow imports them before it checks its config, and every job that builds a
task, a trainer or a table does so again before it starts, since every job is a fresh Python process.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path

from . import allocator_methods, methods

__all__ = ["import_plugins"]


def import_plugins(modules: Iterable[str]) -> None:
    """Import each module (a name, or a ``.py`` file's path) and give every stopping rule and prompt allocator
    registered by then its pipeline method."""
    for module in modules:
        try:
            _import(module)
        except ImportError as error:
            raise ValueError(
                f"config key plugins lists {module!r}, which cannot be imported ({error}); install it, put its "
                "folder on PYTHONPATH, or give the path of its .py file."
            ) from None
    methods.add_rule_methods()
    allocator_methods.add_allocator_methods()


def _import(module: str) -> None:
    if not module.endswith(".py"):
        importlib.import_module(module)
        return
    path = Path(module).resolve()
    # Under its file's name, once per process: a second import would register its rules and tasks again.
    name = f"cgrpo_plugin_{path.stem}"
    loaded = sys.modules.get(name)
    if loaded is not None and Path(loaded.__file__) == path:
        return
    if not path.is_file():
        raise ImportError(f"no file {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    plugin = importlib.util.module_from_spec(spec)
    sys.modules[name] = plugin
    try:
        spec.loader.exec_module(plugin)
    except BaseException:
        del sys.modules[name]
        raise
