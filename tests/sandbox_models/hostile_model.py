"""A team member's python model that tries to escape (tests/test_sandbox_hostile.py uploads it as model.py).

It reads what to go after from targets.json, shipped in its own archive: the portal's paths, ports, the test
process's pid, another team's deployment. initialize() and execute() both run every attempt; execute() answers
with the results as JSON: {"initialize": {name: {"escaped": bool, "detail": str}}, "execute": {...}}. An attempt
"escaped" when it reached what it must not; any error is reported with its message, so that a bug in an attempt
shows (the unsandboxed control run proves each attempt can succeed where nothing stops it).
"""

import ctypes
import json
import os
import platform
import socket
import subprocess
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.abspath(__file__))
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
X86_64 = platform.machine() == "x86_64"
# Mount points every host has and a sandbox never mounts (it shows a few CPU files of /sys, no /dev/pts).
HOST_ONLY_MOUNTS = {"/sys", "/dev/pts", "/sys/fs/cgroup"}


class Denied(Exception):
    pass


def expect(condition, detail, otherwise="not reached"):
    if not condition:
        raise Denied(otherwise)
    return detail


def errno_text():
    code = ctypes.get_errno()
    return f"errno {code} ({os.strerror(code)})"


def read(path, size=200):
    with open(path, "rb") as f:
        return f.read(size)


def connect(family, address, timeout=2.0):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(address)
        return f"connected to {address!r}"


def attempts(t):
    token = t["token"]
    ppid = os.getppid()
    scratch = os.environ.get("HOME") or "/tmp"

    def env_secret():
        names = [n for n in (t["planted_name"], "DJANGO_SETTINGS_MODULE", "MODELPORT_TEST_DB", "SECRET_KEY",
                             "DATABASE_URL", "PYTEST_CURRENT_TEST", "AWS_SECRET_ACCESS_KEY") if n in os.environ]
        return expect(names, f"found {names}",
                      f"none of the portal's variables; the environment is {sorted(os.environ)}")

    def write_var():
        path = os.path.join(t["var_dir"], f"pwned-{token}")
        with open(path, "w") as f:
            f.write("pwned")
        return f"wrote {path}"

    def write_runtime_env():
        path = os.path.join(os.path.dirname(np.__file__), f"pwned-{token}.py")
        with open(path, "w") as f:
            f.write("pwned = True\n")
        os.unlink(path)
        return f"wrote {path}"

    def write_own_repository():
        path = os.path.join(HERE, f"pwned-{token}")
        with open(path, "w") as f:
            f.write("pwned")
        os.unlink(path)
        return f"wrote {path}"

    def proc_listing():
        seen = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    argv0 = read(f"/proc/{entry}/cmdline", 300).split(b"\0")[0].decode(errors="replace")
                except OSError:
                    continue
                seen[entry] = os.path.basename(argv0)
        own = {"tritonserver", "triton_python_backend_stub", "bash", "sh", "sleep", ""}
        foreign = {pid: name for pid, name in seen.items() if name not in own and not name.startswith("hostile-")}
        return expect(foreign or len(seen) > 40, f"{len(seen)} processes, foreign: {dict(list(foreign.items())[:10])}",
                      f"only the sandbox's own processes: {seen}")

    def other_shm():
        mine = sorted(os.listdir("/dev/shm"))
        opened = []
        for name in t["other_shm"]:
            try:
                with open(f"/dev/shm/{name}", "rb") as f:
                    f.read(16)
                opened.append(name)
            except OSError:
                pass
        return expect(opened, f"opened {opened}",
                      f"none of {len(t['other_shm'])} foreign regions; /dev/shm holds {mine}")

    def host_devices():
        present = sorted(set(os.listdir("/dev")) & {"vda", "sda", "kvm", "kmsg", "mem", "port", "loop0", "fuse"})
        return expect(present, f"host devices {present}", f"/dev holds {sorted(os.listdir('/dev'))}")

    def host_passwd():
        text = read("/etc/passwd", 4096).decode()
        return expect("root:x:0:0" in text, "the host's /etc/passwd", f"a passwd of its own: {text.strip()!r}")

    def udp(address):
        def send():
            family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.sendto(f"pwned-{token}".encode(), address)
            return f"sent a datagram to {address!r}"
        return send

    def socket_of(family, kind, protocol=0):
        def create():
            s = socket.socket(family, kind, protocol)
            s.close()
            return f"created a socket ({family}, {kind}, {protocol})"
        return create

    def detached_process():
        # setsid + double fork: the grandchild belongs to no one; its name lets the test find it from outside.
        child = os.fork()
        if child == 0:
            os.setsid()
            if os.fork() == 0:
                null = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.execv("/bin/sleep", [f"hostile-detached-{token}", "3600"])
            os._exit(0)
        os.waitpid(child, 0)
        return "spawned"

    def signal_test_process():
        os.kill(t["test_pid"], 0)
        return f"signalled pid {t['test_pid']}"

    def ptrace_server():
        if libc.ptrace(0x4206, ppid, 0, 0) == 0:  # PTRACE_SEIZE does not stop the tracee
            libc.ptrace(17, ppid, 0, 0)  # PTRACE_DETACH
            return f"seized pid {ppid}"
        raise Denied(errno_text())

    def server_memory():
        with open(f"/proc/{ppid}/mem", "rb"):
            return f"opened /proc/{ppid}/mem"

    def capabilities():
        status = read("/proc/self/status", 8192).decode()
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        effective = int(fields["CapEff"].strip(), 16)
        bounding = int(fields["CapBnd"].strip(), 16)
        return expect(effective or bounding, f"CapEff {effective:x} CapBnd {bounding:x}",
                      f"CapEff 0, CapBnd 0, NoNewPrivs {fields['NoNewPrivs'].strip()}, Seccomp "
                      f"{fields['Seccomp'].strip()}")

    def no_new_privs():
        status = read("/proc/self/status", 8192).decode()
        value = [line.split()[1] for line in status.splitlines() if line.startswith("NoNewPrivs:")][0]
        return expect(value != "1", f"NoNewPrivs {value}", "NoNewPrivs 1")

    def running_as_root():
        # The uid outside is checked by the test from the host; from inside, the map shows one uid, not root's.
        uid_map = " ".join(read("/proc/self/uid_map").decode().split())
        return expect(os.geteuid() == 0, f"uid 0, uid_map {uid_map}", f"uid {os.geteuid()}, uid_map {uid_map}")

    def setuid_root():
        os.setuid(0)
        return expect(os.geteuid() == 0, "became uid 0")

    def setuid_binary():
        directory = os.path.join(scratch, f"mnt-{token}")
        os.makedirs(directory, exist_ok=True)
        result = subprocess.run(["/usr/bin/mount", "-t", "tmpfs", "none", directory], capture_output=True, timeout=10)
        mounted = os.path.ismount(directory)
        if mounted:
            subprocess.run(["/usr/bin/umount", directory], capture_output=True, timeout=10)
        return expect(mounted, "the setuid mount binary mounted a tmpfs",
                      f"exit {result.returncode}: {result.stderr.decode(errors='replace').strip()[:150]}")

    def mount_syscall():
        directory = os.path.join(scratch, f"mnt2-{token}")
        os.makedirs(directory, exist_ok=True)
        if libc.mount(b"none", directory.encode(), b"tmpfs", 0, None) == 0:
            libc.umount2(directory.encode(), 2)
            return "mounted a tmpfs"
        raise Denied(errno_text())

    def new_user_namespace():
        # In a child, so that a success does not change this process.
        child = os.fork()
        if child == 0:
            os._exit(0 if libc.unshare(0x10000000) == 0 else 1)
        _, status = os.waitpid(child, 0)
        return expect(os.waitstatus_to_exitcode(status) == 0, "created a user namespace (full capabilities in it)")

    def chown_to_root():
        path = os.path.join(scratch, f"chown-{token}")
        open(path, "w").close()
        os.chown(path, 0, 0)
        return "chowned a file to root"

    def device_node():
        path = os.path.join(scratch, f"dev-{token}")
        os.mknod(path, 0o20600, os.makedev(1, 3))
        os.unlink(path)
        return "made a device node"

    def raw_syscall(number, *args):
        def call():
            if not X86_64:
                raise Denied("x86_64 syscall numbers only")
            result = libc.syscall(number, *args)
            if result >= 0:
                return f"syscall {number} returned {result}"
            raise Denied(errno_text())
        return call

    def kernel_log():
        buffer = ctypes.create_string_buffer(4096)
        if libc.klogctl(3, buffer, 4096) > 0:  # SYSLOG_ACTION_READ_ALL
            return "read the kernel log"
        raise Denied(errno_text())

    def server_files(name):
        """/proc/<pid>/<name> of the server (the stub's parent) and of PID 1, whichever it can open."""
        found = {}
        for pid in dict.fromkeys((ppid, 1)):
            try:
                found[pid] = read(f"/proc/{pid}/{name}", 1_000_000).decode(errors="replace")
            except OSError as exc:
                found[pid] = exc
        texts = {pid: text for pid, text in found.items() if isinstance(text, str)}
        if not texts:
            raise Denied("; ".join(f"/proc/{pid}/{name}: {exc}" for pid, exc in found.items()))
        return texts

    def admin_key():
        # Triton takes its admin key on its command line (--http-restricted-api=...:modelport-admin-key=<key>):
        # any process's cmdline holding it, the server's first.
        pids = [ppid, 1] + [int(e) for e in os.listdir("/proc") if e.isdigit()]
        for pid in dict.fromkeys(pids):
            try:
                argv = read(f"/proc/{pid}/cmdline", 100_000).split(b"\0")
            except OSError:
                continue
            keys = [a.split(b"modelport-admin-key=", 1)[1] for a in argv if b"modelport-admin-key=" in a]
            if keys:
                return f"pid {pid}'s admin key {keys[0][:6].decode(errors='replace')}..."
        raise Denied(f"no command line with the key among {len(set(pids))} processes it can see")

    def host_sockets(name, wanted):
        def probe():
            texts = server_files(f"net/{name}")
            hits = {pid: [w for w in wanted if w in text] for pid, text in texts.items()}
            return expect(any(hits.values()), f"the host's {name} table: {hits}",
                          f"only its own table: {hits}")
        return probe

    def host_mounts(pid_files, field=4):
        # mountinfo has the mount point in field 4, mounts in field 1.
        def probe():
            seen = {}
            for label, text in pid_files().items():
                points = [line.split()[field] for line in text.splitlines() if len(line.split()) > field]
                seen[label] = sorted(set(points) & HOST_ONLY_MOUNTS)
            return expect(any(seen.values()), f"the host's mounts: {seen}", f"no host mount among them: {seen}")
        return probe

    def own_files(name):
        def read_own():
            return {"self": read(f"/proc/self/{name}", 1_000_000).decode(errors="replace")}
        return read_own

    def dns():
        socket.setdefaulttimeout(3)
        return f"resolved {socket.getaddrinfo('pypi.org', 443)[0][4]}"

    ports = t["ports"]
    # /proc/net/tcp writes ports as 4 hex digits after the address; the canary's abstract socket shows as @name.
    other_port = f":{ports['other_triton']:04X} "
    everything = {
        # The environment and files of the portal
        "env_secret": env_secret,
        "read_secret_key": lambda: read(t["secret_key"]),
        "read_sqlite_database": lambda: read(t["sqlite"], 16),
        "list_artifacts": lambda: expect(os.listdir(t["artifacts"]) is not None, os.listdir(t["artifacts"])[:5]),
        "list_deployments": lambda: os.listdir(t["deployments_dir"]),
        "read_other_repository": lambda: read(os.path.join(t["other_repository"], t["other_model"], "config.pbtxt")),
        "read_portal_source": lambda: read(t["source_file"]),
        "write_var": write_var,
        "write_own_repository": write_own_repository,
        "read_etc_shadow": lambda: read("/etc/shadow"),
        "list_root_home": lambda: os.listdir("/root"),
        "host_passwd": host_passwd,
        "host_devices": host_devices,
        "cgroup_filesystem": lambda: os.listdir("/sys/fs/cgroup"),
        # Other processes
        "read_test_process_environ": lambda: read(f"/proc/{t['test_pid']}/environ", 100000).count(b"\0"),
        "read_server_environ": lambda: read(f"/proc/{ppid}/environ", 100000).count(b"\0"),
        "list_processes": proc_listing,
        "signal_test_process": signal_test_process,
        "other_deployments_shm": other_shm,
        # The network
        "tcp_portal": lambda: connect(socket.AF_INET, ("127.0.0.1", ports["portal"])),
        "tcp_portal_ipv6": lambda: connect(socket.AF_INET6, ("::1", ports["portal_ipv6"])),
        "tcp_redis": lambda: connect(socket.AF_INET, ("127.0.0.1", 6379)),
        "tcp_postgresql": lambda: connect(socket.AF_INET, ("127.0.0.1", 5432)),
        "unix_postgresql": lambda: connect(socket.AF_UNIX, "/var/run/postgresql/.s.PGSQL.5432"),
        "tcp_other_triton": lambda: connect(socket.AF_INET, ("127.0.0.1", ports["other_triton"])),
        "tcp_outside": lambda: connect(socket.AF_INET, ("1.1.1.1", 443), timeout=3),
        "unix_abstract_socket": lambda: connect(socket.AF_UNIX, "\0" + t["abstract_name"]),
        "udp_portal": udp(("127.0.0.1", ports["udp"])),
        "udp_outside": udp(("8.8.8.8", 53)),
        "dns_lookup": dns,
        "vsock_socket": socket_of(40, socket.SOCK_STREAM),  # AF_VSOCK: to the VM's host, in no network namespace
        "packet_socket": socket_of(17, socket.SOCK_RAW),  # AF_PACKET
        "netlink_sock_diag": socket_of(16, socket.SOCK_RAW, 4),  # lists every connection of the network namespace
        # What /proc shows of the server, which listens in the host's network namespace
        "server_admin_key": admin_key,
        "server_tcp_table": host_sockets("tcp", [other_port]),
        "server_tcp6_table": host_sockets("tcp6", [f":{ports['portal_ipv6']:04X} "]),
        "server_unix_table": host_sockets("unix", ["@" + t["abstract_name"], "/var/run/postgresql", "/run/"]),
        "server_mountinfo": host_mounts(lambda: server_files("mountinfo")),
        "server_mounts": host_mounts(lambda: server_files("mounts"), field=1),
        "own_mountinfo": host_mounts(own_files("mountinfo")),
        "proc_net_tcp": lambda: expect(other_port in read("/proc/net/tcp", 1_000_000).decode(),
                                       "the host's tcp table at /proc/net/tcp"),
    }
    if not t["control"]:
        # Attempts that would change the host if they worked: only where the sandbox must stop them.
        everything.update({
            "detached_process": detached_process,
            "write_runtime_env": write_runtime_env,  # the runtime env is shared: never written by the control run
            "ptrace_server": ptrace_server,
            "read_server_memory": server_memory,
            "process_vm_readv": raw_syscall(310, ppid, 0, 0, 0, 0, 0),
            "capabilities": capabilities,
            "no_new_privs": no_new_privs,
            "running_as_root": running_as_root,
            "setuid_root": setuid_root,
            "setuid_binary": setuid_binary,
            "mount": mount_syscall,
            "new_user_namespace": new_user_namespace,
            "chown_to_root": chown_to_root,
            "device_node": device_node,
            "keyctl": raw_syscall(250, 1, 0),  # KEYCTL_JOIN_SESSION_KEYRING
            "io_uring": raw_syscall(425, 1, ctypes.byref(ctypes.create_string_buffer(120))),
            "bpf": raw_syscall(321, 0, 0, 0),  # BPF_MAP_CREATE with no attributes
            "kernel_log": kernel_log,
            "sysrq_trigger": lambda: open("/proc/sysrq-trigger", "w").close(),  # noqa: SIM115 - opened, never written
        })
    else:
        everything["detached_process"] = detached_process
    return everything


def run_all(t, skip=()):
    results = {}
    for name, attempt in attempts(t).items():
        if name in skip:
            continue
        try:
            detail = attempt()
            results[name] = {"escaped": True, "detail": repr(detail)[:400]}
        except Denied as exc:
            results[name] = {"escaped": False, "detail": str(exc)[:400]}
        except Exception as exc:  # noqa: BLE001 - every way of failing is a result here
            results[name] = {"escaped": False, "detail": f"{type(exc).__name__}: {exc}"[:400]}
    return results


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(HERE, "targets.json")) as f:
            self.targets = json.load(f)
        self.at_initialize = run_all(self.targets)

    def execute(self, requests):
        # The detached process is spawned once (at initialize); here everything else again, now that Triton serves.
        at_execute = run_all(self.targets, skip=("detached_process",))
        report = json.dumps({"initialize": self.at_initialize, "execute": at_execute, "pid": os.getpid(),
                             "python": sys.version.split()[0]})
        return [pb_utils.InferenceResponse([pb_utils.Tensor("report", np.array([report.encode()], dtype=np.object_))])
                for _ in requests]
