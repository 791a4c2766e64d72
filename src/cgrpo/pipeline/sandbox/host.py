"""What the sandbox's parent does on the host around a run: the per-run memory cgroup, the directories the harness
hides, and a removal of the run's working directory that cannot fail on depth.

The cgroup: where the caller may create one (cgroup v2 with the memory controller delegated to the caller's cgroup,
or the cgroup v1 memory hierarchy, as root), each run gets a child cgroup whose memory limit (swap included) covers
every process of the run together and its tmpfs working directory; the harness's supervisor moves itself in before it
forks. Elsewhere there is none, and the run's memory is bounded only per process (``memory_mb`` for each of at most
``max_processes``); :func:`cgroup_support` says which.
"""

from __future__ import annotations

import logging
import os
import site
import stat
import sysconfig
import threading
import time
from functools import lru_cache
from pathlib import Path

logger = logging.getLogger(__name__)

_CGROUP_ROOT = "/sys/fs/cgroup"


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup paths: ``{"2": path}`` for the unified hierarchy, ``{"memory": path}`` for cgroup v1's."""
    paths = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            paths["2"] = path
        elif "memory" in controllers.split(","):
            paths["memory"] = path
    return paths


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK)


@lru_cache(maxsize=1)
def cgroup_support() -> tuple[str | None, str]:
    """``(version, parent directory)`` where runs get a memory cgroup (``"2"`` or ``"1"``), else ``(None, why not)``.
    Probed once per process by creating and removing a child."""
    own = _own_cgroups()
    candidates = []
    if "2" in own:
        unified = _CGROUP_ROOT if os.path.exists(f"{_CGROUP_ROOT}/cgroup.controllers") else f"{_CGROUP_ROOT}/unified"
        base = unified + own["2"]
        try:
            delegated = "memory" in Path(base, "cgroup.subtree_control").read_text().split()
        except OSError:
            delegated = False
        if delegated:
            candidates.append(("2", base))
    if "memory" in own:
        candidates.append(("1", f"{_CGROUP_ROOT}/memory{own['memory']}"))
    for version, base in candidates:
        probe = os.path.join(base, f"cgrpo-probe-{os.getpid()}")
        try:
            os.mkdir(probe)
            os.rmdir(probe)
            return version, base
        except OSError:
            continue
    return None, "no memory cgroup the caller may create (cgroup v2 without the memory controller delegated, no v1)"


def create_cgroup(name: str, memory_bytes: int, processes: int) -> str | None:
    """A child cgroup limiting memory (swap included) and, on v2, the number of tasks; None where runs get none."""
    version, base = cgroup_support()
    if version is None:
        return None
    path = os.path.join(base, name)
    os.mkdir(path)
    try:
        if version == "2":
            settings = [
                ("memory.max", memory_bytes),
                ("memory.swap.max", 0),
                ("memory.oom.group", 1),
                ("pids.max", processes + 4),
            ]
        else:
            settings = [("memory.limit_in_bytes", memory_bytes), ("memory.memsw.limit_in_bytes", memory_bytes)]
        for key, value in settings:
            target = os.path.join(path, key)
            if os.path.exists(target):  # swap accounting and the pids controller are optional
                Path(target).write_text(str(value))
    except OSError:
        remove_cgroup(path)
        raise
    return path


def remove_cgroup(path: str) -> bool:
    """Kill what is left in the cgroup and remove it; False (logged as an error) when it would not go."""
    kill = os.path.join(path, "cgroup.kill")
    for _ in range(100):
        try:
            if os.path.exists(kill):
                Path(kill).write_text("1")
            else:
                for pid in Path(path, "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(pid), 9)
                    except OSError:
                        pass
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.01)
    logger.error("Code sandbox: could not remove the run's cgroup %s; remove it by hand (rmdir).", path)
    return False


def hidden_paths(workdir: str) -> list[str]:
    """Directories hidden behind an empty tmpfs: where a checkout, a dataset or a token is likely to be, and the
    installed packages (the program runs without them; a dataset shipped in a wheel, like HumanEval's, is there)."""
    candidates = [str(Path.home()), "/root", "/home", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run"]
    stdlib = {os.path.realpath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib")}
    packages = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    packages.update(site.getsitepackages() + [site.getusersitepackages()])
    for path in packages:
        real = os.path.realpath(path)
        if not any(lib == real or lib.startswith(real.rstrip("/") + "/") for lib in stdlib):
            candidates.append(real)
    try:
        candidates.append(os.getcwd())
    except OSError:  # a working directory that was removed
        pass
    protected = {
        "/",
        "/usr",
        "/lib",
        "/lib32",
        "/lib64",
        "/bin",
        "/sbin",
        "/etc",
        "/dev",
        "/proc",
        "/sys",
        "/tmp",
        "/var",
        "/opt",
    }
    work = os.path.realpath(workdir)
    hidden = []
    for candidate in candidates:
        path = os.path.realpath(candidate)
        inside = work == path or work.startswith(path.rstrip("/") + "/")
        if path not in protected and not inside and os.path.isdir(path) and path not in hidden:
            hidden.append(path)
    return sorted(hidden)


def _clear(fd: int) -> None:
    """Remove everything in the directory open as ``fd``, depth first with a stack of descriptors (no recursion, no
    path longer than one name, so neither depth nor PATH_MAX stops it)."""
    stack = [(fd, None)]
    try:
        while stack:
            current, _ = stack[-1]
            os.fchmod(current, stat.S_IRWXU)
            descended = False
            with os.scandir(current) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        child = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=current)
                        stack.append((child, entry.name))
                        descended = True
                        break
                    os.unlink(entry.name, dir_fd=current)
            if descended:
                continue
            done, name = stack.pop()
            if stack:
                os.close(done)
                os.rmdir(name, dir_fd=stack[-1][0])
    finally:
        for open_fd, _ in stack[1:]:
            os.close(open_fd)


_failed_removals: set[str] = set()
_removal_lock = threading.Lock()


def remove_tree(path: str) -> bool:
    """Remove the directory ``path`` and everything in it, however deep; False, logged as an error once per path, when
    something would not go."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
    try:
        _clear(fd)
        os.rmdir(path)
        return True
    except OSError as error:
        with _removal_lock:
            first = path not in _failed_removals
            _failed_removals.add(path)
        if first:
            logger.error(
                "Code sandbox: could not remove the run's working directory %s (%s); remove it by hand.", path, error
            )
        return False
    finally:
        os.close(fd)


__all__ = ["cgroup_support", "create_cgroup", "hidden_paths", "remove_cgroup", "remove_tree"]
