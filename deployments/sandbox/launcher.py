"""Start one program (a deployment's tritonserver) inside a fresh sandbox. Run as its own process by
deployments.sandbox.spawn(); it reads its plan as JSON on stdin and answers one JSON line on stdout.

Three processes, because each kernel step needs the one before it:

  launcher (the portal's uid)  joins the deployment's cgroups, becomes a child subreaper, forks:
  setup     creates a user namespace; the launcher, still outside it, maps its root to the unprivileged sandbox
            uid (only a process outside may map another uid); setup then creates the mount, PID, IPC, UTS and
            cgroup namespaces, opens every path the sandbox may see while it can still reach them, becomes the
            namespace's root (the sandbox uid outside) and forks:
  init      PID 1 of the new PID namespace: builds a root filesystem from those paths on a tmpfs (read-only where
            asked), mounts a fresh /proc and a size-bounded /dev/shm, pivots into it, enters a last user namespace
            as uid 1000, drops every capability, sets no_new_privs, restricts itself with Landlock and seccomp and
            executes the program, which stays PID 1: when it exits the kernel kills everything else in the
            namespace, detached and double-forked processes included.

setup exits once init is forked, so init is reparented to the launcher, which waits for it and exits with its
status (the portal's Popen sees Triton's exit code). Standard library only: the portal starts it with `python -I -S`.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel  # noqa: E402 - loaded by path, see kernel.py
import stub  # noqa: E402 - for the capability check, which confines a stub the way stub.py does

# The root filesystem is built on a tmpfs mounted here, in the sandbox's private mount namespace (the host's /tmp
# is untouched); the paths to bind were opened beforehand, so hiding /tmp hides none of them.
NEW_ROOT = "/tmp"
DEVICES = ("null", "zero", "full", "random", "urandom")


def main() -> int:
    plan: dict[str, Any] = json.load(sys.stdin)
    sys.stdin.close()
    try:
        kernel.libseccomp()  # loaded now: inside the sandbox the host's library directories may look different
    except OSError as exc:
        return _answer({"error": f"libseccomp cannot be loaded ({exc}): install the libseccomp2 package"}, 1)
    kernel.set_process_name("mp-sandbox")  # what ps shows instead of "python3"
    try:
        for procs in plan.get("cgroup_procs", []):
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        kernel.prctl(kernel.PR_SET_CHILD_SUBREAPER, 1)
    except OSError as exc:
        return _answer({"error": f"cannot join the sandbox's cgroup: {exc}"}, 1)

    to_setup_r, to_setup_w = os.pipe()
    from_setup_r, from_setup_w = os.pipe()
    errors_r, errors_w = os.pipe2(os.O_CLOEXEC)
    setup = os.fork()
    if setup == 0:
        os.close(to_setup_w)
        os.close(from_setup_r)
        os.close(errors_r)
        _setup(plan, os.fdopen(to_setup_r, "rb", 0), os.fdopen(from_setup_w, "wb", 0), errors_w)
        os._exit(0)  # not reached
    os.close(to_setup_r)
    os.close(from_setup_w)
    os.close(errors_w)
    from_setup = os.fdopen(from_setup_r, "rb", 0)
    to_setup = os.fdopen(to_setup_w, "wb", 0)

    if from_setup.read(1) != b"u":  # setup died before creating its user namespace
        return _fail(errors_r, setup, "the sandbox could not create a user namespace")
    try:
        kernel.write_id_maps(setup, f"0 {plan['outer_uid']} 1", f"0 {plan['outer_gid']} 1",
                             deny_setgroups=not plan["privileged"])
    except OSError as exc:
        os.kill(setup, signal.SIGKILL)
        return _fail(errors_r, setup, f"cannot map the sandbox's user namespace to uid {plan['outer_uid']}: {exc}")
    to_setup.write(b"g")
    line = from_setup.readline()
    pid = int(line) if line.strip().isdigit() else 0
    os.waitpid(setup, 0)
    message = _read_all(errors_r)
    if message or not pid:
        if pid:
            _wait(pid)
        return _answer({"error": message.strip() or "the sandbox's setup process exited early"}, 1)
    if plan.get("probe"):
        status = _wait(pid)
        return _answer({"probe": "ok"} if status == 0 else {"error": f"the probe exited with status {status}"},
                       0 if status == 0 else 1)
    _answer({"pid": pid}, 0)
    return _wait(pid)


def _answer(message: dict[str, Any], code: int) -> int:
    try:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()
        sys.stdout.close()
    except OSError:
        pass
    return code


def _fail(errors_r: int, child: int, fallback: str) -> int:
    os.waitpid(child, 0)
    message = _read_all(errors_r).strip()
    return _answer({"error": message or fallback}, 1)


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _wait(pid: int) -> int:
    """Wait for `pid` (init, reparented to this subreaper), passing on what the portal may send this process."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, frame: _forward(pid, number))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0
        return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _forward(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def _report(errors_w: int, message: str) -> None:
    os.write(errors_w, message.encode(errors="replace")[:60000])


# --- setup: the new user namespace's first process ---------------------------------------------------------------


def _setup(plan: dict[str, Any], from_launcher: Any, to_launcher: Any, errors_w: int) -> None:
    try:
        kernel.unshare(kernel.CLONE_NEWUSER)
        to_launcher.write(b"u")
        if from_launcher.read(1) != b"g":
            os._exit(1)
        kernel.unshare(kernel.CLONE_NEWNS | kernel.CLONE_NEWPID | kernel.CLONE_NEWIPC | kernel.CLONE_NEWUTS
                       | kernel.CLONE_NEWCGROUP | (kernel.CLONE_NEWNET if plan.get("network") == "none" else 0))
        # Nothing mounted from here on may reach back into the host's mount namespace.
        kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)
        # Opened while this process is still its original uid (root can traverse /root, the sandbox uid cannot);
        # init mounts them through /proc/self/fd.
        opened = []
        for entry in plan["mounts"]:
            fd = os.open(entry["source"], os.O_PATH | os.O_CLOEXEC)
            opened.append((entry, fd, os.path.isdir(entry["source"])))
        devices = []
        for name in DEVICES:
            try:
                devices.append((name, os.open(f"/dev/{name}", os.O_PATH | os.O_CLOEXEC)))
            except FileNotFoundError:
                pass
        if plan["privileged"]:
            os.setgroups([])  # root's supplementary groups would still count for file access
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)  # the namespace's root: the sandbox uid outside, with capabilities only inside
    except OSError as exc:
        _report(errors_w, f"sandbox setup failed: {exc}")
        os._exit(1)
    init = os.fork()
    if init == 0:
        _init(plan, opened, devices, errors_w)
        os._exit(127)  # not reached
    to_launcher.write(f"{init}\n".encode())
    os._exit(0)


# --- init: PID 1 of the sandbox ------------------------------------------------------------------------------------


def _init(plan: dict[str, Any], opened: list[tuple[dict[str, Any], int, bool]], devices: list[tuple[str, int]],
          errors_w: int) -> None:
    step = "starting"
    try:
        step = "building the root filesystem"
        _build_root(plan, opened, devices)
        step = "entering the root filesystem"
        os.chdir(NEW_ROOT)
        kernel.pivot_root(".", ".")
        kernel.umount(".", kernel.MNT_DETACH)  # the host's tree, stacked on top by pivot_root(".", ".")
        os.chdir("/")
        kernel.sethostname(plan.get("hostname", "sandbox"))
        step = "entering the last user namespace"
        # The uid change in setup made this process non-dumpable, which gives its /proc/self files to the host's
        # root; dumpable again, they belong to it and it can write its own uid_map. (execve resets it anyway.)
        kernel.prctl(kernel.PR_SET_DUMPABLE, 1)
        kernel.unshare(kernel.CLONE_NEWUSER)
        inner_uid, inner_gid = plan["inner_uid"], plan["inner_gid"]
        kernel.write_id_maps("self", f"{inner_uid} 0 1", f"{inner_gid} 0 1", deny_setgroups=True)
        step = "restricting the process"
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        kernel.set_no_new_privs()
        if plan["landlock_abi"]:
            kernel.landlock_restrict(
                plan["landlock_abi"], [(rule[0], rule[1]) for rule in plan["landlock"]],
                tcp_bind=plan["tcp_bind"], tcp_connect=plan["tcp_connect"], scopes=plan["landlock_scopes"],
            )
        kernel.seccomp_load(kernel.seccomp_rules(allowed_families=plan["socket_families"],
                                                 inet_stream_only=not plan["udp"], no_new_namespaces=False))
        kernel.drop_all_capabilities()
        step = "starting the program"
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(2, 1)  # the launcher's stderr is the log file
        if null > 2:
            os.close(null)
        os.closerange(3, errors_w)
        kernel.close_fds_from(errors_w + 1)
        os.chdir(plan["cwd"])
        if plan.get("probe"):
            _probe_stub(errors_w)
        os.execve(plan["argv"][0], plan["argv"], plan["env"])
    except OSError as exc:
        _report(errors_w, f"sandbox setup failed while {step}: {exc}")
        os._exit(127)


def _probe_stub(errors_w: int) -> None:
    """The capability check's last step: confine a process the way stub.py confines a python model."""
    child = os.fork()
    if child == 0:
        try:
            stub.confine("none", [], {"/dev/shm"})
        except OSError as exc:
            _report(errors_w, f"a python model's confinement failed: {exc}")
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(child, 0)
    os._exit(0 if status == 0 else 1)


def _build_root(plan: dict[str, Any], opened: list[tuple[dict[str, Any], int, bool]],
                devices: list[tuple[str, int]]) -> None:
    kernel.mount("tmpfs", NEW_ROOT, "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV, "mode=0755,size=4m,nr_inodes=4096")
    ordered = sorted(opened, key=lambda item: item[0]["target"].count("/"))
    for entry, fd, is_dir in ordered:
        where = NEW_ROOT + entry["target"]
        _mountpoint(where, is_dir)
        kernel.mount(f"/proc/self/fd/{fd}", where, None, kernel.MS_BIND | kernel.MS_REC)
    for entry, _, _ in ordered:
        kernel.set_mount_flags(NEW_ROOT + entry["target"], readonly=not entry["writable"])
    for link, target in plan.get("symlinks", {}).items():
        os.makedirs(os.path.dirname(NEW_ROOT + link), exist_ok=True)
        os.symlink(target, NEW_ROOT + link)
    for path, content in plan.get("files", {}).items():
        os.makedirs(os.path.dirname(NEW_ROOT + path), exist_ok=True)
        with open(NEW_ROOT + path, "w") as f:
            f.write(content)
        os.chmod(NEW_ROOT + path, 0o644)
    # /dev: the harmless character devices, bound from the host's (a tmpfs made in a user namespace cannot hold
    # device nodes), plus the usual links and a private, size-bounded /dev/shm for the python backend's tensors.
    os.makedirs(NEW_ROOT + "/dev", exist_ok=True)
    for name, fd in devices:
        _mountpoint(f"{NEW_ROOT}/dev/{name}", False)
        kernel.mount(f"/proc/self/fd/{fd}", f"{NEW_ROOT}/dev/{name}", None, kernel.MS_BIND)
        kernel.set_mount_flags(f"{NEW_ROOT}/dev/{name}", readonly=False, nodev=False, recursive=False)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{NEW_ROOT}/dev/{name}")
    os.makedirs(NEW_ROOT + "/dev/shm")
    kernel.mount("tmpfs", NEW_ROOT + "/dev/shm", "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV,
                 f"mode=1777,size={int(plan['shm_bytes'])}")
    os.makedirs(NEW_ROOT + "/proc")
    kernel.mount("proc", NEW_ROOT + "/proc", "proc", kernel.MS_NOSUID | kernel.MS_NODEV | kernel.MS_NOEXEC)
    # The tmpfs itself (mount points, /etc files) is read-only once built.
    kernel.set_mount_flags(NEW_ROOT, readonly=True, recursive=False)


def _mountpoint(path: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(path, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if not os.path.exists(path):
            open(path, "w").close()


if __name__ == "__main__":
    sys.exit(main())
