"""The python-backend stub wrapper: the last step before a team's model.py runs.

Triton starts one stub process per python model instance (`bash -c "exec <backend dir>/python/
triton_python_backend_stub <args>"`); in a sandboxed backend directory that file is a small script that calls
`main()` here with the real stub's path. Triton (trusted NVIDIA code) must listen on its ports, but the stub only
talks to it through shared memory in /dev/shm, so the stub can go further than the server:

- a network namespace of its own, with only a loopback interface (unless the operator allowed this deployment
  egress): no TCP, UDP or anything else reaches the host or other deployments;
- a Landlock domain nested in the server's: the same filesystem view, and no ptrace of (or /proc/<pid>/mem
  access to) the server, whose domain is less restricted;
- seccomp: no new namespaces, no ptrace, io_uring, keyrings, bpf, ... (kernel.seccomp_rules).

In a pool's Triton (MODELPORT_STUB_PLACEMENT_SECONDS set) the wrapper first waits until the portal has moved it
into its model's own memory cgroup (deployments/runtimes/local/pool_memory.py), so that no model code runs charged
to the server's.

Standard library only; runs with the runtime env's interpreter as `python -IS`.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import sys
import time

import kernel  # the script that calls main() puts this directory first on sys.path

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def main(real_stub: str) -> None:
    if len(sys.argv) == 1:
        # Triton first runs the stub without arguments and expects status 1; anything else makes it try to
        # chmod the file (which is read-only here).
        sys.exit(1)
    placement = os.environ.get("MODELPORT_STUB_PLACEMENT_SECONDS", "")
    if placement:
        try:
            _wait_for_placement(float(placement))
        except (OSError, ValueError) as exc:
            sys.stderr.write(f"modelport sandbox: {exc}\n")
            sys.exit(2)
    net = os.environ.get("MODELPORT_SANDBOX_NET", "none")
    writable = {os.environ.get("HOME", ""), os.environ.get("TMPDIR", ""), "/tmp", "/dev/shm"} - {""}
    try:
        egress_ports = [int(p) for p in os.environ.get("MODELPORT_SANDBOX_EGRESS_PORTS", "").split(",") if p.strip()]
        confine(net, egress_ports, writable)
    except (OSError, ValueError) as exc:
        # Never run the model less confined than planned: fail the instance, with the reason in Triton's log.
        sys.stderr.write(f"modelport sandbox: could not confine the python model: {exc}\n")
        sys.exit(2)
    os.execv(real_stub, [real_stub, *sys.argv[1:]])


def _wait_for_placement(seconds: float) -> None:
    """Wait until this process is in a cgroup below the sandbox's own (its cgroup namespace's root, "/"): its model's
    memory cgroup, which the portal moves it into. Never run the model charged to the whole server: OSError after
    `seconds`."""
    deadline = time.monotonic() + seconds
    while not _placed():
        if time.monotonic() > deadline:
            raise OSError(f"this model's process was not given its memory cgroup within {seconds:g} s")
        time.sleep(0.02)


def _placed() -> bool:
    with open("/proc/self/cgroup") as handle:
        for line in handle:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return path.strip() not in ("", "/")
    return False


def confine(net: str, egress_ports: list[int], writable: set[str]) -> None:
    """Everything but the exec (the launcher's capability check runs this too). `net`: "none" or "egress"."""
    if net == "none":
        _enter_empty_network()
    abi = kernel.landlock_abi()
    if abi:
        rules = [("/", kernel.FS_READ_EXEC)]
        rules += [(path, kernel.landlock_fs_rights(abi)) for path in sorted(writable)]
        rules += [(path, kernel.FS_READ_FILE | kernel.FS_WRITE_FILE | kernel.FS_TRUNCATE) for path in _WRITABLE_DEVICES]
        kernel.landlock_restrict(abi, rules, tcp_bind=[], tcp_connect=egress_ports if net == "egress" else [],
                                 scopes=kernel.SCOPE_ABSTRACT_UNIX_SOCKET)
    kernel.seccomp_load(kernel.seccomp_rules(
        allowed_families=(kernel.AF_UNIX, kernel.AF_INET, kernel.AF_INET6, kernel.AF_NETLINK),
        inet_stream_only=net != "egress", no_new_namespaces=True))
    kernel.drop_all_capabilities()


def _enter_empty_network() -> None:
    """A new network namespace (inside a new user namespace, the only way to get one without privileges) whose
    loopback is up: local-only networking keeps working for libraries that expect it, nothing else exists."""
    uid, gid = os.getuid(), os.getgid()
    kernel.unshare(kernel.CLONE_NEWUSER | kernel.CLONE_NEWNET)
    kernel.write_id_maps("self", f"{uid} {uid} 1", f"{gid} {gid} 1", deny_setgroups=True)
    # Any socket of the namespace takes interface ioctls; a unix one passes the server's seccomp filter.
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


