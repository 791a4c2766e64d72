"""The sandbox against what the second audit found (issue #25): per-run disk and memory caps, a cleanup that survives
a deep tree, SysV IPC, pathname Unix sockets, /dev, the seccomp filter, and work in the caller bounded in time.

A hostile program counts as contained when it fails, the run goes on, and nothing on the host changed. The checks that
need namespaces fail instead of skipping as root (CI), where namespaces are always available."""

from __future__ import annotations

import errno
import os
import platform
import secrets
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from cgrpo.pipeline.sandbox import runner as sandbox
from cgrpo.pipeline.sandbox.host import cgroup_support, remove_tree
from cgrpo.pipeline.sandbox.judging import PreparedTest, judge
from cgrpo.pipeline.sandbox.runner import Limits, isolation_report, run_tests
from cgrpo.pipeline.sandbox.seccomp import _BLOCKED, seccomp_filter
from cgrpo.pipeline.tasks.code_verifier import CodeVerifier

GOOD = "def f(x):\n    return 3 * x + 1\n"
TESTS = ["assert f(1) == 4", "assert f(2) == 7"]


@pytest.fixture(scope="module")
def contained():
    isolation = isolation_report()
    if os.geteuid() == 0:
        assert isolation.get("mode") == "namespaces", isolation
    elif isolation.get("mode") != "namespaces":
        pytest.skip(f"no namespaces here ({isolation}): the mount and seccomp checks do not apply")
    return isolation


@pytest.fixture
def workdirs(monkeypatch, tmp_path):
    """Runs' working directories go under a directory of the test's own, which must be empty afterwards."""
    base = tmp_path / "work"
    base.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    return base


def _printed_number(result) -> int:
    return int(result.output.split()[-1])


# ------------------------------------------------------------------------------------------------------ disk
DISK_BOMB = """
import os
written = 0
try:
    for index in range(10000):
        with open("f%d" % index, "wb") as handle:
            handle.write(b"x" * ((8 << 20) - 1))
        written += (8 << 20) - 1
finally:
    print(written, flush=True)
"""


def test_disk_bomb_stops_at_the_run_cap_and_leaves_nothing(contained, workdirs):
    start = time.monotonic()
    result = run_tests(DISK_BOMB + GOOD, TESTS, limits=Limits(timeout_s=30))
    assert not result.passed and result.status == "program_error" and "No space" in result.detail, result
    assert _printed_number(result) <= 512 << 20 < 600 << 20
    print(f"disk bomb: {_printed_number(result) >> 20} MB written in {time.monotonic() - start:.1f} s")
    assert list(workdirs.iterdir()) == []


def test_inode_bomb_stops_at_the_file_cap(contained, workdirs):
    program = (
        "import os\ncount = 0\ntry:\n    while True:\n        open('n%d' % count, 'w').close()\n"
        "        count += 1\nfinally:\n    print(count, flush=True)\n"
    )
    result = run_tests(program + GOOD, TESTS, limits=Limits(timeout_s=30, max_files=500))
    assert not result.passed and _printed_number(result) < 500, result
    assert list(workdirs.iterdir()) == []


DEEP_TREE = """
import os
for _ in range(1100):
    os.mkdir("d")
    os.chdir("d")
    open("file", "w").write("x")
os.chmod(".", 0)
"""


@pytest.mark.parametrize("isolation", ["auto", "process"])
def test_a_deep_tree_is_removed(workdirs, isolation):
    result = run_tests(DEEP_TREE + GOOD, TESTS, limits=Limits(timeout_s=30), isolation=isolation)
    assert result.passed, result
    assert list(workdirs.iterdir()) == []


def test_a_cleanup_that_fails_is_logged_once(tmp_path, caplog, monkeypatch):
    path = tmp_path / "stuck"
    (path / "inner").mkdir(parents=True)
    monkeypatch.setattr(os, "rmdir", lambda *args, **kwargs: (_ for _ in ()).throw(PermissionError(1, "no")))
    with caplog.at_level("ERROR"):
        assert not remove_tree(str(path))
        assert not remove_tree(str(path))
    assert caplog.text.count("could not remove") == 1


# ---------------------------------------------------------------------------------------------------- memory
FORK_MEMORY = """
import os
def f(x):
    read, write = os.pipe()
    children = []
    for _ in range(7):
        pid = os.fork()
        if pid == 0:
            block = b"x" * (300 << 20)
            os.write(write, b"1")
            import time
            time.sleep(20)
            os._exit(0)
        children.append(pid)
    got = 0
    while got < 7:
        got += len(os.read(read, 7))
    return 3 * x + 1
"""


def test_forked_memory_is_capped_per_run():
    if cgroup_support()[0] is None:
        pytest.skip(f"no per-run memory cgroup here: {cgroup_support()[1]}")
    start = time.monotonic()
    result = run_tests(FORK_MEMORY, TESTS, limits=Limits(timeout_s=10))
    assert not result.passed and result.status in ("no_result", "timeout"), result
    assert time.monotonic() - start < 11
    assert result.isolation.get("cgroup") is True


def test_sysv_shared_memory_is_closed(contained):
    program = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def f(x):\n    return 3 * x + 1 if libc.shmget(0, 1 << 20, 0o1666) >= 0 else None\n"
    )
    result = run_tests(program, TESTS, limits=Limits(timeout_s=10))
    assert not result.passed and result.status == "failed", result


# ----------------------------------------------------------------------------------------------------- paths
def test_a_pathname_unix_socket_receives_nothing(contained):
    directory = Path("/var/cache") / f"cgrpo-test-{secrets.token_hex(4)}"
    directory.mkdir(parents=True)
    path = directory / "listen.sock"
    received = []
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        server.bind(str(path))
        os.chmod(path, 0o777)
        directory.chmod(0o755)
        server.settimeout(3)

        def listen():
            try:
                received.append(server.recv(100))
            except OSError:  # the timeout: nothing came
                pass

        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        program = (
            "import socket\ndef f(x):\n    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
            f"    s.sendto(b'leak', {str(path)!r})\n    return 3 * x + 1\n"
        )
        result = run_tests(program, TESTS, limits=Limits(timeout_s=10))
        listener.join(4)
        server.close()
    finally:
        remove_tree(str(directory))
    assert not result.passed and result.status == "failed" and "Operation not permitted" in result.detail, result
    assert received == []


def test_dev_holds_only_the_minimal_set(contained):
    program = (
        "import os\ndef f():\n    return sorted(os.listdir('/dev'))\n"
        "def g(name):\n    try:\n        open('/dev/' + name, 'rb').close()\n        return True\n"
        "    except OSError:\n        return False\n"
    )
    tests = [
        "assert f() == ['fd', 'full', 'null', 'random', 'stderr', 'stdin', 'stdout', 'urandom', 'zero']",
        "assert g('urandom') == True",
        "assert g('kmsg') == False",
        "assert g('mem') == False",
    ]
    result = run_tests(program, tests, limits=Limits(timeout_s=10))
    assert result.passed, result


def test_the_filesystem_is_read_only_outside_the_working_directory(contained):
    program = (
        "import os\ndef f(path):\n    try:\n        open(path, 'w').close()\n        return 'written'\n"
        "    except OSError as error:\n        return error.errno\n"
    )
    tests = [
        f"assert f('/etc/cgrpo-{secrets.token_hex(4)}') == {errno.EROFS}",
        f"assert f('/usr/cgrpo-{secrets.token_hex(4)}') == {errno.EROFS}",
        "assert f('here') == 'written'",
    ]
    result = run_tests(program, tests, limits=Limits(timeout_s=10))
    assert result.passed, result


# --------------------------------------------------------------------------------------------------- seccomp
def test_the_filter_is_built_for_known_architectures_only():
    assert seccomp_filter("x86_64") and seccomp_filter("aarch64") and len(seccomp_filter("x86_64")) % 8 == 0
    assert seccomp_filter("riscv64") is None


@pytest.mark.parametrize(
    "name",
    [
        "unshare",
        "setns",
        "mount",
        "bpf",
        "userfaultfd",
        "io_uring_setup",
        "perf_event_open",
        "keyctl",
        "ptrace",
        "process_vm_readv",
    ],
)
def test_blocked_syscalls_fail_with_eperm(contained, name):
    if seccomp_filter() is None:
        pytest.skip(f"no seccomp syscall table for {platform.machine()}")
    number = _BLOCKED[name][0 if platform.machine() in ("x86_64", "amd64") else 1]
    program = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"def f():\n    libc.syscall({number}, 0, 0, 0, 0, 0)\n    return ctypes.get_errno()\n"
    )
    result = run_tests(program, [f"assert f() == {errno.EPERM}"], limits=Limits(timeout_s=10))
    assert result.passed and result.isolation.get("seccomp") is True, result


def test_clone_into_a_new_namespace_fails(contained):
    program = (
        "import os\ndef f():\n    try:\n        os.unshare(os.CLONE_NEWUSER)\n        return 'escaped'\n"
        "    except (OSError, AttributeError) as error:\n        return type(error).__name__\n"
    )
    result = run_tests(program, ["assert f() == 'escaped'"], limits=Limits(timeout_s=10))
    assert not result.passed


# ------------------------------------------------------------------------------------ bounded work in the caller
def test_a_hash_collision_result_is_judged_quickly():
    colliding = [["i", hex(k * ((1 << 61) - 1))] for k in range(1, 40_000)]
    start = time.monotonic()
    assert not judge(PreparedTest(kind="value", source="f()", op="==", expected={1, 2}), ["ok", ["S", colliding]])
    assert time.monotonic() - start < 3


def test_a_forged_hash_collision_record_returns_within_three_seconds():
    forger = (
        "import gc, json, os\n"
        "spec = next(o for o in gc.get_objects() if type(o) is dict and 'token' in o and 'tests' in o)\n"
        "value = ['S', [['i', hex(k * ((1 << 61) - 1))] for k in range(1, 35000)]]\n"
        "os.write(1, ('\\n' + spec['token'] + ' ' + json.dumps({'results': [['ok', value]]}) + '\\n').encode())\n"
        "os._exit(0)\n"
    )
    start = time.monotonic()
    result = CodeVerifier().run([forger], ["assert f() == {1, 2}"])[0]
    elapsed = time.monotonic() - start
    print(f"hash-collision record: {elapsed:.2f} s")
    assert not result.passed and elapsed < 3, result


COMPLETIONS = {
    "fences": "```" * 34_000,
    "fence lines": "```\n" * 25_000,
    "one long block": "```python x\n" + "a\n" * 50_000,
    "blocks of blanks": ("```py\n" + " " * 200 + "\n") * 490,
    "functions": "```python\n" + "def f(x):\n    return 3 * x + 1\n" * 3_300,
}


@pytest.mark.parametrize("name", sorted(COMPLETIONS))
def test_a_100kb_completion_is_verified_quickly(name):
    completion = COMPLETIONS[name]
    assert len(completion) >= 100_000
    start = time.monotonic()
    CodeVerifier().run([completion], TESTS)
    elapsed = time.monotonic() - start
    print(f"100 KB completion ({name}): {elapsed:.2f} s")
    assert elapsed < 1.5


def test_limits_refuse_non_positive_run_caps():
    for name in ("run_memory_mb", "disk_mb", "max_files"):
        with pytest.raises(ValueError, match=name):
            Limits(**{name: 0})
    assert sandbox.Limits().disk_mb <= 600 and sandbox.Limits().run_memory_mb <= 1024
