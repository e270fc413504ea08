"""Start one program (a deployment's tritonserver) inside a fresh sandbox. Run as its own process by
modelport.core.sandbox.spawn(); it reads its plan as JSON on stdin and answers one JSON line on stdout.

Three processes, because each kernel step needs the one before it:

  launcher (the portal's uid)  lowers its CPU priority (plan "nice", inherited by all it starts), joins the
            deployment's cgroups, becomes a child subreaper, forks:
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
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernel  # noqa: E402 - loaded by path, see kernel.py
import stub  # noqa: E402 - for the capability check, which confines a stub the way stub.py does

# The root filesystem is built on a tmpfs mounted here, in the sandbox's private mount namespace (the host's /tmp
# is untouched); the paths to bind were opened beforehand, so hiding /tmp hides none of them.
NEW_ROOT = "/tmp"
DEVICES = ("null", "zero", "full", "random", "urandom")
# The capability probe's status when its confined stub could read PID 1's /proc entries (no Landlock here).
PROBE_SERVER_VISIBLE = 3


def main() -> int:
    parent = os.getppid()
    plan: dict[str, Any] = json.load(sys.stdin)
    sys.stdin.close()
    try:
        kernel.libseccomp()  # loaded now: inside the sandbox the host's library directories may look different
    except OSError as exc:
        return _answer({"error": f"libseccomp cannot be loaded ({exc}): install the libseccomp2 package"}, 1)
    kernel.set_process_name("mp-sandbox")  # what ps shows instead of "python3"
    lower_priority(int(plan.get("nice", 0)))
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
        if status == PROBE_SERVER_VISIBLE:
            return _answer({"probe": "ok", "note": "python models can read the server's /proc entries (its command "
                            "line with the admin key, its socket tables): that needs Landlock"}, 0)
        return _answer({"probe": "ok"} if status == 0 else {"error": f"the probe exited with status {status}"},
                       0 if status == 0 else 1)
    _answer({"pid": pid}, 0)
    if plan.get("die_with_parent"):
        _die_with_parent(pid, parent)
    return _wait(pid)


def lower_priority(nice: int) -> None:
    """Run at CPU priority `nice` (0 to 19), and so does everything started from here: nice values are inherited.
    Raising one's own nice value needs no privilege; nothing in the sandbox can lower it again (that needs
    CAP_SYS_NICE outside its user namespaces)."""
    if nice <= 0:
        return
    # Never above what the portal already runs at (an operator may have niced it): only lowered from there.
    nice = max(min(nice, 19), os.getpriority(os.PRIO_PROCESS, 0))
    os.setpriority(os.PRIO_PROCESS, 0, nice)
    # With autogroups on (kernel.sched_autogroup_enabled, the default of many distributions), the kernel shares
    # the CPUs between sessions first, and a nice value orders tasks only within one: measured, Triton reniced alone
    # changed nothing for the gateway. This launcher leads a session of its own (start_new_session), so its group
    # gets the same value. Without autogroups the file is missing and the nice value above is what counts. An
    # unprivileged write is refused (EAGAIN) within a tenth of a second of another one on the machine: retried.
    for _ in range(40):
        try:
            fd = os.open("/proc/self/autogroup", os.O_WRONLY)
        except OSError:
            return
        try:
            os.write(fd, str(nice).encode())
            return
        except BlockingIOError:
            time.sleep(0.025)
        except OSError:
            return
        finally:
            os.close(fd)


def _die_with_parent(pid: int, parent: int) -> None:
    """A one-shot run (a trial run at inspection) ends when the process that started it dies, killed at a time limit
    say: no sweep knows of it, and uploaded code must not run on. PID 1 of a PID namespace ignores every signal from
    outside but SIGKILL, so this process sends that. (The kernel sends the death signal when the thread that started
    this process ends: one-shot runs are started from a worker's long-lived thread.)"""
    signal.signal(signal.SIGUSR1, lambda number, frame: os.kill(pid, signal.SIGKILL))
    kernel.prctl(kernel.PR_SET_PDEATHSIG, signal.SIGUSR1)
    if os.getppid() != parent:  # it died before the line above
        os.kill(pid, signal.SIGKILL)


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
            if entry.get("tmpfs_bytes") or entry.get("in_tmpfs"):
                opened.append((entry, -1, True))  # a tmpfs made by init: nothing of the host's to open
                continue
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
    """The capability check's last step: confine a process the way stub.py confines a python model, and see
    whether it can still read this process's /proc entries, as a model would read the server's."""
    child = os.fork()
    if child == 0:
        try:
            stub.confine("none", [], {"/dev/shm"})
        except OSError as exc:
            _report(errors_w, f"a python model's confinement failed: {exc}")
            os._exit(1)
        try:
            with open("/proc/1/cmdline", "rb"):
                os._exit(PROBE_SERVER_VISIBLE)
        except OSError:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code in (0, PROBE_SERVER_VISIBLE) else 1)


def _build_root(plan: dict[str, Any], opened: list[tuple[dict[str, Any], int, bool]],
                devices: list[tuple[str, int]]) -> None:
    kernel.mount("tmpfs", NEW_ROOT, "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV, "mode=0755,size=4m,nr_inodes=4096")
    # Size-bounded tmpfs instead of a host directory (a deployment's scratch): a write past it fails with ENOSPC and
    # the host's disk is never touched; its pages are charged to the memory cgroup of whoever writes them. Each is
    # mounted at a staging point first and bound into place below in the same order as every other mount, so
    # that a mount of a parent directory (/tmp, say) never hides it.
    staged: dict[str, str] = {}
    for entry, _, _ in opened:
        if entry.get("tmpfs_bytes"):
            staging = f"{NEW_ROOT}/.tmpfs-{len(staged)}"
            os.mkdir(staging, 0o700)
            kernel.mount("tmpfs", staging, "tmpfs", kernel.MS_NOSUID | kernel.MS_NODEV,
                         f"mode=0700,size={int(entry['tmpfs_bytes'])}")
            for name in entry.get("tmpfs_dirs", []):
                os.mkdir(f"{staging}/{name}", 0o700)
            staged[entry["target"]] = staging
    ordered = sorted(opened, key=lambda item: item[0]["target"].count("/"))
    for entry, fd, is_dir in ordered:
        where = NEW_ROOT + entry["target"]
        _mountpoint(where, is_dir)
        if entry.get("tmpfs_bytes"):
            kernel.mount(staged[entry["target"]], where, None, kernel.MS_BIND)
        elif entry.get("in_tmpfs"):
            inner = os.path.relpath(entry["source"], entry["in_tmpfs"])
            kernel.mount(f"{staged[entry['in_tmpfs']]}/{inner}", where, None, kernel.MS_BIND)
        else:
            kernel.mount(f"/proc/self/fd/{fd}", where, None, kernel.MS_BIND | kernel.MS_REC)
    for staging in staged.values():
        kernel.umount(staging, kernel.MNT_DETACH)  # the binds keep the tmpfs; its staging point goes
        os.rmdir(staging)
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
    # hidepid=2 ("invisible"): a process sees /proc/<pid> only of the processes it may ptrace-read. A python model
    # runs in a Landlock domain nested in the server's, which the kernel counts as unable to ptrace the server, so
    # /proc/1 (Triton's command line with its admin key, its socket tables in net/, which are the host's, its
    # mountinfo) does not exist for it; /proc/self and /proc/net (a link to /proc/self/net) show its own.
    kernel.mount("proc", NEW_ROOT + "/proc", "proc", kernel.MS_NOSUID | kernel.MS_NODEV | kernel.MS_NOEXEC,
                 "hidepid=2")
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
