"""The sandbox's seccomp filter: a classic BPF program, built here in the parent and installed by the harness in the
program process (after ``PR_SET_NO_NEW_PRIVS``), so that neither side needs a library.

Why hand-built: the harness runs as ``python -I -S`` without site-packages, so ``pyseccomp`` (a ctypes wrapper of the
system ``libseccomp``, last released 2021) could not be imported there, and the filter is a short list of syscall
numbers for two architectures. Landlock restricts paths, not syscalls, and the read-only filesystem is already done
with mounts.

Blocked with ``EPERM``: new namespaces (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag), every mount
call, ``bpf``, ``userfaultfd``, ``io_uring``, ``perf_event_open``, the key store, ``ptrace`` and
``process_vm_readv``/``writev``, kernel modules and ``kexec``, SysV IPC and POSIX message queues, ``chroot``,
``socket(AF_UNIX)`` (a pathname Unix socket is reachable from any network namespace), and a few system-wide calls.
``clone3`` answers ``ENOSYS``: its flags are behind a pointer the filter cannot read, and the C library then falls back
to ``clone``. On x86-64 the x32 ABI is refused; a process of another architecture is killed.
"""

from __future__ import annotations

import errno
import platform
import struct

# Syscall numbers: x86-64 (asm/unistd_64.h) and the generic table arm64 uses (asm-generic/unistd.h).
_BLOCKED = {
    "unshare": (272, 97),
    "setns": (308, 268),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "bpf": (321, 280),
    "userfaultfd": (323, 282),
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "perf_event_open": (298, 241),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "shmget": (29, 194),
    "shmat": (30, 196),
    "msgget": (68, 186),
    "semget": (64, 190),
    "mq_open": (240, 180),
    "chroot": (161, 51),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "reboot": (169, 142),
    "acct": (163, 89),
    "quotactl": (179, 60),
    "fanotify_init": (300, 262),
    "open_by_handle_at": (304, 265),
    "syslog": (103, 116),
    "settimeofday": (164, 170),
    "clock_settime": (227, 112),
}
_CLONE, _CLONE3, _SOCKET = (56, 220), (435, 435), (41, 198)
# AUDIT_ARCH_X86_64 and AUDIT_ARCH_AARCH64; the column of each architecture in the tables above.
_ARCHES = {"x86_64": (0xC000003E, 0), "amd64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1), "arm64": (0xC00000B7, 1)}
_X32_BIT = 0x40000000
# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME.
_CLONE_NEW = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080
_AF_UNIX = 1

_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL_PROCESS, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
_NR, _ARCH, _ARG0_LOW = 0, 4, 16  # offsets in struct seccomp_data (little-endian: arg0's low word first)


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def _deny(value: int) -> bytes:
    return _op(_RET_K, _ERRNO | value)


def seccomp_filter(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (``platform.machine()``) as packed ``struct sock_filter`` entries, or None for an
    architecture it has no syscall table for."""
    arch = _ARCHES.get((machine or platform.machine()).lower())
    if arch is None:
        return None
    audit_arch, column = arch
    program = [_op(_LD_W_ABS, _ARCH), _op(_JEQ_K, audit_arch, 1, 0), _op(_RET_K, _KILL_PROCESS), _op(_LD_W_ABS, _NR)]
    if column == 0:
        program += [_op(_JGE_K, _X32_BIT, 0, 1), _deny(errno.EPERM)]
    for numbers in _BLOCKED.values():
        program += [_op(_JEQ_K, numbers[column], 0, 1), _deny(errno.EPERM)]
    program += [_op(_JEQ_K, _CLONE3[column], 0, 1), _deny(errno.ENOSYS)]
    # clone: deny when a namespace flag is set; socket: deny AF_UNIX. Each block reloads the number afterwards.
    program += [
        _op(_JEQ_K, _CLONE[column], 0, 4),
        _op(_LD_W_ABS, _ARG0_LOW),
        _op(_JSET_K, _CLONE_NEW, 0, 1),
        _deny(errno.EPERM),
        _op(_LD_W_ABS, _NR),
    ]
    program += [
        _op(_JEQ_K, _SOCKET[column], 0, 3),
        _op(_LD_W_ABS, _ARG0_LOW),
        _op(_JEQ_K, _AF_UNIX, 0, 1),
        _deny(errno.EPERM),
    ]
    program.append(_op(_RET_K, _ALLOW))
    return b"".join(program)


__all__ = ["seccomp_filter"]
