"""The Linux primitives the sandbox is made of, through ctypes: namespaces, mounts, capabilities, Landlock, seccomp.

Standard library only and no package-relative import: the launcher (launcher.py) and the python-backend stub
wrapper (stub.py) load this file by path in processes that have not imported Django or anything else, and the stub
wrapper runs it inside the sandbox with the runtime env's interpreter. seccomp filters are compiled by libseccomp
(libseccomp2, a dependency of apt, so present on every Debian and Ubuntu machine), which knows each architecture's
syscall numbers and closes the x32/i386 side doors.

Every function raises OSError (with errno) when the kernel refuses, so callers can say exactly what is missing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
from collections.abc import Iterable, Sequence

# --- libc -------------------------------------------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_libc.sethostname.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_libc_pointers = ctypes.CDLL(None, use_errno=True)  # its prctl takes a pointer (PR_SET_NAME)

# Syscalls glibc has no wrapper for everywhere; numbers differ only for pivot_root (the rest are in the unified
# table every architecture shares since Linux 5.1).
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
SYS_MOUNT_SETATTR = 442
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CLONE_NEWTIME = 0x00000080
NAMESPACE_FLAGS = (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID,
                   CLONE_NEWNET, CLONE_NEWTIME)

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8
AT_FDCWD = -100
AT_RECURSIVE = 0x8000

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), "unshare")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                       flags, data.encode() if data else None), f"mount {source or fstype} on {target}")


def umount(target: str, flags: int = MNT_DETACH) -> None:
    _check(_libc.umount2(target.encode(), flags), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    number = _PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"pivot_root: unknown syscall number on {platform.machine()}")
    _check(_libc.syscall(number, new_root.encode(), put_old.encode()), "pivot_root")


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def set_mount_flags(path: str, *, readonly: bool, nodev: bool = True, recursive: bool = True) -> None:
    """Make the mount at `path` (and, if `recursive`, every mount below it) nosuid, read-only or writable, and
    nodev unless it is a device node.

    mount_setattr(2) changes only the flags named, so the flags the parent user namespace locked (relatime, say)
    need no care; on kernels before 5.12 a bind remount carries those flags over by hand.
    """
    attr = _MountAttr(attr_set=MOUNT_ATTR_NOSUID | (MOUNT_ATTR_NODEV if nodev else 0)
                      | (MOUNT_ATTR_RDONLY if readonly else 0),
                      attr_clr=0 if readonly else MOUNT_ATTR_RDONLY)
    result = _libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode(), AT_RECURSIVE if recursive else 0,
                           ctypes.byref(attr), ctypes.sizeof(attr))
    if result == 0:
        return
    if ctypes.get_errno() != errno.ENOSYS:
        _check(result, f"mount_setattr {path}")
    st = os.statvfs(path)
    kept = 0
    for st_flag, ms_flag in ((os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, MS_NOATIME),
                             (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME)):
        if st.f_flag & st_flag:
            kept |= ms_flag
    mount(None, path, None, MS_REMOUNT | MS_BIND | MS_NOSUID | kept | (MS_NODEV if nodev else 0)
          | (MS_RDONLY if readonly else 0))


def set_process_name(name: str) -> None:
    """The name ps and /proc/<pid>/comm show (at most 15 bytes)."""
    buffer = ctypes.create_string_buffer(name.encode()[:15])
    _check(_libc_pointers.prctl(15, buffer, 0, 0, 0), "prctl(PR_SET_NAME)")


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_libc.sethostname(raw, len(raw)), "sethostname")


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return _check(_libc.prctl(option, arg2, arg3, arg4, arg5), f"prctl({option})")


def write_id_maps(pid: int | str, uid_map: str, gid_map: str, *, deny_setgroups: bool) -> None:
    """Write a user namespace's maps ("inside outside count" lines). `pid` may be "self"."""
    if deny_setgroups:
        _write_proc(f"/proc/{pid}/setgroups", "deny")
    _write_proc(f"/proc/{pid}/uid_map", uid_map)
    _write_proc(f"/proc/{pid}/gid_map", gid_map)


def _write_proc(path: str, text: str) -> None:
    # Without O_TRUNC: Landlock counts truncation as a right of its own, which /proc is not given.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# --- Capabilities -----------------------------------------------------------------------------------------------


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def drop_all_capabilities() -> None:
    """Empty the bounding, ambient, inheritable, permitted and effective sets of this process."""
    try:
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        if _libc.prctl(PR_CAPBSET_READ, cap, 0, 0, 0) != 1:
            continue  # not in the set (dropping it would need CAP_SETPCAP, which a confined process lacks)
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 and ctypes.get_errno() != errno.EINVAL:
            _check(-1, f"dropping capability {cap} from the bounding set")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL before Linux 4.3: nothing to clear
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


def set_no_new_privs() -> None:
    prctl(PR_SET_NO_NEW_PRIVS, 1)


# --- Landlock ---------------------------------------------------------------------------------------------------

LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_RULE_NET_PORT = 2

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

# Rights that apply to a file (the others only to directories: a rule on a file with them is EINVAL).
_FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
FS_READ = FS_READ_FILE | FS_READ_DIR
FS_READ_EXEC = FS_READ | FS_EXECUTE


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def landlock_abi() -> int:
    """The Landlock ABI version the kernel offers (0: none, or disabled at boot)."""
    result = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return int(result) if result > 0 else 0


def landlock_fs_rights(abi: int) -> int:
    """Every filesystem right the ABI can restrict."""
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def landlock_restrict(
    abi: int,
    rules: Iterable[tuple[str, int]],
    *,
    tcp_bind: Sequence[int] | None,
    tcp_connect: Sequence[int] | None,
    scopes: int,
) -> list[str]:
    """Restrict this process (and its future children) to `rules`: (path, rights) pairs; rights above the ABI are
    dropped. `tcp_bind` / `tcp_connect`: the only TCP ports allowed, or None to leave that right unrestricted.
    Needs no_new_privs. Returns what the ABI could not enforce, for the caller's notes."""
    missing: list[str] = []
    handled_fs = landlock_fs_rights(abi)
    handled_net = 0
    if abi >= 4:
        handled_net = ((NET_BIND_TCP if tcp_bind is not None else 0)
                       | (NET_CONNECT_TCP if tcp_connect is not None else 0))
    elif tcp_bind is not None or tcp_connect is not None:
        missing.append(f"TCP rules (Landlock ABI {abi} < 4)")
    scoped = scopes if abi >= 6 else 0
    if scopes and abi < 6:
        missing.append(f"abstract-socket and signal scoping (Landlock ABI {abi} < 6)")
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    attr = _RulesetAttr(handled_fs, handled_net, scoped)
    ruleset = _check(_libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0),
                     "landlock_create_ruleset")
    try:
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # an optional path (a /dev node the host lacks): nothing to allow
            try:
                if not os.path.isdir(path):
                    rights &= _FS_FILE_RIGHTS
                beneath = _PathBeneathAttr(rights & handled_fs, fd)
                _check(_libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                                     ctypes.byref(beneath), 0), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        if handled_net:
            for right, ports in ((NET_BIND_TCP, tcp_bind), (NET_CONNECT_TCP, tcp_connect)):
                for port in ports or ():
                    net = _NetPortAttr(right, port)
                    _check(_libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_NET_PORT, ctypes.byref(net), 0),
                           f"landlock_add_rule port {port}")
        _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return missing


# --- seccomp (through libseccomp) -------------------------------------------------------------------------------

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_FLTATR_CTL_OPTIMIZE = 8
SCMP_CMP_EQ = 4
SCMP_CMP_GE = 5
SCMP_CMP_MASKED_EQ = 7


def SCMP_ACT_ERRNO(code: int) -> int:  # noqa: N802 - libseccomp's own name
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


_seccomp: ctypes.CDLL | None = None


def libseccomp() -> ctypes.CDLL:
    global _seccomp
    if _seccomp is None:
        name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
        lib = ctypes.CDLL(name, use_errno=True)
        lib.seccomp_init.restype = ctypes.c_void_p
        lib.seccomp_init.argtypes = [ctypes.c_uint32]
        lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                               ctypes.POINTER(_ArgCmp)]
        lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        lib.seccomp_load.argtypes = [ctypes.c_void_p]
        lib.seccomp_release.argtypes = [ctypes.c_void_p]
        lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
        _seccomp = lib
    return _seccomp


# A rule: (syscall name, errno, [(argument index, comparison, a, b), ...]); all comparisons must hold.
Rule = tuple[str, int, Sequence[tuple[int, int, int, int]]]


def seccomp_load(rules: Iterable[Rule]) -> None:
    """Load a filter that allows every syscall except those `rules` match, which fail with their errno.
    Syscalls this architecture does not have are skipped (aarch64 has no `ioperm`, say)."""
    lib = libseccomp()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError(errno.ENOMEM, "seccomp_init failed")
    try:
        # A binary tree of syscall numbers instead of a list: every syscall the server makes passes the filter, and
        # most match no rule. (libseccomp < 2.5 lacks the attribute; it then keeps the list.)
        lib.seccomp_attr_set(ctypes.c_void_p(ctx), SCMP_FLTATR_CTL_OPTIMIZE, 2)
        for name, code, comparisons in rules:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:
                continue
            array = (_ArgCmp * max(1, len(comparisons)))(*[_ArgCmp(a, op, x, y) for a, op, x, y in comparisons])
            result = lib.seccomp_rule_add_array(ctx, SCMP_ACT_ERRNO(code), number, len(comparisons), array)
            if result < 0:
                raise OSError(-result, f"seccomp rule for {name}: {os.strerror(-result)}")
        result = lib.seccomp_load(ctx)
        if result < 0:
            raise OSError(-result, f"seccomp_load: {os.strerror(-result)}")
    finally:
        lib.seccomp_release(ctx)


AF_UNIX = 1
AF_INET = 2
AF_INET6 = 10
AF_NETLINK = 16
SOCK_STREAM = 1
MSG_FASTOPEN = 0x20000000
_AF_MAX = 64  # above every address family Linux defines (46 in 6.x)

# Never needed to serve a model, and each a way around the other layers or into the kernel's rarer corners.
_DENIED_EVERYWHERE = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "keyctl", "add_key", "request_key",
    "bpf", "perf_event_open", "userfaultfd", "fanotify_init", "lookup_dcookie",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick",
    "mount_setattr", "open_by_handle_at", "name_to_handle_at", "quotactl", "quotactl_fd",
    "swapon", "swapoff", "reboot", "acct", "settimeofday", "clock_settime", "clock_adjtime", "stime",
    "iopl", "ioperm", "vm86", "vm86old", "uselib", "nfsservctl", "syslog",
    # io_uring can open sockets and files without passing through the socket() rules below.
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)


def seccomp_rules(*, allowed_families: Sequence[int], inet_stream_only: bool, no_new_namespaces: bool,
                  netlink_route_only: bool = True) -> list[Rule]:
    """The deny rules of a sandbox layer.

    `allowed_families`: the socket address families that may be created (the rest fail with EAFNOSUPPORT; AF_VSOCK
    and friends are not network-namespaced, so an empty network namespace alone would not stop them).
    `inet_stream_only`: refuse UDP, raw and other non-TCP inet sockets (Landlock covers TCP only).
    `netlink_route_only`: of netlink, only NETLINK_ROUTE (what getaddrinfo reads); sock_diag would list the host's
    connections, audit and uevent sockets the host's events.
    `no_new_namespaces`: refuse unshare, setns and clone with namespace flags (clone3, whose flags the filter cannot
    see, answers ENOSYS so that libc falls back to clone)."""
    rules: list[Rule] = [(name, errno.EPERM, ()) for name in _DENIED_EVERYWHERE]
    for family in range(_AF_MAX):
        if family not in allowed_families:
            rules.append(("socket", errno.EAFNOSUPPORT, [(0, SCMP_CMP_EQ, family, 0)]))
            rules.append(("socketpair", errno.EAFNOSUPPORT, [(0, SCMP_CMP_EQ, family, 0)]))
    rules.append(("socket", errno.EAFNOSUPPORT, [(0, SCMP_CMP_GE, _AF_MAX, 0)]))
    rules.append(("socketpair", errno.EAFNOSUPPORT, [(0, SCMP_CMP_GE, _AF_MAX, 0)]))
    if netlink_route_only and AF_NETLINK in allowed_families:
        for protocol in range(1, 32):
            rules.append(("socket", errno.EPROTONOSUPPORT,
                          [(0, SCMP_CMP_EQ, AF_NETLINK, 0), (2, SCMP_CMP_EQ, protocol, 0)]))
    if inet_stream_only:
        for family in (AF_INET, AF_INET6):
            if family in allowed_families:
                for sock_type in (2, 3, 4, 5, 6, 10):  # DGRAM, RAW, RDM, SEQPACKET, DCCP, PACKET
                    rules.append(("socket", errno.EPERM,
                                  [(0, SCMP_CMP_EQ, family, 0), (1, SCMP_CMP_MASKED_EQ, 0xF, sock_type)]))
        # TCP Fast Open connects inside sendto/sendmsg; refuse it so that connect() stays the only way out.
        rules.append(("sendto", errno.EPERM, [(3, SCMP_CMP_MASKED_EQ, MSG_FASTOPEN, MSG_FASTOPEN)]))
        rules.append(("sendmsg", errno.EPERM, [(2, SCMP_CMP_MASKED_EQ, MSG_FASTOPEN, MSG_FASTOPEN)]))
        rules.append(("sendmmsg", errno.EPERM, [(3, SCMP_CMP_MASKED_EQ, MSG_FASTOPEN, MSG_FASTOPEN)]))
    if no_new_namespaces:
        rules += [("unshare", errno.EPERM, ()), ("setns", errno.EPERM, ()), ("clone3", errno.ENOSYS, ())]
        # clone(flags, ...): the flags are argument 0 on x86_64 and aarch64 alike.
        rules += [("clone", errno.EPERM, [(0, SCMP_CMP_MASKED_EQ, flag, flag)]) for flag in NAMESPACE_FLAGS]
    return rules


# --- Helpers ----------------------------------------------------------------------------------------------------


def close_fds_from(lowest: int) -> None:
    """Close every descriptor >= `lowest` (the sandbox must not inherit the launcher's); close_range(2) on Linux."""
    os.closerange(lowest, 2**31 - 1)
