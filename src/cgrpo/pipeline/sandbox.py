"""Run untrusted Python programs (model completions) against a task's tests, one contained process per program.

:func:`run_tests` runs one program, :func:`run_tests_many` several in parallel (``workers`` at a time). Neither raises
for anything a program does: whatever it does, it gets a :class:`RunResult`, and only a run that returned the right
value for every test has ``passed=True``.

How a run is contained
----------------------
Each run starts a fresh interpreter (``python -I -S``: no site-packages, no ``PYTHON*`` variables, no user site) in a
new session, with ``stdin`` from ``/dev/null``, ``stdout`` and ``stderr`` on one pipe, a fresh ``tempfile.mkdtemp()``
as its working directory (removed afterwards) and an environment holding only ``PATH``, ``LANG``, ``LC_ALL``, ``HOME``
and ``TMPDIR`` (the last two point at the working directory): nothing of the parent's environment is passed on.
Inside, the harness (:data:`HARNESS`) builds three processes:

* the *supervisor*, which reads the run's spec from a file in the working directory, deletes it, enters new
  namespaces (below), and kills everything when its own wall-clock alarm (``timeout_s + 1``) fires, should the parent
  have died;
* the *reaper*, pid 1 of the new pid namespace, which sets up the filesystem view and waits for the program: when it
  exits, the kernel kills every process left in the namespace (daemons, fork-bomb children, ``setsid`` escapees);
* the *program* process, which sets the resource limits, drops privileges, runs the program, then the tests, and
  writes the result record.

The parent enforces the wall-clock timeout (``timeout_s``, interpreter start-up included) and the output cap
(``max_output_bytes``, reading in chunks, never more than the cap): past either it kills the supervisor's process
group with SIGKILL, which takes the reaper and with it the whole pid namespace.

Limits set in the program process (``setrlimit``): ``RLIMIT_CPU`` (``cpu_s``, soft = hard, so the kernel sends
SIGKILL), ``RLIMIT_AS`` (``memory_mb``), ``RLIMIT_NPROC`` (``max_processes``), ``RLIMIT_FSIZE`` (``max_file_mb``),
``RLIMIT_NOFILE`` (``max_open_files``) and ``RLIMIT_CORE`` 0. ``PR_SET_NO_NEW_PRIVS`` is set and the capability
bounding set emptied, so no set-user-id binary or file capability gives privileges back.

What is isolated depends on the platform; the first run in a process logs the mode it got, and a warning when it is
not ``namespaces`` (:func:`isolation_report` returns it):

``namespaces`` (root, or a user with unprivileged user namespaces; measured on Debian 12, kernel 6.x, as root)
    New network, mount, pid, IPC and UTS namespaces (a new user namespace too when not root). The network namespace
    has only a loopback interface, and it is down: no socket reaches anything, not even the parent's ``127.0.0.1``
    listeners or abstract Unix sockets. In the pid namespace the program sees only its own processes (``/proc`` is
    remounted), so it cannot signal the parent, read its ``/proc/<pid>/environ`` or outlive the run. The filesystem:
    ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run`` are empty read-only tmpfs, as are the parent's working
    directory, ``$HOME``, ``/root`` and ``/home`` (where a dataset, a checkout or a token would be) unless one of
    them holds the working directory; the standard library is bind-mounted read-only under ``/tmp/.cgrpo-lib``; the
    working directory is the only writable place for root's run (below); with a user namespace the program can also
    write what the caller owns outside those directories. As root, the program runs under a fresh random uid/gid (no
    supplementary groups) that owns nothing outside its working directory: every root-owned file is read-only to
    it, and ``RLIMIT_NPROC``, which counts processes per real uid and does not bind root, counts this run's processes
    only. With a user namespace instead, the program keeps the caller's uid mapped to uid 0 inside, without
    capabilities; ``RLIMIT_NPROC`` then counts the processes of the namespace.
``process`` (no namespaces: containers without ``CAP_SYS_ADMIN`` and without user namespaces)
    Only the limits, the fresh environment and working directory, the separate session, the supervisor as child
    subreaper (orphans are reaped), and, as root, the random uid (and a kill of every process of that uid
    afterwards). NOT isolated: the network, writes wherever the user may write (``/tmp`` included), reading whatever
    the user may read, and, when not root, signals to every process of the same user (a program can kill the trainer
    with ``os.kill(-1, 9)``) and processes that call ``setsid`` (they outlive the run until their CPU limit).
    ``RLIMIT_NPROC`` then allows the user's current number of tasks plus ``max_processes``. As root with a standard
    library the random uid cannot read (a Python under ``/root``), common modules are imported before the program
    runs and others fail to import.

Not isolated in any mode: reading world-readable files outside the hidden directories (system files, a dataset kept
elsewhere than under the working directory or home), CPU time and memory bandwidth shared with the parent (two
workers by default), and the kernel itself (no seccomp filter): this is a process sandbox for model completions,
not a boundary against an attacker with a kernel exploit.

Why a program cannot forge a pass
---------------------------------
Everything inside the program's interpreter is the program's to change: it can call ``os._exit(0)``, patch
``builtins``, replace ``sys.exit`` or the harness's own functions, return an object whose ``__eq__`` always says
True, or print anything it likes. So the verdict is never taken from inside the sandbox. Tests are split in the
parent (:func:`prepare_tests`): for ``assert <expr> == <literal>`` (and the other comparisons, ``is``/``is not`` only
with None/True/False), ``assert math.isclose(<expr>, <number>, ...)``, ``assert <call>`` and ``assert not <expr>``
only ``<expr>`` is sent to the sandbox; the expected value stays in the parent. The harness reports each expression's
value as plain data (None, bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset), read through the
base types' own methods saved before the program ran, so a subclass's ``__eq__``, ``__iter__`` or ``__repr__`` is
never consulted and any other object fails the test; the parent decodes the data and compares it with the expected
value itself. The record is framed by a random token per run, but the token is framing, not the defence: a program
that finds it, prints a forged record and exits still has to supply the right values, which it can only get by
computing them (or by reading the dataset, where it is not hidden), and a missing or malformed record, a missing
test, or a record cut by the output cap is a fail. Tests of any other form (``assert f(1) < f(2)``, ``assert a and b``,
several statements) run whole in the sandbox, and a program that patches what they call or returns objects with lying
comparison methods can pass them. So can a program that patches the harness or forges the record against a value
expression that computes more than its function's result on literals (``assert abs(f(1) - 3.14) < 0.001``,
``assert check(f(2))``): the value it reports need not be its answer. :class:`PreparedTest` ``.tamper_proof`` is True
only for ``<name>(<literals>)`` compared in the parent. Tests are evaluated with the builtins saved before the program
ran and with the setup code run again over the program's names, so that simply patching ``builtins.abs`` or
redefining a setup helper passes neither of the two above. The generated code task only writes tamper-proof tests;
MBPP's ``assert f(<literals>) == <literal>`` tests are too.

Per-program overhead on the 2-core development machine (Debian 12, root, namespaces): 25-50 ms for a trivial program
run alone (``python -I -S`` start-up, the namespaces, two forks and the mounts), about 28 ms per program with two
workers; ``tests/test_sandbox.py::test_overhead_is_modest`` prints it (``pytest -s``).
"""

from __future__ import annotations

import ast
import json
import logging
import math
import operator
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ISOLATION_MODES = ("auto", "namespaces", "process")
# Per-run uids as root: random, far above any uid a system allocates, so that no file and no other process has them.
_UID_BASE = 0x5A000000
_UID_RANGE = 1 << 24
_SPEC_FILE = ".cgrpo-spec.json"
_OUTPUT_TAIL = 2000
_CHUNK = 65536


@dataclass(frozen=True)
class Limits:
    """Resource limits of one program run.

    ``timeout_s`` is wall clock from the interpreter's start to its result (start-up included); ``cpu_s`` defaults to
    ``timeout_s`` rounded up. ``memory_mb`` caps the address space, ``max_processes`` the processes and threads,
    ``max_file_mb`` the size of any file written, ``max_open_files`` the file descriptors and ``max_output_bytes`` what
    ``stdout`` and ``stderr`` together may print (a program that prints more fails).
    """

    timeout_s: float = 5.0
    cpu_s: int | None = None
    memory_mb: int = 512
    max_processes: int = 16
    max_file_mb: int = 8
    max_open_files: int = 64
    max_output_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s}.")
        for name in ("memory_mb", "max_processes", "max_file_mb", "max_open_files", "max_output_bytes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}.")
        if self.cpu_s is not None and int(self.cpu_s) < 1:
            raise ValueError(f"cpu_s must be a positive integer or None, got {self.cpu_s}.")

    @property
    def cpu_seconds(self) -> int:
        return int(self.cpu_s) if self.cpu_s is not None else max(1, int(-(-self.timeout_s // 1)))


@dataclass(frozen=True)
class PreparedTest:
    """One test, split for the sandbox.

    ``kind`` is ``"value"`` (the sandbox evaluates ``source`` and reports its value as plain data; the parent applies
    ``op`` to it and ``expected``: ``expected OP value`` when ``literal_first``, else ``value OP expected``; ``op`` is
    a comparison, ``isclose`` with ``options`` as keyword arguments, ``truthy`` or ``falsy``), ``"truth"`` (the sandbox
    evaluates the assert's whole condition ``source``; it passes if truthy) or ``"stmt"`` (the sandbox executes
    ``source``; it passes if nothing raises).
    """

    kind: str
    source: str
    op: str = ""
    expected: Any = None
    literal_first: bool = False
    options: tuple = ()

    @property
    def tamper_proof(self) -> bool:
        """True when the sandbox computes nothing but a call of the program's function on literal arguments and the
        parent judges the value: whatever the program patches, the value it reports is its own answer to that call.
        A value expression that computes more (``abs(f(1) - 3.14)``, ``check(f(2))``, ``set(f(x))``) also uses
        objects the program can replace, so it is not."""
        return self.kind == "value" and _is_call_on_literals(self.source)


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


# ----------------------------------------------------------------------------------------------- tests, in the parent
class _NotLiteral(Exception):
    pass


# Calls allowed in an expected value, evaluated in the parent on literal arguments: set((4, 5)), float("inf"), ...
_LITERAL_CALLS = {"set": set, "frozenset": frozenset, "tuple": tuple, "list": list, "dict": dict, "float": float,
                  "int": int, "complex": complex, "str": str, "bool": bool, "bytes": bytes}


def _literal(node: ast.AST, depth: int = 0) -> Any:
    """The value of a literal expression node, evaluated without running any code; raises _NotLiteral otherwise."""
    if depth > 100:
        raise _NotLiteral
    if isinstance(node, ast.Constant) and not isinstance(node.value, type(Ellipsis)):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [_literal(item, depth + 1) for item in node.elts]
        return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        if any(key is None for key in node.keys):
            raise _NotLiteral
        return {_literal(key, depth + 1): _literal(value, depth + 1) for key, value in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _literal(node.operand, depth + 1)
        if type(operand) not in (int, float, complex):
            raise _NotLiteral
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        # Only complex literals: 1 + 2j, -1.5 - 0.5j.
        left, right = _literal(node.left, depth + 1), _literal(node.right, depth + 1)
        if type(left) not in (int, float) or type(right) is not complex:
            raise _NotLiteral
        return left + right if isinstance(node.op, ast.Add) else left - right
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _LITERAL_CALLS
            and not node.keywords and len(node.args) <= 1 and not any(isinstance(a, ast.Starred) for a in node.args)):
        args = [_literal(arg, depth + 1) for arg in node.args]
        try:
            return _LITERAL_CALLS[node.func.id](*args)
        except (TypeError, ValueError, OverflowError) as error:
            raise _NotLiteral from error
    raise _NotLiteral


def _is_call_on_literals(source: str) -> bool:
    node = ast.parse(source, mode="eval").body
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
        return False
    arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
    return all(keyword.arg is not None for keyword in node.keywords) and all(
        _trusted_literal(argument)[0] for argument in arguments)


def _trusted_literal(node: ast.AST) -> tuple[bool, Any]:
    try:
        return True, _literal(node)
    except (_NotLiteral, RecursionError, MemoryError, TypeError):  # TypeError: unhashable set items or dict keys
        return False, None


def _segment(text: str, node: ast.AST) -> str:
    return ast.get_source_segment(text, node) or ast.unparse(node)


_COMPARISONS = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.In: "in",
                ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
_OPERATORS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
              ">=": operator.ge, "in": lambda a, b: a in b, "not in": lambda a, b: a not in b, "is": operator.is_,
              "is not": operator.is_not}


def _expression(text: str, node: ast.AST) -> str:
    source = _segment(text, node)
    try:
        ast.parse(source, mode="eval")
    except SyntaxError:  # a segment that needs its surrounding parentheses
        source = ast.unparse(node)
    return source


def _is_isclose(node: ast.AST) -> bool:
    function = node.func if isinstance(node, ast.Call) else None
    return (isinstance(function, ast.Attribute) and function.attr == "isclose" and isinstance(function.value, ast.Name)
            and function.value.id == "math") or (isinstance(function, ast.Name) and function.id == "isclose")


def _value_test(text: str, condition: ast.AST) -> PreparedTest | None:
    """The condition as a value the parent judges, or None when it is not of a form the parent can judge."""
    if isinstance(condition, ast.Compare) and len(condition.ops) == 1 and type(condition.ops[0]) in _COMPARISONS:
        op = _COMPARISONS[type(condition.ops[0])]
        left, right = condition.left, condition.comparators[0]
        for literal, other, literal_first in ((right, left, False), (left, right, True)):
            ok, value = _trusted_literal(literal)
            # Identity means something only for the singletons; a decoded int is never the literal's object.
            if ok and (op not in ("is", "is not") or value is None or type(value) is bool):
                return PreparedTest(kind="value", source=_expression(text, other), op=op, expected=value,
                                    literal_first=literal_first)
        return None
    if _is_isclose(condition) and len(condition.args) == 2:
        options = []
        for keyword in condition.keywords:
            ok, value = _trusted_literal(keyword.value)
            if keyword.arg not in ("rel_tol", "abs_tol") or not ok:
                return None
            options.append((keyword.arg, value))
        for literal, other in ((condition.args[1], condition.args[0]), (condition.args[0], condition.args[1])):
            ok, value = _trusted_literal(literal)
            if ok and type(value) in (int, float):
                return PreparedTest(kind="value", source=_expression(text, other), op="isclose",
                                    expected=value, options=tuple(options))
        return None
    if isinstance(condition, ast.UnaryOp) and isinstance(condition.op, ast.Not):
        return PreparedTest(kind="value", source=_expression(text, condition.operand), op="falsy")
    if isinstance(condition, (ast.Call, ast.Name, ast.Subscript, ast.Attribute)):
        return PreparedTest(kind="value", source=_expression(text, condition), op="truthy")
    return None


def _prepare_one(text: str) -> PreparedTest:
    try:
        module = ast.parse(text, mode="exec")
    except SyntaxError as error:
        raise ValueError(f"Test {text!r} is not valid Python ({error.msg}); fix the dataset's tests.") from error
    if not module.body:
        raise ValueError(f"Test {text!r} is empty; give each test as an assert statement.")
    statement = module.body[0]
    if len(module.body) == 1 and isinstance(statement, ast.Assert):
        prepared = _value_test(text, statement.test)
        return prepared or PreparedTest(kind="truth", source=_expression(text, statement.test))
    return PreparedTest(kind="stmt", source=text)


def prepare_tests(tests: Sequence[str]) -> list[PreparedTest]:
    """Split test statements (``"assert f(1) == 2"``) for :func:`run_tests`; raises ValueError for invalid tests."""
    if isinstance(tests, str):
        raise ValueError("tests must be a list of test statements, not one string; wrap it in a list.")
    return [test if isinstance(test, PreparedTest) else _prepare_one(str(test)) for test in tests]


# ------------------------------------------------------------------------------------------ the harness, in the sandbox
# Its source, in its own file so that it is ordinary, linted Python; passed with `-c` so that the sandbox needs no path
# into the package.
HARNESS = Path(__file__).with_name("sandbox_harness.py").read_text()


# --------------------------------------------------------------------------------------------- one run, in the parent
def _hidden_paths(workdir: str) -> list[str]:
    """Directories hidden behind an empty tmpfs: where a checkout, a dataset or a token is likely to be."""
    candidates = [str(Path.home()), "/root", "/home", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run"]
    try:
        candidates.append(os.getcwd())
    except OSError:  # a working directory that was removed
        pass
    protected = {"/", "/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/dev", "/proc", "/sys", "/tmp",
                 "/var", "/opt"}
    work = os.path.realpath(workdir)
    hidden = []
    for candidate in candidates:
        path = os.path.realpath(candidate)
        inside = work == path or work.startswith(path.rstrip("/") + "/")
        if path not in protected and not inside and os.path.isdir(path) and path not in hidden:
            hidden.append(path)
    return sorted(hidden)


def _decode(item: Any, depth: int = 0) -> Any:
    if depth > 200:
        raise ValueError("record nested too deeply")
    tag = item[0]
    if tag == "N":
        return None
    if tag == "b":
        return bool(item[1])
    if tag == "i":
        return int(item[1], 16)
    if tag == "f":
        return float.fromhex(item[1])
    if tag == "c":
        return complex(float.fromhex(item[1]), float.fromhex(item[2]))
    if tag == "s":
        if type(item[1]) is not str:
            raise ValueError("bad string")
        return item[1]
    if tag == "y":
        return bytes.fromhex(item[1])
    if tag in ("l", "t", "S", "F"):
        items = [_decode(value, depth + 1) for value in item[1]]
        return {"l": list, "t": tuple, "S": set, "F": frozenset}[tag](items)
    if tag == "d":
        return {_decode(key, depth + 1): _decode(value, depth + 1) for key, value in item[1]}
    raise ValueError(f"unknown tag {tag!r}")


def _judge(test: PreparedTest, result: Any) -> bool:
    try:
        if result[0] != "ok":
            return False
        value = _decode(result[1])
        if test.kind != "value" or test.op == "truthy":
            return bool(value)
        if test.op == "falsy":
            return not value
        if test.op == "isclose":
            return type(value) in (int, float) and math.isclose(value, test.expected, **dict(test.options))
        left, right = (test.expected, value) if test.literal_first else (value, test.expected)
        return bool(_OPERATORS[test.op](left, right))
    except Exception:  # noqa: BLE001 - a malformed record, or values that do not compare, is a fail
        return False


def _records(output: bytes, token: str) -> list[dict]:
    marker, records = token.encode() + b" ", []
    for line in output.split(b"\n"):
        if line.startswith(marker):
            try:
                record = json.loads(line[len(marker):])
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
        logger.warning("Code sandbox isolation: %s; %s (see cgrpo.pipeline.sandbox).", isolation.get("mode"),
                       "; ".join(isolation.get("notes") or ["no notes"]))
    else:
        logger.info("Code sandbox isolation: namespaces, %s.",
                    "per-run uid" if isolation.get("uid") else "user namespace (the caller's uid, no capabilities)")


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.kill()
    except ProcessLookupError:
        pass


def _remove_tree(path: str) -> None:
    def unlock(function, target, _):
        try:
            os.chmod(os.path.dirname(target), stat.S_IRWXU)
            os.chmod(target, stat.S_IRWXU)
            function(target)
        except OSError:
            pass

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=unlock)
    else:
        shutil.rmtree(path, onerror=unlock)


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


def _run_prepared(program: str, tests: list[PreparedTest], setup: str, limits: Limits, isolation: str) -> RunResult:
    start = time.monotonic()
    token = secrets.token_hex(16)
    workdir = tempfile.mkdtemp(prefix="cgrpo-sandbox-")
    process = None
    try:
        uid = _UID_BASE + secrets.randbelow(_UID_RANGE) if os.geteuid() == 0 else None
        spec = {
            "token": token, "program": program, "setup": setup or "", "isolation": isolation, "uid": uid,
            "workdir": workdir, "hidden": _hidden_paths(workdir),
            "tests": [[test.kind, test.source] for test in tests],
            "limits": {"timeout_s": float(limits.timeout_s), "cpu_s": limits.cpu_seconds,
                       "memory_bytes": int(limits.memory_mb) << 20, "file_bytes": int(limits.max_file_mb) << 20,
                       "open_files": int(limits.max_open_files), "processes": int(limits.max_processes)},
        }
        spec_path = os.path.join(workdir, _SPEC_FILE)
        with open(os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
            json.dump(spec, handle)
        if uid is not None:
            os.chown(workdir, uid, uid)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": workdir,
               "TMPDIR": workdir}
        process = subprocess.Popen(
            [_python(), "-I", "-S", "-c", HARNESS, spec_path], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, cwd=workdir, env=env, start_new_session=True, close_fds=True,
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
        _remove_tree(workdir)


def _result(output: bytes, ended: str, token: str, tests: list[PreparedTest], wall_s: float) -> RunResult:
    records = _records(output, token)
    marker = token.encode()
    shown = b"\n".join(line for line in output.split(b"\n") if not line.startswith(marker)).strip(b"\n")
    tail = shown[-_OUTPUT_TAIL:].decode("utf-8", "replace")
    isolation = next((r["isolation"] for r in records if "isolation" in r), {})
    _note_isolation(isolation)
    failed = dict(passed=False, tests_passed=[False] * len(tests), output=tail, wall_s=wall_s, isolation=isolation)
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
        return RunResult(status="program_error", detail=str(record["program_error"]), **failed)
    results = record.get("results")
    if not isinstance(results, list) or len(results) != len(tests):
        return RunResult(status="no_result", detail="incomplete result record", **failed)
    passes = [_judge(test, result) for test, result in zip(tests, results)]
    errors = [str(result[1]) for result in results if isinstance(result, list) and result[:1] == ["error"]]
    failed.update(tests_passed=passes, passed=all(passes))
    return RunResult(status="passed" if all(passes) else "failed", detail="; ".join(errors)[:500], **failed)


# ------------------------------------------------------------------------------------------------------- public API
def check_syntax(program: str) -> str | None:
    """None if ``program`` compiles, else the error message (compiled in the parent; nothing is executed)."""
    try:
        compile(program, "<solution>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def run_tests(program: str | None, tests: Sequence[str] | Sequence[PreparedTest], setup: str = "",
              limits: Limits | None = None, isolation: str = "auto") -> RunResult:
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
        return RunResult(passed=False, status="no_program", tests_passed=[False] * len(prepared),
                         detail="no program found in the completion")
    program = str(program)
    syntax = check_syntax(program)
    if syntax is not None:
        return RunResult(passed=False, status="syntax_error", tests_passed=[False] * len(prepared), detail=syntax)
    try:
        return _run_prepared(program, prepared, setup, limits, isolation)
    except Exception as error:  # noqa: BLE001 - the sandbox's own failure is a fail, never a crash of the run
        logger.warning("Code sandbox error, counted as a failed run: %r", error)
        return RunResult(passed=False, status="sandbox_error", tests_passed=[False] * len(prepared), detail=repr(error))


def run_tests_many(programs: Sequence[str | None], tests: Sequence[str] | Sequence[PreparedTest], setup: str = "",
                   limits: Limits | None = None, isolation: str = "auto", workers: int = 2) -> list[RunResult]:
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
    "isolation_report",
    "prepare_tests",
    "run_tests",
    "run_tests_many",
]
