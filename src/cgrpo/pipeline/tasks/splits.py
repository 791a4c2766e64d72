"""Train, calibration and eval splits that cannot leak into each other.

:func:`make_splits` deduplicates a task's pool by content hash (and with ``dedupe="computation"`` by what each
problem computes), carves disjoint seeded splits and writes them as ``<name>.jsonl`` with a ``manifest.json``
recording each file's checksum and each example's content hash. :func:`load_split` and :func:`load_splits` re-check
all of that on every load and raise :class:`SplitLeakError` when two splits share an example, even when they come
from different folders.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path

from datasets import Dataset

from ...support.messages import quoted
from .answers import computation_signature

MANIFEST = "manifest.json"
TRAIN = "train"
# Held out from every other split for the choices a run makes (learning rates, the best fixed G), where splits have it.
VALIDATION = "validation"
# What makes two examples one: their normalised text, or what they compute (`computation_key`); and how a pool that
# is too small for the splits is named and grown.
DEDUPE = {
    "text": ("unique examples", "enlarge the pool"),
    "computation": (
        "problems of distinct computations",
        "give the pool other computations (more problems with the same equations add none)",
    ),
}
_SHOWN_OVERLAPS = 3

logger = logging.getLogger(__name__)


class SplitLeakError(ValueError):
    """Two splits share an example (e.g. an eval question also appears in train)."""


class ManifestMismatchError(ValueError):
    """A split file no longer matches the manifest written with it."""


def normalize_text(text: str) -> str:
    """`text` NFKC-normalised, case-folded and whitespace-collapsed: what two copies of one example share."""
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def content_hash(example: Mapping[str, str]) -> str:
    """SHA-256 of the normalised (NFKC, case-folded, whitespace-collapsed) question and answer."""
    text = normalize_text(example["question"]) + "\n" + normalize_text(example["answer"])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def computation_key(example: Mapping[str, str]) -> str:
    """What ``example`` computes: a hash of its worked answer's equations (see
    :func:`~cgrpo.pipeline.tasks.answers.computation_signature`), or its content hash where the answer shows none."""
    signature = computation_signature(example["answer"])
    if signature is None:
        return content_hash(example)
    return hashlib.sha256(("computation\n" + "\n".join(signature)).encode("utf-8")).hexdigest()


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _dedupe(examples: Iterable[Mapping]) -> dict[str, dict]:
    """First occurrence of each content hash, in pool order."""
    unique: dict[str, dict] = {}
    for example in examples:
        unique.setdefault(content_hash(example), dict(example))
    return unique


def _distinct(pool: dict[str, dict], dedupe: str, taken: Iterable[str] = ()) -> tuple[dict[str, dict], int]:
    """``pool`` less every example computing what an earlier one, or one of ``taken`` (computation keys), computes,
    with ``dedupe="computation"``; and how many that left out."""
    if dedupe == "text":
        return pool, 0
    seen, kept = set(taken), {}
    for key, example in pool.items():
        computation = computation_key(example)
        if computation not in seen:
            seen.add(computation)
            kept[key] = example
    return kept, len(pool) - len(kept)


def _allocate(sizes: Mapping[str, int | None], available: int, dedupe: str = "text") -> dict[str, int]:
    """Concrete sizes; a single ``None`` takes whatever the other splits leave."""
    fixed = sum(size for size in sizes.values() if size is not None)
    rest = [name for name, size in sizes.items() if size is None]
    if any(size is not None and size < 1 for size in sizes.values()) or len(rest) > 1:
        raise ValueError(f"Split sizes {dict(sizes)} are invalid; give positive sizes and at most one None per pool.")
    if fixed > available or (rest and fixed == available):
        unique, fix = DEDUPE[dedupe]
        raise ValueError(
            f"The pool has {available} {unique} but splits {dict(sizes)} need more; lower the sizes or {fix}."
        )
    return {name: available - fixed if size is None else size for name, size in sizes.items()}


def _carve(
    pool: dict[str, dict], sizes: Mapping[str, int | None], seed: int, dedupe: str = "text"
) -> dict[str, list[dict]]:
    allocated = _allocate(sizes, len(pool), dedupe)
    examples = list(pool.values())
    random.Random(seed).shuffle(examples)
    splits, start = {}, 0
    # By name, not mapping order: a config listing the same sizes in another order gets the same splits.
    for name, size in sorted(allocated.items()):
        splits[name], start = examples[start : start + size], start + size
    return splits


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    lines = [json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows]
    path.write_text("".join(lines), encoding="utf-8")


def make_splits(
    pool: Iterable[Mapping],
    out_dir: str | Path,
    *,
    sizes: Mapping[str, int | None],
    seed: int,
    eval_pool: Iterable[Mapping] | None = None,
    drop_overlap: bool = False,
    dedupe: str = "text",
) -> Path:
    """Write disjoint splits of ``pool`` to ``out_dir`` and return the path of their manifest.

    ``sizes`` maps split names to sizes, e.g. ``{"train": 1000, "calibration": 200, "eval": 200}``;
    one size per source may be ``None`` to take the rest. With ``eval_pool`` (say GSM8K's test split)
    the ``"eval"`` split is drawn from it instead. Examples of ``pool`` that also occur in ``eval_pool`` raise
    :class:`SplitLeakError`, or with ``drop_overlap`` are left out of the other splits.
    With ``dedupe="computation"``, examples whose worked answers show the same equations (the same operations on the
    same numbers, in other words) count as one problem: each after the first is left out, within a pool and from
    ``pool`` where ``eval_pool`` holds its computation, and the manifest (``dedupe``) and the log say how many.
    Examples need ``question`` and ``answer``; other fields are kept.
    """
    if dedupe not in DEDUPE:
        raise ValueError(f"dedupe={dedupe!r} is not a way to deduplicate; use one of {', '.join(DEDUPE)}.")
    splits, removed = _carve_splits(pool, sizes, seed, eval_pool, drop_overlap, dedupe)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {"seed": seed, "splits": {}}
    if dedupe != "text":
        # Only here: a manifest of text deduplication stays what it always was, byte for byte.
        manifest["dedupe"] = {"by": dedupe, "near_duplicates_removed": removed}
        logger.info(
            "Left out %d near-duplicate(s): problems whose worked answers show the equations of a problem kept",
            removed,
        )
    for name in sizes:
        path = out_dir / f"{name}.jsonl"
        _write_jsonl(path, splits[name])
        manifest["splits"][name] = {
            "file": path.name,
            "size": len(splits[name]),
            "sha256": _file_sha256(path),
            "hashes": [content_hash(example) for example in splits[name]],
        }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return out_dir / MANIFEST


def _carve_splits(
    pool: Iterable[Mapping],
    sizes: Mapping[str, int | None],
    seed: int,
    eval_pool: Iterable[Mapping] | None,
    drop_overlap: bool,
    dedupe: str,
) -> tuple[dict[str, list[dict]], int]:
    """The splits of :func:`make_splits`, and the near-duplicates `dedupe` left out."""
    pool_sizes = {name: size for name, size in sizes.items() if eval_pool is None or name != "eval"}
    if eval_pool is None:
        unique, removed = _distinct(_dedupe(pool), dedupe)
        return _carve(unique, pool_sizes, seed, dedupe), removed
    if "eval" not in sizes:
        raise ValueError("eval_pool was given but sizes has no 'eval' entry; add one, e.g. 'eval': None.")
    evals, unique = _dedupe(eval_pool), _dedupe(pool)
    if not drop_overlap:
        _refuse_overlap(evals, unique)
    rest = {key: row for key, row in unique.items() if key not in evals}
    evals, removed = _distinct(evals, dedupe)
    rest, removed_rest = _distinct(rest, dedupe, map(computation_key, evals.values()))
    splits = _carve(evals, {"eval": sizes["eval"]}, seed, dedupe)
    splits.update(_carve(rest, pool_sizes, seed, dedupe))
    return splits, removed + removed_rest


def _refuse_overlap(evals: dict[str, dict], pool: dict[str, dict]) -> None:
    shared = [pool[key] for key in pool if key in evals]
    if shared:
        raise SplitLeakError(
            f"{len(shared)} example(s) of the eval source split also occur in the training pool (e.g. "
            f"{quoted(shared[0]['question'])}); remove them from one of the files, or set splits.drop_overlap: true "
            "to leave them out of train and calibration."
        )


def _manifest_path(path: str | Path) -> Path:
    """The manifest for a split folder, a manifest file or a split file inside a split folder."""
    path = Path(path)
    manifest = path if path.name == MANIFEST else (path if path.is_dir() else path.parent) / MANIFEST
    if not manifest.is_file():
        raise FileNotFoundError(
            f"No {MANIFEST} found at {manifest}; write the splits with cgrpo.pipeline.tasks.splits.make_splits."
        )
    return manifest


def _split_name(manifest: Path, file: Path) -> str:
    entries = json.loads(manifest.read_text())["splits"]
    for name, entry in entries.items():
        if entry["file"] == file.name:
            return name
    raise ValueError(f"{file} is not listed in {manifest}; point to a split file written by make_splits.")


def _read_verified(manifest: Path, name: str) -> tuple[list[dict], list[str]]:
    """Rows and content hashes of split ``name``, after checking them against the manifest."""
    entries = json.loads(manifest.read_text())["splits"]
    if name not in entries:
        raise ValueError(f"{manifest} has no split {name!r}; choose one of {', '.join(entries)}.")
    path = manifest.parent / entries[name]["file"]
    if _file_sha256(path) != entries[name]["sha256"]:
        raise ManifestMismatchError(
            f"{path} was modified after {manifest} was written (checksum differs); "
            "regenerate the splits with make_splits instead of editing them."
        )
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    hashes = [content_hash(row) for row in rows]
    if hashes != entries[name]["hashes"]:
        raise ManifestMismatchError(
            f"The example hashes of {path} differ from {manifest}; regenerate the splits with make_splits."
        )
    return rows, hashes


def _describe(rows: list[dict], hashes: list[str], shared: set[str]) -> str:
    shown = [f"{key[:12]} {quoted(row['question'], 40)}" for row, key in zip(rows, hashes) if key in shared]
    return "; ".join(shown[:_SHOWN_OVERLAPS]) + ("; ..." if len(shown) > _SHOWN_OVERLAPS else "")


def _check_disjoint(loaded: Mapping[str, tuple[str, list[dict], list[str]]]) -> None:
    """Raise SplitLeakError if any two loaded splits share a content hash.

    ``loaded`` maps a split's role to (where it came from, rows, hashes).
    """
    roles = list(loaded)
    for i, first in enumerate(roles):
        for second in roles[i + 1 :]:
            shared = set(loaded[first][2]) & set(loaded[second][2])
            if shared:
                source, rows, hashes = loaded[second]
                raise SplitLeakError(
                    f"Split {second!r} ({source}) shares {len(shared)} example(s) with split {first!r} "
                    f"({loaded[first][0]}): {_describe(rows, hashes, shared)}; carve all splits from one pool with "
                    "make_splits, or point to split files from the same manifest."
                )


def split_names(path: str | Path) -> list[str]:
    """The splits a split folder (or its manifest) holds, by name."""
    return list(json.loads(_manifest_path(path).read_text())["splits"])


def load_split(path: str | Path, name: str) -> Dataset:
    """Load split ``name`` from a split folder (or its manifest), refusing leaks and edited files.

    Every split of the folder is verified against the manifest, and ``name`` must share no example
    with the others (so an eval or calibration set never overlaps train).
    """
    manifest = _manifest_path(path)
    others = [other for other in json.loads(manifest.read_text())["splits"] if other != name]
    loaded = {key: (f"{manifest.parent}/{key}", *_read_verified(manifest, key)) for key in [name, *others]}
    _check_disjoint(loaded)
    return Dataset.from_list(loaded[name][1])


def load_splits(files: Mapping[str, str | Path]) -> dict[str, Dataset]:
    """Load several splits, possibly from different folders, and refuse any overlap between them.

    ``files`` maps a role (``"train"``, ``"calibration"``, ``"eval"``) to a split file such as
    ``runs/a/train.jsonl`` (its folder's manifest says which split it is) or to a split folder, in
    which case the split named like the role is taken.
    """
    loaded = {}
    for role, location in files.items():
        manifest = _manifest_path(location)
        location = Path(location)
        name = role if location.is_dir() or location.name == MANIFEST else _split_name(manifest, location)
        loaded[role] = (f"{manifest.parent}/{name}", *_read_verified(manifest, name))
    _check_disjoint(loaded)
    return {role: Dataset.from_list(rows) for role, (_, rows, _) in loaded.items()}
