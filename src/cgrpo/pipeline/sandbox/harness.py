"""The harness run inside the sandbox of `cgrpo.pipeline.sandbox.runner`: supervisor, reaper and program process.

Run as `python -I -S -c <this source> <spec file>` with the run's working directory as cwd, never imported: it must
use only the standard library, and import every module it needs before the untrusted program runs. Values are encoded
with the base types' own methods, saved before the program can patch them. docs/sandbox.md documents what each
process does and what is isolated in each mode.
"""

import builtins
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time  # noqa: I001 - one line, before the program

_type, _issubclass, _hex, _len = type, issubclass, hex, len
_bool, _int, _float, _complex, _str, _bytes = bool, int, float, complex, str, bytes
_list, _tuple, _dict, _set, _frozenset = list, tuple, dict, set, frozenset
_int_index, _float_hex, _str_str, _bytes_hex = int.__index__, float.hex, str.__str__, bytes.hex
_iters = (
    (_list, "l", list.__iter__),
    (_tuple, "t", tuple.__iter__),
    (_set, "S", set.__iter__),
    (_frozenset, "F", frozenset.__iter__),
)
_dict_items = dict.items
_real, _imag = complex.__dict__["real"].__get__, complex.__dict__["imag"].__get__
_dumps, _write, _exit, _Base = json.dumps, os.write, os._exit, BaseException
_exec, _eval, _compile = exec, eval, compile
_builtins = dict(builtins.__dict__)  # the tests' builtins: the program may patch the module's

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 36, 38, 47
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 442, -100, 0x8000, 1, 2
LIB_ROOT = "/tmp/.cgrpo-lib"
DEV_NODES = ("null", "zero", "full", "random", "urandom")
# SysV IPC limits of the run's IPC namespace: no segment, queue or semaphore set can be made.
IPC_LIMITS = (("shmmni", "0"), ("shmall", "0"), ("shmmax", "0"), ("msgmni", "0"), ("sem", "0 0 0 0"))


def check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, what + ": " + os.strerror(err))


def mount(source, target, fstype, flags, data=None):
    def enc(s):
        return None if s is None else s.encode()

    check(libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), "mount " + target)


def prctl(option, arg):
    return libc.prctl(
        ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)
    )


def emit(fd, token, record):
    data = ("\n" + token + " " + _dumps(record) + "\n").encode()
    while data:
        data = data[_write(fd, data) :]


def enter_namespaces(spec, mode, notes):
    """Unshare net, mount, pid, IPC and UTS (and user, when not root); return the mode reached."""
    flags = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWPID | CLONE_NEWNET
    if mode == "process":
        notes.append("process isolation requested: network, filesystem writes and other processes are not isolated")
        return "process"
    uid, gid = os.getuid(), os.getgid()
    if uid == 0 and libc.unshare(flags) == 0:
        return "namespaces"
    if libc.unshare(flags | CLONE_NEWUSER) == 0:
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open("/proc/self/" + name, "w") as fh:
                fh.write(text)
        spec["uid"] = None  # no other uid is mapped in the namespace: the caller's, as uid 0 without capabilities
        spec["user_ns"] = True
        return "namespaces"
    err = ctypes.get_errno()
    if mode == "namespaces":
        raise OSError(err, "unshare: " + os.strerror(err))
    notes.append(
        f"no namespaces (unshare: {os.strerror(err)}): network, filesystem writes and other processes are not isolated"
    )
    return "process"


def close_ipc(notes):
    for name, value in IPC_LIMITS:
        try:
            with open("/proc/sys/kernel/" + name, "w") as fh:
                fh.write(value)
        except OSError as error:
            notes.append(f"SysV IPC limit {name} not set ({error})")


def make_read_only(notes):
    """Every mount of this namespace read-only and nosuid, recursively (mounts made afterwards are not)."""

    class MountAttr(ctypes.Structure):
        _fields_ = [
            ("attr_set", ctypes.c_uint64),
            ("attr_clr", ctypes.c_uint64),
            ("propagation", ctypes.c_uint64),
            ("userns_fd", ctypes.c_uint64),
        ]

    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    result = libc.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR),
        ctypes.c_int(AT_FDCWD),
        b"/",
        ctypes.c_uint(AT_RECURSIVE),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    if result != 0:
        why = os.strerror(ctypes.get_errno())
        notes.append(f"filesystem not read-only outside the working directory (mount_setattr: {why})")


def setup_dev(notes):
    """/dev as a read-only tmpfs holding only null, zero, full, random, urandom and the fd links."""
    nodes = {}
    for name in DEV_NODES:
        try:
            nodes[name] = os.open("/dev/" + name, os.O_PATH)
        except OSError:
            notes.append(f"/dev/{name} missing")
    mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=755")
    for name, fd in nodes.items():
        os.close(os.open("/dev/" + name, os.O_CREAT | os.O_WRONLY, 0o666))
        mount(f"/proc/self/fd/{fd}", "/dev/" + name, None, MS_BIND)
        os.close(fd)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, "/dev/" + name)
    mount(None, "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=755")


def hide(path, notes):
    try:
        mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,nr_inodes=16,mode=755")
        return True
    except OSError as error:
        notes.append(f"{path} not hidden ({error})")
        return False


def setup_filesystem(spec, notes):
    """Private mounts: fresh /proc, SysV IPC closed, everything read-only, an empty read-only tmpfs over /tmp and the
    hidden paths, a minimal /dev, the standard library bound back in, and the working directory a fresh tmpfs capped
    in size and inodes. Returns {old library path: new path}."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    try:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as error:
        notes.append(f"host /proc stays visible ({error})")
    close_ipc(notes)
    workdir, limits = spec["workdir"], spec["limits"]
    libs = [path for path in sys.path if os.path.isdir(path)]
    keep = [os.open(path, os.O_PATH | os.O_DIRECTORY) for path in libs]
    make_read_only(notes)
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=256k,nr_inodes=256,mode=755")
    moved = {}
    for index, (path, fd) in enumerate(zip(libs, keep)):
        target = f"{LIB_ROOT}/{index}"
        os.makedirs(target)
        mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        for extra in (0, MS_NOEXEC):
            try:
                mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | extra)
                break
            except OSError as error:
                if extra:
                    notes.append(f"standard library not read-only ({error})")
        moved[path] = target
        os.close(fd)
    os.makedirs(workdir, exist_ok=True)
    owner = spec["uid"] or 0
    mount(
        "tmpfs",
        workdir,
        "tmpfs",
        MS_NOSUID | MS_NODEV,
        f"size={limits['disk_bytes']},nr_inodes={limits['inodes']},mode=700,uid={owner},gid={owner}",
    )
    mount(None, "/tmp", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=256k,nr_inodes=256,mode=755")
    setup_dev(notes)
    hidden = []
    for path in spec["hidden"]:
        if not os.path.isdir(path) or any(path == h or path.startswith(h.rstrip("/") + "/") for h in hidden):
            continue
        if hide(path, notes):
            hidden.append(path)
    for path in spec["hidden"]:  # the same directories inside the library's bound copy (site-packages)
        for old, new in moved.items():
            if path.startswith(old.rstrip("/") + "/") and os.path.isdir(new + path[len(old) :]):
                hide(new + path[len(old) :], notes)
    return moved


def install_seccomp(program_hex):
    code = bytes.fromhex(program_hex)
    buffer = ctypes.create_string_buffer(code, _len(code))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    program = Program(_len(code) // 8, ctypes.addressof(buffer))
    check(
        libc.prctl(
            ctypes.c_int(PR_SET_SECCOMP),
            ctypes.c_ulong(SECCOMP_MODE_FILTER),
            ctypes.byref(program),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        ),
        "seccomp",
    )


def drop_privileges(spec, limits, isolation):
    uid = spec["uid"]
    for name, value in (
        ("RLIMIT_CPU", limits["cpu_s"]),
        ("RLIMIT_AS", limits["memory_bytes"]),
        ("RLIMIT_FSIZE", limits["file_bytes"]),
        ("RLIMIT_NOFILE", limits["open_files"]),
        ("RLIMIT_CORE", 0),
        ("RLIMIT_NPROC", limits["processes"]),
    ):
        which = getattr(resource, name)
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY and uid is None:
            value = min(value, hard)  # only real root (who gets a uid) may raise a hard limit
        resource.setrlimit(which, (value, value))
    prctl(PR_CAP_AMBIENT, 4)  # PR_CAP_AMBIENT_CLEAR_ALL
    for cap in range(64):
        if prctl(PR_CAPBSET_DROP, cap) != 0 and ctypes.get_errno() == 22:  # EINVAL: past the last capability
            break
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    elif isolation == "namespaces":
        # uid 0 inside a user namespace: give up every capability there too.
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [
                ("effective", ctypes.c_uint32),
                ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32),
            ]

        check(libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "capset")
    check(prctl(PR_SET_NO_NEW_PRIVS, 1), "no_new_privs")
    if spec["seccomp"]:
        install_seccomp(spec["seccomp"])


def encode(value, depth=0):
    if depth > 200:
        raise ValueError("value nested too deeply")
    if value is None:
        return ["N"]
    kind = _type(value)
    if kind is _bool:
        return ["b", 1 if value else 0]
    if _issubclass(kind, _int):
        return ["i", _hex(_int_index(value))]
    if _issubclass(kind, _float):
        return ["f", _float_hex(value)]
    if _issubclass(kind, _complex):
        return ["c", _float_hex(_real(value)), _float_hex(_imag(value))]
    if _issubclass(kind, _str):
        return ["s", _str_str(value)]
    if _issubclass(kind, _bytes):
        return ["y", _bytes_hex(value)]
    for base, tag, iterate in _iters:
        if _issubclass(kind, base):
            return [tag, [encode(item, depth + 1) for item in iterate(value)]]
    if _issubclass(kind, _dict):
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in _dict_items(value)]]
    raise TypeError("a test value of type " + kind.__name__ + " is not plain data")


def describe(error):
    try:
        text = _type(error).__name__ + ": " + _str(error)
    except _Base:
        text = "exception"
    return text[:300]


def run_tests(spec, namespace):
    """Each test's outcome. Tests see the program's names but the original builtins, and the setup code is run again
    over the program's names, so that a program cannot pass by redefining ``abs`` or a setup helper."""
    scope = {**namespace, "__builtins__": _builtins}
    try:
        _exec(_compile(spec["setup"], "<setup>", "exec"), scope)
    except _Base as error:
        return [["error", describe(error)] for _ in spec["tests"]]
    results = []
    for kind, source in spec["tests"]:
        try:
            if kind == "stmt":
                _exec(_compile(source, "<test>", "exec"), scope)
                results.append(["ok", ["b", 1]])
            else:
                results.append(["ok", encode(_eval(_compile(source, "<test>", "eval"), scope))])
        except _Base as error:
            results.append(["error", describe(error)])
    return results


def run_untrusted(spec, moved, isolation, out):
    """Limits and privileges, then the program, then the tests; never returns."""
    token, results, program_error = spec["token"], [], None
    try:
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.chdir(spec["workdir"])
        drop_privileges(spec, spec["limits"], isolation)
        if moved:

            def move(path):
                for old, new in moved.items():
                    if path == old or path.startswith(old + "/"):
                        return new + path[len(old) :]
                return path

            sys.path[:] = [moved[path] for path in sys.path if path in moved]
            sys.path_importer_cache.clear()
            for module in list(sys.modules.values()):
                if isinstance(getattr(module, "__path__", None), list):
                    module.__path__[:] = [move(p) for p in module.__path__]
    except BaseException as error:  # noqa: BLE001 - any failure here is the sandbox's, reported as such
        emit(out, token, {"sandbox_error": "setting up the program process: " + describe(error)})
        _exit(70)
    namespace = {"__name__": "__solution__", "__builtins__": builtins}
    syntax_error = False
    try:
        for name, code in (("<setup>", spec["setup"]), ("<solution>", spec["program"])):
            try:
                compiled = compile(code, name, "exec")
            except SyntaxError:
                syntax_error = name == "<solution>"  # compiled here, not in the parent: a long program costs once
                raise
            exec(compiled, namespace)  # noqa: S102 - running the untrusted program is this process's job
    except _Base as error:
        program_error = describe(error)
    else:
        results = run_tests(spec, namespace)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except _Base:
            pass
    try:
        emit(out, token, {"program_error": program_error, "syntax_error": syntax_error, "results": results})
    except _Base:
        pass
    _exit(0)


def reaper(spec, isolation, notes, parent_gone, out):
    """pid 1 of the new pid namespace: mounts, then the program, whose end ends the namespace."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if select.select([parent_gone], [], [], 0)[0]:
        _exit(0)
    moved = {}
    if isolation == "namespaces":
        moved = setup_filesystem(spec, notes)
    elif spec["uid"] is not None and not all(readable_by_others(path) for path in sys.path if os.path.isdir(path)):
        notes.append("the standard library is not readable by other users: only modules loaded in advance import")
        for name in spec["preload"]:
            try:
                __import__(name)
            except ImportError:
                pass
    if not spec["seccomp"]:
        notes.append("no seccomp filter (no syscall table for this architecture)")
    report = {
        "mode": isolation,
        "uid": spec["uid"],
        "user_ns": spec.get("user_ns", False),
        "cgroup": spec["cgroup"] is not None,
        "seccomp": bool(spec["seccomp"]),
        "disk_cap": isolation == "namespaces",
        "notes": notes,
    }
    emit(out, spec["token"], {"isolation": report})
    child = os.fork()
    if child == 0:
        os.close(parent_gone)
        try:
            run_untrusted(spec, moved, isolation, out)
        finally:
            _exit(70)
    while True:
        pid, _ = os.wait()
        if pid == child:
            _exit(0)


def readable_by_others(path):
    """True when a uid that owns nothing can list ``path`` and reach it through its parents."""
    try:
        if os.stat(path).st_mode & 0o005 != 0o005:
            return False
        while path not in ("/", ""):
            path = os.path.dirname(path)
            if not os.stat(path).st_mode & 0o001:
                return False
    except OSError:
        return False
    return True


def user_task_count(uid):
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat("/proc/" + entry).st_uid == uid:
                    count += _len(os.listdir("/proc/" + entry + "/task"))
            except OSError:
                pass
    return count


def main():
    path = sys.argv[1]
    with open(path, "rb") as fh:
        spec = json.loads(fh.read())
    os.unlink(path)
    out = os.dup(1)
    notes = []
    if spec["cgroup"]:
        try:
            with open(spec["cgroup"] + "/cgroup.procs", "w") as fh:
                fh.write(str(os.getpid()))
        except OSError as error:
            spec["cgroup"] = None
            notes.append(f"no per-run memory cgroup ({error}): memory is bounded per process only")
    else:
        notes.append("no per-run memory cgroup: memory is bounded per process only")
    try:
        isolation = enter_namespaces(spec, spec["isolation"], notes)
    except OSError as error:
        emit(out, spec["token"], {"sandbox_error": str(error)})
        return
    if isolation == "process":
        prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans come back here, to be killed (as root) and reaped
        if spec["uid"] is None:
            spec["limits"]["processes"] += user_task_count(os.getuid())
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(write_end)
        try:
            reaper(spec, isolation, notes, read_end, out)
        except BaseException as error:  # noqa: BLE001 - any failure here is the sandbox's, reported as such
            emit(out, spec["token"], {"sandbox_error": describe(error)})
        finally:
            _exit(70)
    os.close(read_end)

    def expire(*_):
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass

    signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, spec["limits"]["timeout_s"] + 1.0)
    os.waitpid(child, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    if isolation == "process" and spec["uid"] is not None:
        sweeper = os.fork()
        if sweeper == 0:
            os.setgroups([])
            os.setgid(spec["uid"])
            os.setuid(spec["uid"])
            os.kill(-1, signal.SIGKILL)
            _exit(0)
        os.waitpid(sweeper, 0)
    if isolation == "process":
        give_up = time.monotonic() + 1.0
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                if time.monotonic() > give_up:
                    break
                time.sleep(0.01)


if __name__ == "__main__":
    main()
