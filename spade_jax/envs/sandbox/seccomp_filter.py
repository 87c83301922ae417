"""A hand-written seccomp-BPF filter for sandbox workers (stdlib only, ctypes + prctl).

Why not libseccomp: the worker runs from a bare interpreter inside bubblewrap and must not
depend on site-packages; the filter below is small enough to audit. It denies, with EPERM:
process creation (fork, vfork, clone without CLONE_THREAD or with namespace flags), exec,
ptrace, mount and namespace syscalls, sending signals to other processes, kernel-module,
BPF, keyring, perf and io_uring syscalls, and sockets of any family except AF_UNIX.
`clone3` returns ENOSYS so glibc falls back to `clone` for threads (threads stay allowed:
NumPy and some stdlib code start them). A syscall from another ABI (x32, i386) kills the
process. Supported architectures: x86_64 and aarch64.
"""

import ctypes
import errno
import os
import platform
import struct

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SECCOMP_SYSCALL = {"x86_64": 317, "aarch64": 277}

# Syscalls denied outright, by architecture (numbers from the kernel's syscall tables).
_DENIED = {
    "x86_64": {
        "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "ptrace": 101,
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272,
        "setns": 308, "bpf": 321, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "keyctl": 250,
        "add_key": 248, "request_key": 249, "perf_event_open": 298, "kill": 62,
        "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297,
        "process_vm_readv": 310, "process_vm_writev": 311, "userfaultfd": 323,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "name_to_handle_at": 303, "open_by_handle_at": 304, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "pidfd_open": 434, "pidfd_send_signal": 424, "pidfd_getfd": 438,
    },
    "aarch64": {
        "execve": 221, "execveat": 281, "ptrace": 117, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268, "bpf": 280,
        "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "keyctl": 219, "add_key": 217, "request_key": 218,
        "perf_event_open": 241, "kill": 129, "tkill": 130, "tgkill": 131,
        "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "process_vm_readv": 270,
        "process_vm_writev": 271, "userfaultfd": 282, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "name_to_handle_at": 264,
        "open_by_handle_at": 265, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "pidfd_open": 434,
        "pidfd_send_signal": 424, "pidfd_getfd": 438,
    },
}
_SOCKET = {"x86_64": 41, "aarch64": 198}
_CLONE = {"x86_64": 56, "aarch64": 220}
_CLONE3 = 435

_AF_UNIX = 1
_CLONE_THREAD = 0x00010000
_CLONE_NAMESPACES = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET

_LD_ABS_W = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06
_ALLOW = 0x7FFF0000
_KILL_PROCESS = 0x80000000
_OFFSET_NR, _OFFSET_ARCH, _OFFSET_ARG0 = 0, 4, 16
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1


def _errno(code: int) -> int:
    return 0x00050000 | code


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def build_program(arch: str) -> bytes:
    """The filter as raw `struct sock_filter` instructions for `arch` (see module docstring)."""
    prog = [
        _insn(_LD_ABS_W, 0, 0, _OFFSET_ARCH),
        _insn(_JEQ, 1, 0, _AUDIT_ARCH[arch]),
        _insn(_RET, 0, 0, _KILL_PROCESS),
        _insn(_LD_ABS_W, 0, 0, _OFFSET_NR),
    ]
    if arch == "x86_64":  # x32 ABI syscalls carry bit 30; they would bypass the table below
        prog += [_insn(_JGE, 0, 1, 0x40000000), _insn(_RET, 0, 0, _errno(errno.EPERM))]
    for number in sorted(_DENIED[arch].values()):
        prog += [_insn(_JEQ, 0, 1, number), _insn(_RET, 0, 0, _errno(errno.EPERM))]
    prog += [_insn(_JEQ, 0, 1, _CLONE3), _insn(_RET, 0, 0, _errno(errno.ENOSYS))]
    prog += [  # socket(domain, ...): only AF_UNIX
        _insn(_JEQ, 0, 4, _SOCKET[arch]),
        _insn(_LD_ABS_W, 0, 0, _OFFSET_ARG0),
        _insn(_JEQ, 0, 1, _AF_UNIX),
        _insn(_RET, 0, 0, _ALLOW),
        _insn(_RET, 0, 0, _errno(errno.EAFNOSUPPORT)),
    ]
    prog += [  # clone(flags, ...): threads only, no namespaces
        _insn(_JEQ, 0, 5, _CLONE[arch]),
        _insn(_LD_ABS_W, 0, 0, _OFFSET_ARG0),
        _insn(_JSET, 2, 0, _CLONE_NAMESPACES),
        _insn(_JSET, 0, 1, _CLONE_THREAD),
        _insn(_RET, 0, 0, _ALLOW),
        _insn(_RET, 0, 0, _errno(errno.EPERM)),
    ]
    prog.append(_insn(_RET, 0, 0, _ALLOW))
    return b"".join(prog)


def install() -> None:
    """Install the filter on every thread of this process; raises OSError if the kernel refuses."""
    arch = platform.machine()
    if arch not in _AUDIT_ARCH:
        raise OSError(errno.ENOSYS, f"seccomp filter: unsupported architecture {arch!r}")
    program = build_program(arch)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    buffer = ctypes.create_string_buffer(program, len(program))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(program) // 8, ctypes.addressof(buffer))
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(
        ctypes.c_long(_SECCOMP_SYSCALL[arch]),
        ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
        ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC),
        ctypes.byref(fprog),
    )
    if rc != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"seccomp(SET_MODE_FILTER) failed: {os.strerror(code)}")
