"""A config the schema refuses, in one sentence: the key, what it must be, and the likely fix.

Snakemake's `validate` reports jsonschema's error with the whole failing schema and instance, hundreds to thousands of
lines with the useful one among the first. :func:`explain` turns that error into a sentence naming the config key:
the nearest real key for an unknown one (the library's own names mapped to the pipeline's), the range or choices of a
bad value, and a hint for the two YAML spellings that most often make one (``1e-5``, which YAML reads as a string, and
a flat budget grid).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from jsonschema import ValidationError
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from .checks import ConfigError
from .options import GRPO_CONFIG, dataclass_options

__all__ = ["LIBRARY_NAMES", "describe", "explain", "validate_config"]

# The library's option names (CGRPOConfig's) where the pipeline's key differs: the pipeline takes a list of values,
# one run per value, or keeps the option in a section of its own.
LIBRARY_NAMES = {
    "budget_grid": "cgrpo.budget_grids",
    "conformal_delta": "cgrpo.deltas",
    "delta": "cgrpo.deltas",
    "stopping_rule": "cgrpo.ablations.rules",
    "stop_share": "cgrpo.ablations.stop_share",
}
# A number YAML 1.1 reads as a string: an exponent without a dot in the mantissa ("1e-5").
_STRING_NUMBER = re.compile(r"([+-]?\d+)([eE][+-]?\d+)")
_NOUNS = {
    "integer": ("an integer", "integers"),
    "number": ("a number", "numbers"),
    "string": ("a string", "strings"),
    "boolean": ("true or false", "true or false values"),
    "array": ("a list", "lists"),
    "object": ("a mapping", "mappings"),
    "null": ("null", "nulls"),
}


@cache
def _schema(path: str) -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text())


def _resolved(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    # The workflow's schema refers only to its own $defs ("#/$defs/<name>"); the keys beside a $ref add to it.
    while "$ref" in schema:
        target = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        schema = {**target, **{key: value for key, value in schema.items() if key != "$ref"}}
    return schema


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _given(value: Any) -> str:
    # The value as the config gave it, quoted when a string, cut short when long.
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: float) -> str:
    return f"{value:g}"


def _bounds(schema: Mapping[str, Any]) -> str:
    low, high = (
        schema.get("exclusiveMinimum", schema.get("minimum")),
        schema.get("exclusiveMaximum", schema.get("maximum")),
    )
    if low is not None and high is not None:
        left = "(" if "exclusiveMinimum" in schema else "["
        right = ")" if "exclusiveMaximum" in schema else "]"
        return f" in {left}{_number(low)}, {_number(high)}{right}"
    if low is not None:
        return f" above {_number(low)}" if "exclusiveMinimum" in schema else f" of at least {_number(low)}"
    if high is not None:
        return f" below {_number(high)}" if "exclusiveMaximum" in schema else f" of at most {_number(high)}"
    return ""


def _typed(name: str, schema: Mapping[str, Any], root: Mapping[str, Any], plural: bool) -> str:
    noun = _NOUNS[name][plural]
    if name in ("integer", "number"):
        return noun + _bounds(schema)
    if name == "string" and "pattern" in schema:
        return f"{noun} matching {schema['pattern']}"
    if name == "array" and "items" in schema:
        return f"{noun} of {describe(schema['items'], root, plural=True)}"
    return noun


def describe(schema: Mapping[str, Any], root: Mapping[str, Any], plural: bool = False) -> str:
    """What a value valid under `schema` is, in words: ``a number in (0, 1) or auto``, ``lists of integers of at least
    1`` (`plural`)."""
    schema = _resolved(schema, root)
    for alternatives in ("anyOf", "oneOf"):
        if alternatives in schema:
            return " or ".join(describe(part, root, plural) for part in schema[alternatives])
    if "const" in schema:
        return _show(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(_show(value) for value in schema["enum"])
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    return " or ".join(_typed(name, schema, root, plural) for name in types) or "what its description says"


def _key(path: Iterable[Any]) -> str:
    key = ""
    for part in path:
        key += f"[{part}]" if isinstance(part, int) else f".{part}" if key else str(part)
    return key


def _schema_keys(schema: Mapping[str, Any], root: Mapping[str, Any], prefix: str = "") -> dict[str, list[str]]:
    """Every key the schema names, as {name: [dotted paths]}, shallowest first."""
    schema = _resolved(schema, root)
    found: dict[str, list[str]] = {}
    for name, child in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        found.setdefault(name, []).append(path)
        for inner, paths in _schema_keys(child, root, f"{path}.").items():
            found.setdefault(inner, []).extend(paths)
    return {name: sorted(paths, key=lambda path: path.count(".")) for name, paths in found.items()}


def _suggestion(name: str, where: str, allowed: Sequence[str], root: Mapping[str, Any]) -> str:
    if name in LIBRARY_NAMES and LIBRARY_NAMES[name] != f"{where}.{name}":
        return f"; the library's option {name} is the pipeline's {LIBRARY_NAMES[name]}, a list of values, one run each"
    close = difflib.get_close_matches(name, allowed, n=1)
    if close:
        return f"; did you mean {f'{where}.' if where else ''}{close[0]}?"
    elsewhere = _schema_keys(root, root).get(name)
    if elsewhere:
        return f"; it belongs under {elsewhere[0].rpartition('.')[0] or 'the top level'} ({elsewhere[0]})"
    if name in dataclass_options(*GRPO_CONFIG):
        return f"; {name} is a GRPOConfig option: set it under training (every method) or a method's trainer"
    return f"; the keys of {where or 'the config'} are {', '.join(allowed)}"


def _unknown_key(error, root: Mapping[str, Any]) -> str:
    allowed = list(_resolved(error.schema, root).get("properties", {}))
    name = sorted(set(error.instance) - set(allowed), key=str)[0]
    where = _key(error.absolute_path)
    full = f"{where}.{name}" if where else name
    return _sentence(
        f"config key {full} is not a key of {where or 'the config'}{_suggestion(str(name), where, allowed, root)}"
    )


def _sentence(text: str) -> str:
    return text if text.endswith("?") else text + "."


def _value_at(config: Any, path: Sequence[Any]) -> Any:
    for part in path:
        config = config[part]
    return config


def _hint(error, config: Mapping[str, Any], expected: str) -> str:
    value, path = error.instance, list(error.absolute_path)
    if error.validator == "enum" and isinstance(value, str):
        close = difflib.get_close_matches(value, [str(choice) for choice in error.validator_value], n=1)
        return f"; did you mean {close[0]}?" if close else ""
    spelled = _STRING_NUMBER.fullmatch(value) if isinstance(value, str) else None
    if spelled and ("number" in expected or "integer" in expected):
        return f" (YAML reads {value}, without a dot, as a string: write {spelled[1]}.0{spelled[2]})"
    parent = _value_at(config, path[:-1]) if path and isinstance(path[-1], int) else None
    if expected.startswith("a list") and isinstance(parent, list) and not any(isinstance(v, list) for v in parent):
        return f" (a list of lists: write {json.dumps([parent])} for one)"
    return ""


def explain(error, config: Mapping[str, Any], schema_path: str | Path) -> str:
    """One sentence, naming the config key, for jsonschema's `error` on `config` against the schema at `schema_path`."""
    root = _schema(str(schema_path))
    if error.validator == "additionalProperties":
        return _unknown_key(error, root)
    key = _key(error.absolute_path)
    if error.validator == "required":
        missing = next(name for name in error.validator_value if name not in error.instance)
        child = _resolved(error.schema, root).get("properties", {}).get(missing, {})
        where = f"{key}.{missing}" if key else missing
        return f"config key {where} is missing: give it {describe(child, root)}."
    if error.validator == "uniqueItems":
        return f"config key {key} lists a value twice ({_given(error.instance)}); give each value once."
    if error.validator in ("minItems", "maxItems"):
        bound = "at least" if error.validator == "minItems" else "at most"
        return (
            f"config key {key} is {_given(error.instance)}, but it must list {bound} {error.validator_value} value(s)."
        )
    expected = describe(error.schema, root)
    return _sentence(
        f"config key {key} is {_given(error.instance)}, but it must be {expected}{_hint(error, config, expected)}"
    )


def validate_config(config: dict[str, Any], schema_path: str | Path) -> None:
    """Validate `config` with Snakemake's `validate` (which fills in the schema's defaults); raise ConfigError with
    one sentence (:func:`explain`) for a config the schema refuses."""
    try:
        validate(config, schema=str(schema_path))
    except WorkflowError as error:
        if not isinstance(error.__context__, ValidationError):
            raise
        raise ConfigError(explain(error.__context__, config, schema_path)) from None
