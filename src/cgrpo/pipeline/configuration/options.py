"""Which options a config dataclass accepts, and of which types, read from the installed sources.

The workflow config's ``training`` and ``<method>.trainer`` sections become TRL's ``GRPOConfig``, ``peft`` becomes
peft's ``LoraConfig`` and ``base_model.options`` the bootstrap's settings. A misspelt key or a string where a number
belongs (YAML reads ``1e-5`` as a string) would otherwise fail only when a job builds them, after the splits, the base
model and the calibration. Importing those classes to ask them costs seconds (they import torch), on every Snakemake
dry run and in every job; parsing the dataclasses' source with :mod:`ast` costs milliseconds and follows whatever
versions are installed.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

# Where each class is defined: (package, module file, class). Bases (GRPOConfig's TrainingArguments, and in some TRL
# versions a base config between them) are found from the imports.
GRPO_CONFIG = ("trl", "trainer/grpo_config.py", "GRPOConfig")
CGRPO_CONFIG = ("cgrpo", "config.py", "CGRPOConfig")
LORA_CONFIG = ("peft", "tuners/lora/config.py", "LoraConfig")
BOOTSTRAP_SETTINGS = ("cgrpo", "pipeline/jobs/base_model.py", "BootstrapSettings")

# Annotation names a YAML value can have, and what checks it; an annotation naming anything else (an enum, a config
# class, Any) is not checked, since such fields often take strings or dicts that the class converts.
_YAML_TYPES = {
    "bool": lambda value: isinstance(value, bool),
    "int": lambda value: isinstance(value, int) and not isinstance(value, bool),
    "float": lambda value: isinstance(value, (int, float)) and not isinstance(value, bool),
    "str": lambda value: isinstance(value, str),
    "None": lambda value: value is None,
    # YAML gives lists; defaults in the sources are sometimes tuples.
    "list": lambda value: isinstance(value, (list, tuple)),
    "List": lambda value: isinstance(value, (list, tuple)),
    "tuple": lambda value: isinstance(value, (list, tuple)),
    "dict": lambda value: isinstance(value, dict),
    "Dict": lambda value: isinstance(value, dict),
}


@dataclass(frozen=True)
class OptionType:
    """One dataclass field: its annotation as written, and the YAML types and literal values it accepts
    (``checked`` is False where the annotation names a type no YAML value has)."""

    annotation: str
    types: tuple[str, ...]
    literals: tuple[Any, ...]
    checked: bool

    def accepts(self, value: Any) -> bool:
        if not self.checked:
            return True
        return value in self.literals or any(_YAML_TYPES[name](value) for name in self.types)


def _package_dir(package: str) -> Path:
    # find_spec of a top-level package locates it without importing it.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"{package} is not installed; install the project with pip install -e .")
    return Path(spec.submodule_search_locations[0])


def _is_init_field(value: ast.expr | None) -> bool:
    # `field(init=False)` fields are computed in __post_init__ and cannot be passed.
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
        return not any(kw.arg == "init" and getattr(kw.value, "value", True) is False for kw in value.keywords)
    return True


def _default_is_none(value: ast.expr | None) -> bool:
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
        value = next((kw.value for kw in value.keywords if kw.arg == "default"), None)
    return isinstance(value, ast.Constant) and value.value is None


def _annotation(item: ast.AnnAssign) -> str:
    annotation = ast.unparse(item.annotation)
    return annotation + " | None" if _default_is_none(item.value) and "None" not in annotation else annotation


def _module_file(module: str, level: int, importer: Path) -> Path:
    """The source file of the module that ``from <dots><module> import ...`` in ``importer`` names."""
    if level:
        base = importer.parent
        for _ in range(level - 1):
            base = base.parent
        parts = module.split(".") if module else []
    else:
        package, *parts = module.split(".")
        base = _package_dir(package)
    path = base.joinpath(*parts)
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _imported_from(tree: ast.Module, name: str, path: Path) -> Path | None:
    """The file that ``path`` imports ``name`` from (anywhere in it: transformers re-exports its classes under
    ``if TYPE_CHECKING``), or None."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names):
            return _module_file(node.module or "", node.level, path)
    return None


def _find_class(path: Path, name: str) -> tuple[Path, ast.Module, ast.ClassDef]:
    """The definition of class ``name`` as seen from ``path``, following imports and re-exports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is not None:
        return path, tree, node
    source = _imported_from(tree, name, path)
    if source is None:
        raise LookupError(
            f"{path} neither defines nor imports class {name}; this TRL or transformers version is not supported."
        )
    return _find_class(source, name)


def _class_fields(path: Path, class_name: str) -> dict[str, str]:
    """Annotated init fields of the dataclass ``class_name`` (seen from ``path``) and of its bases, as ``{name:
    annotation source}``, a subclass's annotation winning; a field annotated ``bool`` whose default is None reads
    ``bool | None``."""
    path, tree, node = _find_class(path, class_name)
    fields = {
        item.target.id: _annotation(item)
        for item in node.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and _is_init_field(item.value)
    }
    for base in node.bases:
        # Bases that are neither defined nor imported here are builtins (object).
        if isinstance(base, ast.Name) and (
            _imported_from(tree, base.id, path)
            or any(isinstance(n, ast.ClassDef) and n.name == base.id for n in tree.body)
        ):
            fields = {**_class_fields(path, base.id), **fields}
    return fields


def _members(node: ast.expr) -> list[ast.expr]:
    """The alternatives of a union annotation (``A | B``, ``Optional[A]``, ``Union[A, B]``)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _members(node.left) + _members(node.right)
    if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) in ("Optional", "Union"):
        inner = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        extra = [ast.Constant(None)] if node.value.id == "Optional" else []
        return [member for element in inner for member in _members(element)] + extra
    return [node]


def option_type(annotation: str) -> OptionType:
    """What a YAML value must be for a field annotated ``annotation``."""
    types, literals, checked = [], [], True
    for member in _members(ast.parse(annotation, mode="eval").body):
        if isinstance(member, ast.Subscript) and getattr(member.value, "id", None) == "Literal":
            elements = member.slice.elts if isinstance(member.slice, ast.Tuple) else [member.slice]
            literals += [ast.literal_eval(element) for element in elements]
            continue
        base = member.value if isinstance(member, ast.Subscript) else member
        name = "None" if isinstance(base, ast.Constant) and base.value is None else getattr(base, "id", None)
        if name in _YAML_TYPES:
            types.append(name)
        else:
            checked = False
    return OptionType(annotation, tuple(types), tuple(literals), checked)


@cache
def dataclass_options(package: str, module: str, class_name: str) -> dict[str, OptionType]:
    """Every option the dataclass ``class_name`` of ``package/module`` accepts, with its type."""
    fields = _class_fields(_package_dir(package) / module, class_name)
    return {name: option_type(annotation) for name, annotation in fields.items()}


def check_options(options: Mapping[str, Any], key: str, location: tuple[str, str, str], hint: str = "") -> None:
    """Raise ValueError naming ``key.<option>`` for an option the class at ``location`` lacks or a value of the wrong
    type; ``hint`` follows the class name in the message for an unknown option."""
    known = dataclass_options(*location)
    owner = location[2]
    for name, value in options.items():
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            suggestion = f"did you mean {close[0]!r}?" if close else f"see {owner} for the options."
            raise ValueError(f"config key {key}.{name} is not an option of {owner}{hint}; {suggestion}")
        expected = known[name]
        if not expected.accepts(value):
            note = (
                " (YAML reads a number such as 1e-5 without a dot as a string: write 1.0e-5)"
                if (isinstance(value, str) and "float" in expected.types)
                else ""
            )
            raise ValueError(
                f"config key {key}.{name} is {value!r} ({type(value).__name__}), but {owner}.{name} takes "
                f"{expected.annotation}{note}; give a value of that type."
            )
