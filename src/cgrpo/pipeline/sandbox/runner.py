"""Run untrusted Python programs (model completions) against a task's tests, one contained process per program.

:func:`run_tests` runs one program, :func:`run_tests_many` several in parallel (``workers`` at a time). Neither raises
for anything a program does: whatever it does, it gets a :class:`RunResult`, and only a run that returned the right
value for every test has ``passed=True``.

The parent starts a fresh ``python -I -S`` running the harness (:mod:`cgrpo.pipeline.sandbox.harness`) in a new
session and a fresh working directory, enforces the wall-clock timeout and the output cap, and judges the reported
values itself (:mod:`cgrpo.pipeline.sandbox.judging`); :mod:`cgrpo.pipeline.sandbox.host` holds the per-run cgroup and
the cleanup, :mod:`cgrpo.pipeline.sandbox.seccomp` the syscall filter. What each isolation mode (``namespaces``,
``process``) guarantees, and what it does not, is in docs/sandbox.md; the first run in a process logs the mode it got
(:func:`isolation_report` returns it).
"""

from __future__ import annotations

import ast
import json
import logging
import os
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .host import create_cgroup, hidden_paths, remove_cgroup, remove_tree
from .judging import PreparedTest, judge, prepare_tests
from .seccomp import seccomp_filter

logger = logging.getLogger(__name__)

ISOLATION_MODES = ("auto", "namespaces", "process")
# Per-run uids as root: random, far above any uid a system allocates, so that no file and no other process has them.
_UID_BASE = 0x5A000000
_UID_RANGE = 1 << 24
# Standard-library modules the harness imports before the program runs, where the program process (a uid that owns
# nothing) cannot read the standard library: the ones a model-written solution commonly imports.
PRELOADED_MODULES = (
    "math",
    "cmath",
    "re",
    "heapq",
    "collections",
    "itertools",
    "functools",
    "string",
    "bisect",
    "operator",
    "copy",
    "random",
    "typing",
    "fractions",
    "decimal",
    "statistics",
    "datetime",
    "array",
    "json",
    "hashlib",
    "struct",
    "textwrap",
    "unicodedata",
    "dataclasses",
    "enum",
    "numbers",
    "abc",
    "contextlib",
)
_SPEC_FILE = ".cgrpo-spec.json"
_OUTPUT_TAIL = 2000
_CHUNK = 65536


@dataclass(frozen=True)
class Limits:
    """Resource limits of one program run.

    ``timeout_s`` is wall clock from the interpreter's start to its result (start-up included); ``cpu_s`` defaults to
    ``timeout_s`` rounded up. ``memory_mb`` caps each process's address space and ``run_memory_mb`` the memory of
    all the run's processes together, its working directory included (where a cgroup can be made; see
    docs/sandbox.md), ``max_processes`` the processes and threads, ``max_file_mb`` the size of any file written,
    ``disk_mb`` and ``max_files`` what the working directory holds in all (namespace isolation, where it is a tmpfs),
    ``max_open_files`` the file descriptors and ``max_output_bytes`` what ``stdout`` and ``stderr`` together may print
    (a program that prints more fails).
    """

    timeout_s: float = 5.0
    cpu_s: int | None = None
    memory_mb: int = 512
    max_processes: int = 16
    max_file_mb: int = 8
    max_open_files: int = 64
    max_output_bytes: int = 1 << 20
    run_memory_mb: int = 1024
    disk_mb: int = 512
    max_files: int = 4096

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}.")
        for name in (
            "memory_mb",
            "max_processes",
            "max_file_mb",
            "max_open_files",
            "max_output_bytes",
            "run_memory_mb",
            "disk_mb",
            "max_files",
        ):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}.")
        if self.cpu_s is not None and int(self.cpu_s) < 1:
            raise ValueError(f"cpu_s must be a positive integer or None, got {self.cpu_s}.")

    @property
    def cpu_seconds(self) -> int:
        return int(self.cpu_s) if self.cpu_s is not None else max(1, int(-(-self.timeout_s // 1)))


@dataclass
class RunResult:
    """The outcome of one program run.

    ``status``: ``passed``; ``failed`` (it ran, a test failed or raised); ``no_program`` (nothing to run);
    ``syntax_error``; ``program_error`` (running the program or its setup raised); ``timeout``; ``output_limit``;
    ``no_result`` (it ended without a complete result record: ``os._exit``, a signal, the memory or CPU limit, a
    killed parent); ``sandbox_error`` (the sandbox itself failed; logged).
    """

    passed: bool
    status: str
    tests_passed: list[bool] = field(default_factory=list)
    detail: str = ""
    output: str = ""
    wall_s: float = 0.0
    isolation: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ the harness, in the sandbox
# Its source, in its own file so that it is ordinary, linted Python; passed with `-c` so that the sandbox needs no path
# into the package.
HARNESS = Path(__file__).with_name("harness.py").read_text()


# --------------------------------------------------------------------------------------------- one run, in the parent


def _records(output: bytes, token: str) -> list[dict]:
    marker, records = token.encode() + b" ", []
    for line in output.split(b"\n"):
        if line.startswith(marker):
            try:
                record = json.loads(line[len(marker) :])
            except (ValueError, RecursionError):
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


_warned = threading.Lock()
_isolation_seen: dict[str, Any] = {}


def _note_isolation(isolation: dict[str, Any]) -> None:
    if _isolation_seen or not isinstance(isolation, dict) or not isolation:
        return  # noted already, or a run that ended before its harness reported (its own warning says so)
    with _warned:
        if _isolation_seen:
            return
        _isolation_seen.update(isolation)
    if isolation.get("mode") != "namespaces" or isolation.get("notes"):
        logger.warning(
            "Code sandbox isolation: %s; %s (see docs/sandbox.md).",
            isolation.get("mode"),
            "; ".join(isolation.get("notes") or ["no notes"]),
        )
    else:
        logger.info(
            "Code sandbox isolation: namespaces, %s.",
            "per-run uid" if isolation.get("uid") else "user namespace (the caller's uid, no capabilities)",
        )


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.kill()
    except ProcessLookupError:
        pass


def _read_capped(process: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, str]:
    """Everything the sandbox prints, up to ``cap`` bytes, and why reading stopped: eof, timeout or output_limit."""
    chunks, size, fd = [], 0, process.stdout.fileno()
    os.set_blocking(fd, False)
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        exited_at = None
        while True:
            now = time.monotonic()
            if now >= deadline:
                return b"".join(chunks), "timeout"
            ready = selector.select(min(deadline - now, 0.05))
            if not ready:
                # The supervisor has exited; a process that escaped the pid namespace (process isolation) may still
                # hold the pipe: give it a moment, then stop.
                if process.poll() is not None:
                    exited_at = exited_at or now
                    if now - exited_at > 0.2:
                        return b"".join(chunks), "eof"
                continue
            try:
                data = os.read(fd, min(_CHUNK, cap + 1 - size))
            except BlockingIOError:
                continue
            if not data:
                return b"".join(chunks), "eof"
            chunks.append(data)
            size += len(data)
            if size > cap:
                return b"".join(chunks), "output_limit"


def _python() -> str:
    return getattr(sys, "_base_executable", None) or sys.executable


def _spec(
    token: str,
    program: str,
    tests: list[PreparedTest],
    setup: str,
    limits: Limits,
    isolation: str,
    workdir: str,
    cgroup: str | None,
) -> dict[str, Any]:
    uid = _UID_BASE + secrets.randbelow(_UID_RANGE) if os.geteuid() == 0 else None
    bpf = seccomp_filter()
    return {
        "token": token,
        "program": program,
        "setup": setup or "",
        "isolation": isolation,
        "uid": uid,
        "workdir": workdir,
        "hidden": hidden_paths(workdir),
        "cgroup": cgroup,
        "seccomp": bpf.hex() if bpf is not None else None,
        "tests": [[test.kind, test.source] for test in tests],
        "preload": list(PRELOADED_MODULES),
        "limits": {
            "timeout_s": float(limits.timeout_s),
            "cpu_s": limits.cpu_seconds,
            "memory_bytes": int(limits.memory_mb) << 20,
            "file_bytes": int(limits.max_file_mb) << 20,
            "open_files": int(limits.max_open_files),
            "processes": int(limits.max_processes),
            "disk_bytes": int(limits.disk_mb) << 20,
            "inodes": int(limits.max_files),
        },
    }


def _make_cgroup(token: str, limits: Limits) -> str | None:
    try:
        return create_cgroup(f"cgrpo-sandbox-{token}", int(limits.run_memory_mb) << 20, int(limits.max_processes))
    except OSError as error:
        logger.warning("Code sandbox: no memory cgroup for this run (%s); memory is bounded per process only.", error)
        return None


def _run_prepared(program: str, tests: list[PreparedTest], setup: str, limits: Limits, isolation: str) -> RunResult:
    start = time.monotonic()
    token = secrets.token_hex(16)
    workdir = tempfile.mkdtemp(prefix="cgrpo-sandbox-")
    process, cgroup = None, None
    try:
        cgroup = _make_cgroup(token, limits)
        spec = _spec(token, program, tests, setup, limits, isolation, workdir, cgroup)
        spec_path = os.path.join(workdir, _SPEC_FILE)
        with open(os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
            json.dump(spec, handle)
        if spec["uid"] is not None:
            os.chown(workdir, spec["uid"], spec["uid"])
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "HOME": workdir,
            "TMPDIR": workdir,
        }
        process = subprocess.Popen(
            [_python(), "-I", "-S", "-c", HARNESS, spec_path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        output, ended = _read_capped(process, start + limits.timeout_s, limits.max_output_bytes)
        if ended != "eof":
            _kill(process)
        try:
            process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            _kill(process)
            process.wait(timeout=5)
        return _result(output, ended, token, tests, time.monotonic() - start)
    finally:
        if process is not None:
            if process.poll() is None:
                _kill(process)
            process.stdout.close()
        if cgroup is not None:
            remove_cgroup(cgroup)
        # A failed removal is logged as an error (once) and the run's result stands: the verifier caches it, so the
        # same program does not run, and leak, again.
        remove_tree(workdir)


def _result(output: bytes, ended: str, token: str, tests: list[PreparedTest], wall_s: float) -> RunResult:
    records = _records(output, token)
    marker = token.encode()
    shown = b"\n".join(line for line in output.split(b"\n") if not line.startswith(marker)).strip(b"\n")
    tail = shown[-_OUTPUT_TAIL:].decode("utf-8", "replace")
    isolation = next((r["isolation"] for r in records if "isolation" in r), {})
    _note_isolation(isolation)
    failed = {
        "passed": False,
        "tests_passed": [False] * len(tests),
        "output": tail,
        "wall_s": wall_s,
        "isolation": isolation,
    }
    errors = [r["sandbox_error"] for r in records if "sandbox_error" in r]
    if errors:
        logger.warning("Code sandbox failed to start a program: %s", errors[0])
        return RunResult(status="sandbox_error", detail=str(errors[0]), **failed)
    if ended == "timeout":
        return RunResult(status="timeout", detail="wall-clock timeout", **failed)
    if not isolation and ended == "eof":
        # The harness reports its isolation before the program runs: this is the sandbox's failure, not the program's.
        logger.warning("Code sandbox ended before running the program; its output: %s", tail[-500:])
        return RunResult(status="sandbox_error", detail="the sandbox did not start: " + tail[-300:], **failed)
    if ended == "output_limit":
        return RunResult(status="output_limit", detail="printed more than the output cap", **failed)
    verdicts = [r for r in records if "results" in r]
    if not verdicts:
        return RunResult(status="no_result", detail="ended without a result record", **failed)
    record = verdicts[-1]
    if record.get("program_error"):
        status = "syntax_error" if record.get("syntax_error") else "program_error"
        return RunResult(status=status, detail=str(record["program_error"]), **failed)
    results = record.get("results")
    if not isinstance(results, list) or len(results) != len(tests):
        return RunResult(status="no_result", detail="incomplete result record", **failed)
    passes = [judge(test, result) for test, result in zip(tests, results)]
    errors = [str(result[1]) for result in results if isinstance(result, list) and result[:1] == ["error"]]
    failed.update(tests_passed=passes, passed=all(passes))
    return RunResult(status="passed" if all(passes) else "failed", detail="; ".join(errors)[:500], **failed)


# ------------------------------------------------------------------------------------------------------- public API
@lru_cache(maxsize=32)
def _inspect(program: str) -> tuple[str | None, bool]:
    try:
        tree = ast.parse(program, "<solution>")
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError) as error:
        return f"{type(error).__name__}: {error}", False
    return None, any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for node in tree.body)


def check_syntax(program: str) -> str | None:
    """None if ``program`` parses, else the error message (parsed in the parent; nothing is executed). Cached, so that
    the verifier's extraction and its format reward parse a long program once. :func:`run_tests` leaves the check to
    the sandbox, which compiles the program anyway (status ``syntax_error``)."""
    return _inspect(program)[0]


def defines_function(program: str) -> bool:
    """True when ``program`` parses and defines a function at its top level (cached with :func:`check_syntax`)."""
    return "def" in program and _inspect(program)[1]  # no parse at all for a long program without a def


def run_tests(
    program: str | None,
    tests: Sequence[str] | Sequence[PreparedTest],
    setup: str = "",
    limits: Limits | None = None,
    isolation: str = "auto",
) -> RunResult:
    """Run ``program`` and then ``tests`` (assert statements) in a fresh sandbox; never raises for what it does.

    ``setup`` runs before the program (MBPP's ``test_setup_code``). ``isolation`` is ``"auto"`` (namespaces where the
    platform allows, else process limits only, with a warning), ``"namespaces"`` (fail every run when they are not
    available) or ``"process"``. Invalid *tests* raise ValueError: they are the dataset's fault, not the program's.
    """
    if isolation not in ISOLATION_MODES:
        raise ValueError(f"Unknown isolation {isolation!r}; use one of {', '.join(ISOLATION_MODES)}.")
    limits = limits or Limits()
    prepared = prepare_tests(tests)
    if program is None or not str(program).strip():
        return RunResult(
            passed=False,
            status="no_program",
            tests_passed=[False] * len(prepared),
            detail="no program found in the completion",
        )
    program = str(program)
    try:
        return _run_prepared(program, prepared, setup, limits, isolation)
    except Exception as error:  # noqa: BLE001 - the sandbox's own failure is a fail, never a crash of the run
        logger.warning("Code sandbox error, counted as a failed run: %r", error)
        return RunResult(passed=False, status="sandbox_error", tests_passed=[False] * len(prepared), detail=repr(error))


def run_tests_many(
    programs: Sequence[str | None],
    tests: Sequence[str] | Sequence[PreparedTest],
    setup: str = "",
    limits: Limits | None = None,
    isolation: str = "auto",
    workers: int = 2,
) -> list[RunResult]:
    """:func:`run_tests` for each program against the same tests, ``workers`` runs at a time, results in order."""
    prepared = prepare_tests(tests)
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}.")
    if len(programs) <= 1 or workers == 1:
        return [run_tests(program, prepared, setup, limits, isolation) for program in programs]
    with ThreadPoolExecutor(max_workers=min(workers, len(programs)), thread_name_prefix="cgrpo-sandbox") as pool:
        return list(pool.map(lambda program: run_tests(program, prepared, setup, limits, isolation), programs))


def isolation_report(isolation: str = "auto") -> dict[str, Any]:
    """The isolation a run gets here: ``{"mode": "namespaces" | "process", "uid": int | None, "user_ns": bool,
    "notes": [what is not isolated]}``."""
    return run_tests("x = 1", ["assert x == 1"], limits=Limits(timeout_s=10), isolation=isolation).isolation


__all__ = [
    "HARNESS",
    "ISOLATION_MODES",
    "Limits",
    "PreparedTest",
    "RunResult",
    "check_syntax",
    "defines_function",
    "isolation_report",
    "prepare_tests",
    "run_tests",
    "run_tests_many",
]
