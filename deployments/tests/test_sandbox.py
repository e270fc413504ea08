"""The sandbox's pieces that need no Triton: quantities, the launcher's plan, seccomp rules, cgroups on a fake
hierarchy, the capability check (a real throw-away sandbox on this machine), the stub wrapper's probe answer, and
the fail-closed and operator-only rules of the API and the admin console."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from audit.models import AuditEntry
from deployments.launch import Launch
from deployments.models import Deployment, Event, TritonServer
from deployments.revision_spec import RevisionSpec
from deployments.runtimes.base import RuntimeUnavailable
from deployments.runtimes.local import backends, serverlog
from deployments.runtimes.local import confined as local_confined
from deployments.runtimes.local import runtime as local
from infra import sandbox_settings
from modelport.core import sandbox
from modelport.core.sandbox import cgroups, kernel
from tests.sandbox_helpers import admin_change
from tests.support.people import Person

# --- Quantities ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("2Gi", 2 * 2**30), ("512Mi", 512 * 2**20), ("1.5Gi", 1536 * 2**20), ("1G", 10**9), ("300M", 300 * 10**6),
    ("1e9", 10**9), ("262144Ki", 256 * 2**20), ("134217728", 2**27),
])
def test_memory_is_read_as_kubernetes_reads_it(text: str, expected: int) -> None:
    assert sandbox.memory_bytes(text) == expected


@pytest.mark.parametrize(("text", "expected"), [("500m", 500), ("2", 2000), ("0.25", 250), ("1.5", 1500), ("10m", 10),
                                                 ("1001m", 1001), ("0.0005", 1)])
def test_cpu_is_read_in_thousandths_of_a_core(text: str, expected: int) -> None:
    if expected < sandbox.MIN_CPU_MILLICORES:
        with pytest.raises(ValueError, match="at least 10m"):
            sandbox.cpu_millicores(text)
    else:
        assert sandbox.cpu_millicores(text) == expected


@pytest.mark.parametrize("text", ["2GB", "lots", "-1Gi", "+4Gi", "", "1 Gi", "Gi", "1.2.3", "0x10", "1e", "１Gi"])
def test_what_is_not_a_quantity_is_refused_with_examples(text: str) -> None:
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        sandbox.memory_bytes(text)
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        sandbox.cpu_millicores(text)


def test_limits_the_kernel_cannot_use_are_refused_with_what_to_give() -> None:
    with pytest.raises(ValueError, match="too little memory to run Triton: give at least 128Mi"):
        sandbox.memory_bytes("64Mi")
    with pytest.raises(ValueError, match="more memory than any machine has"):
        sandbox.memory_bytes("1e30")
    with pytest.raises(ValueError, match="give at least 10m"):
        sandbox.cpu_millicores("0")
    with pytest.raises(ValueError, match="at most 1000 cores"):
        sandbox.cpu_millicores("5000")


# --- The launcher's plan --------------------------------------------------------------------------------------------


def plan(tmp_path: Path, *, egress: bool = False, scratch_tmpfs: bool = False, connect_ports: tuple[int, ...] = (),
         hosts: tuple[tuple[str, str], ...] = (), **changes: Any) -> dict[str, Any]:
    repository, runtime = tmp_path / "var" / "deployments" / "7" / "r1" / "repository", tmp_path / "runtime-env"
    scratch = tmp_path / "var" / "deployments" / "7" / "scratch" / "abc"
    for directory in (repository, runtime, scratch / "home", scratch / "tmp"):
        directory.mkdir(parents=True, exist_ok=True)
    spec = sandbox.Spec(read_only=(repository, runtime, tmp_path / "missing"), scratch=scratch,
                        tcp_ports=(8000, 8001, 8002),
                        egress=egress, name="mp-test-abc", limits=cgroups.Limits(2**30, 500, 256),
                        scratch_tmpfs=scratch_tmpfs, connect_ports=connect_ports, hosts=hosts)
    caps = sandbox.Capabilities(True, landlock_abi=7)
    options = sandbox.Options(**changes)
    return sandbox.build_plan(spec, caps, options, argv=["/rt/tritonserver", "--x"], env={"PATH": "/rt/bin"},
                              cwd=str(scratch), cgroup_procs=["/cg/cgroup.procs"])


def test_the_plan_shows_the_repository_and_runtime_read_only_and_only_the_scratch_writable(tmp_path: Path) -> None:
    result = plan(tmp_path)
    mounts = {m["target"]: m for m in result["mounts"]}
    writable = sorted(target for target, m in mounts.items() if m["writable"])
    scratch = str(tmp_path / "var" / "deployments" / "7" / "scratch" / "abc")
    assert writable == ["/tmp", scratch]
    assert mounts["/tmp"]["source"] == f"{scratch}/tmp"
    assert "tmpfs_bytes" not in mounts[scratch]  # a one-shot run's result is read from the host's directory


def test_a_tritons_scratch_is_a_tmpfs_of_the_operators_size(tmp_path: Path) -> None:
    result = plan(tmp_path)
    scratch = str(tmp_path / "var" / "deployments" / "7" / "scratch" / "abc")
    bounded = plan(tmp_path, scratch_tmpfs=True, scratch_bytes=2**24)
    mounts = {m["target"]: m for m in bounded["mounts"]}
    # The host's directory stays empty: the sandbox writes to a tmpfs at its path, and /tmp is that tmpfs' tmp/.
    assert mounts[scratch] == {"source": scratch, "target": scratch, "writable": True, "tmpfs_bytes": 2**24,
                               "tmpfs_dirs": ["home", "tmp"]}
    assert mounts["/tmp"] == {"source": f"{scratch}/tmp", "target": "/tmp", "writable": True, "in_tmpfs": scratch}
    assert bounded["landlock"] == result["landlock"]
    assert mounts[str(tmp_path / "var" / "deployments" / "7" / "r1" / "repository")]["writable"] is False
    assert mounts[str(tmp_path / "runtime-env")]["writable"] is False
    assert mounts["/usr"]["writable"] is False
    assert str(tmp_path / "missing") not in mounts  # a path that does not exist is not shown
    # Never the portal's var/, the deployments directory, another revision, the host's accounts or /root as such.
    for hidden in (str(tmp_path / "var"), str(tmp_path / "var" / "deployments"), "/", "/root", "/etc", "/etc/shadow",
                   "/etc/passwd", "/home", "/var", "/run", "/proc", "/sys", "/dev"):
        assert hidden not in mounts, hidden
    assert "/etc/resolv.conf" not in mounts  # no DNS without egress
    assert result["argv"] == ["/rt/tritonserver", "--x"] and result["env"] == {"PATH": "/rt/bin"}
    assert result["cgroup_procs"] == ["/cg/cgroup.procs"] and result["shm_bytes"] == 2**30


def test_merged_usr_links_are_recreated_as_links(tmp_path: Path) -> None:
    result = plan(tmp_path)
    for link in ("/bin", "/lib", "/sbin", "/lib64"):
        if os.path.islink(link):
            assert result["symlinks"][link] == os.readlink(link)
        elif os.path.isdir(link):
            assert any(m["target"] == link and not m["writable"] for m in result["mounts"])


def test_the_sandbox_gets_accounts_and_hosts_of_its_own(tmp_path: Path) -> None:
    files = plan(tmp_path)["files"]
    assert files["/etc/passwd"].splitlines()[0] == (
        f"triton:x:1000:1000:Modelport sandbox:{tmp_path}/var/deployments/7/scratch/abc/home:/usr/sbin/nologin")
    assert not any(line.startswith("root:") for line in files["/etc/passwd"].splitlines())
    assert "mp-test-abc" in files["/etc/hosts"]


def test_landlock_allows_binding_the_servers_ports_and_connecting_nowhere(tmp_path: Path) -> None:
    result = plan(tmp_path)
    assert result["tcp_bind"] == [8000, 8001, 8002] and result["tcp_connect"] == [] and result["udp"] is False
    assert result["landlock_scopes"] == kernel.SCOPE_ABSTRACT_UNIX_SOCKET | kernel.SCOPE_SIGNAL
    rules = dict(result["landlock"])
    scratch = str(tmp_path / "var" / "deployments" / "7" / "scratch" / "abc")
    assert rules[scratch] == rules["/tmp"] == rules["/dev/shm"] == kernel.landlock_fs_rights(7)
    assert rules["/usr"] == kernel.FS_READ_EXEC and rules["/etc"] == kernel.FS_READ
    assert rules["/proc"] == kernel.FS_READ | kernel.FS_WRITE_FILE  # the stub maps its own user namespace
    assert rules["/dev/null"] & kernel.FS_WRITE_FILE and not rules["/dev/null"] & kernel.FS_EXECUTE


def test_egress_allows_the_operators_ports_udp_and_dns_files(tmp_path: Path) -> None:
    result = plan(tmp_path, egress=True, egress_ports=(443, 8443))
    assert result["tcp_connect"] == [443, 8443] and result["udp"] is True
    if os.path.exists("/etc/resolv.conf"):
        assert any(m["target"] == "/etc/resolv.conf" and not m["writable"] for m in result["mounts"])


def test_a_trace_collector_is_one_port_more_and_a_hosts_line_not_egress(tmp_path: Path) -> None:
    result = plan(tmp_path, connect_ports=(4318,), hosts=(("collector.internal", "10.0.0.7"),))
    assert result["tcp_connect"] == [4318] and result["udp"] is False
    assert not any(m["target"] == "/etc/resolv.conf" for m in result["mounts"])  # no DNS: the hosts line instead
    assert result["files"]["/etc/hosts"].splitlines()[-1] == "10.0.0.7\tcollector.internal"
    with_egress = plan(tmp_path, egress=True, egress_ports=(443, 4318), connect_ports=(4318,))
    assert with_egress["tcp_connect"] == [443, 4318]


def test_the_sandbox_uid_is_the_operators_when_root_and_the_portals_own_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert (plan(tmp_path, uid=64000, gid=64001)["outer_uid"], plan(tmp_path, uid=64000, gid=64001)["outer_gid"],
            plan(tmp_path)["privileged"]) == (64000, 64001, True)
    monkeypatch.setattr(os, "geteuid", lambda: 1234)
    monkeypatch.setattr(os, "getegid", lambda: 1235)
    result = plan(tmp_path, uid=64000)
    assert (result["outer_uid"], result["outer_gid"], result["privileged"]) == (1234, 1235, False)
    assert (result["inner_uid"], result["inner_gid"]) == (1000, 1000)


def test_the_programs_environment_holds_nothing_of_the_portals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SECRET_KEY", "s3cr3t")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t")
    env = sandbox.environment([Path("/rt/bin")], tmp_path, {"VIRTUAL_ENV": "/rt"})
    assert env == {"PATH": "/rt/bin:/usr/local/bin:/usr/bin:/bin", "HOME": f"{tmp_path}/home",
                   "TMPDIR": f"{tmp_path}/tmp",
                   "LANG": "C.UTF-8", "VIRTUAL_ENV": "/rt"}


# --- seccomp rules ----------------------------------------------------------------------------------------------------


def _matches(rules: list[kernel.Rule], name: str, *args: int) -> int | None:
    """The errno a rule list gives the call, evaluated here the way the kernel filter does."""
    for syscall, code, comparisons in rules:
        if syscall != name:
            continue
        ok = True
        for index, op, a, b in comparisons:
            value = args[index] if index < len(args) else 0
            ok &= {kernel.SCMP_CMP_EQ: value == a, kernel.SCMP_CMP_GE: value >= a,
                   kernel.SCMP_CMP_MASKED_EQ: value & a == b}[op]
        if ok:
            return code
    return None


def test_seccomp_refuses_sockets_that_no_network_namespace_contains_and_udp_where_asked() -> None:
    import errno

    server = kernel.seccomp_rules(allowed_families=[1, 2, 10, 16], inet_stream_only=True, no_new_namespaces=False)
    assert _matches(server, "socket", 40, 1) == errno.EAFNOSUPPORT  # AF_VSOCK: to the VM's host
    assert _matches(server, "socket", 17, 3) == errno.EAFNOSUPPORT  # AF_PACKET
    assert _matches(server, "socket", 200, 1) == errno.EAFNOSUPPORT
    assert _matches(server, "socket", 2, 1 | 0o2000000) is None  # TCP (SOCK_CLOEXEC set)
    assert _matches(server, "socket", 2, 2 | 0o4000) == errno.EPERM  # UDP, non-blocking
    assert _matches(server, "socket", 10, 3) == errno.EPERM  # raw IPv6
    assert _matches(server, "socket", 16, 3, 0) is None
    assert _matches(server, "socket", 16, 3, 4) == errno.EPROTONOSUPPORT
    assert _matches(server, "sendto", 3, 0, 0, kernel.MSG_FASTOPEN) == errno.EPERM
    assert _matches(server, "unshare", 0x10000000) is None  # the stub wrapper still needs its namespaces
    for name in ("ptrace", "bpf", "keyctl", "io_uring_setup", "mount", "perf_event_open", "userfaultfd"):
        assert _matches(server, name) == errno.EPERM, name
    model = kernel.seccomp_rules(allowed_families=[1, 2, 10, 16], inet_stream_only=False, no_new_namespaces=True)
    assert _matches(model, "socket", 2, 2) is None  # UDP with egress
    assert _matches(model, "unshare", 0) == errno.EPERM and _matches(model, "setns") == errno.EPERM
    assert _matches(model, "clone", 0x10000000 | 17) == errno.EPERM and _matches(model, "clone", 17) is None
    assert _matches(model, "clone3") == errno.ENOSYS


# --- cgroups --------------------------------------------------------------------------------------------------------


def fake_v1(root: Path) -> Path:
    for controller in ("memory", "cpu", "pids"):
        (root / controller / "portal").mkdir(parents=True)
        (root / controller / "cgroup.procs").write_text("")
    own = root.parent / "self-cgroup"
    own.write_text("4:memory:/portal\n3:cpu,cpuacct:/\n2:pids:/\n0::/\n")
    return own


def test_v1_cgroups_nest_below_our_own_and_carry_the_limits(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    layout = cgroups.detect(root, own_cgroup=fake_v1(root))
    assert layout.version == 1
    assert layout.parents == {"memory": root / "memory" / "portal" / "modelport", "cpu": root / "cpu" / "modelport",
                              "pids": root / "pids" / "modelport"}
    for controller, name in (("memory", "memory.memsw.limit_in_bytes"), ("memory", "memory.limit_in_bytes")):
        (layout.parents[controller] / "mp-x").mkdir(exist_ok=True)
        (layout.parents[controller] / "mp-x" / name).write_text("")
    directories = cgroups.create(layout, "mp-x", cgroups.Limits(2**30, 1500, 300))
    memory, cpu, pids = directories
    assert (memory / "memory.limit_in_bytes").read_text() == str(2**30)
    assert (memory / "memory.memsw.limit_in_bytes").read_text() == str(2**30)
    assert (cpu / "cpu.cfs_quota_us").read_text() == "150000" and (cpu / "cpu.cfs_period_us").read_text() == "100000"
    assert (pids / "pids.max").read_text() == "300"
    assert cgroups.procs_files(directories) == [str(d / "cgroup.procs") for d in directories]
    (memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert cgroups.oom_kills(directories) == 2
    # Without a CPU limit no CPU cgroup: Triton's threads are scheduled as if it ran unsandboxed.
    created = cgroups.create(layout, "mp-z", cgroups.Limits(2**30, None, 300))
    assert [d.parent.name for d in created] == ["modelport"] * 2
    assert not (layout.parents["cpu"] / "mp-z").exists()


def test_v2_cgroups_go_beside_our_own_with_the_controllers_passed_down(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    (root / "system.slice" / "portal.service").mkdir(parents=True)
    for directory in (root, root / "system.slice"):
        (directory / "cgroup.controllers").write_text("cpu memory pids io")
        (directory / "cgroup.subtree_control").write_text("io")
    own = tmp_path / "self-cgroup"
    own.write_text("0::/system.slice/portal.service\n")
    layout = cgroups.detect(root, own_cgroup=own)
    assert layout.version == 2 and layout.parents == {"": root / "system.slice" / "modelport"}
    # (A real kernel keeps the file and turns "+cpu +memory +pids" into the enabled list.)
    assert (root / "system.slice" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    (directory,) = cgroups.create(layout, "mp-y", cgroups.Limits(512 * 2**20, None, 100))
    assert (directory / "memory.max").read_text() == str(512 * 2**20)
    assert not (directory / "cpu.max").exists() and (directory / "pids.max").read_text() == "100"
    (directory / "memory.events").write_text("low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n")
    assert cgroups.oom_kills([directory]) == 1
    assert cgroups.remove([directory], wait_seconds=0) is False  # a real cgroup directory has no files to remove


def test_without_writable_cgroups_the_layout_says_why_and_what_to_do(tmp_path: Path) -> None:
    assert cgroups.detect(tmp_path / "nothing", own_cgroup=tmp_path / "missing").note.startswith("cannot read")
    own = tmp_path / "self-cgroup"
    own.write_text("0::/\n")
    assert "no cgroup hierarchy" in cgroups.detect(tmp_path / "nothing", own_cgroup=own).note
    root = tmp_path / "cgroup"
    own_cgroup = fake_v1(root)
    (root / "pids" / "modelport").write_text("")  # where the parent must go, something else is (root ignores modes)
    layout = cgroups.detect(root, own_cgroup=own_cgroup)
    assert layout.version == 0 and layout.parents == {}
    assert "not writable" in layout.note and "SANDBOX_CGROUP_PARENT" in layout.note


def test_an_operator_named_parent_is_used_as_it_is(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    layout = cgroups.detect(root, "/modelport-sandboxes", own_cgroup=fake_v1(root))
    assert layout.parents["memory"] == root / "memory" / "modelport-sandboxes" / "modelport"


# --- The capability check and the stub wrapper, for real --------------------------------------------------------------


def test_the_capability_check_builds_a_real_sandbox_on_this_machine() -> None:
    """CI runs where the sandbox works (docs/security.md says what it needs); a machine that cannot build one fails
    here with the kernel's reason."""
    caps = sandbox.check(sandbox.Options())
    assert caps.available, caps.reason
    assert caps.landlock_abi == kernel.landlock_abi() and caps.describe().startswith("available (Landlock ABI")


def test_the_capability_check_reports_what_stops_it() -> None:
    caps = sandbox.check(sandbox.Options(), python="/nonexistent/python3")
    assert not caps.available and "cannot run the sandbox launcher with /nonexistent/python3" in caps.reason
    assert caps.describe().startswith("not available: ")


def test_without_cgroups_the_sandbox_still_runs_and_says_limits_are_off(tmp_path: Path) -> None:
    caps = sandbox.check(sandbox.Options(cgroup_root=tmp_path))
    assert caps.available and caps.cgroups.version == 0
    assert any(note.startswith("no resource limits:") for note in caps.notes)


def test_the_generated_stub_answers_tritons_probe_and_refuses_to_run_unconfined(tmp_path: Path) -> None:
    from deployments.tests.local_triton import runtime_env

    env = runtime_env()
    backend = backends.build_backend_dir(env, tmp_path, sandboxed=True)
    stub = backend / "python" / "triton_python_backend_stub"
    assert stub.read_text().startswith(f"#!{env.bin_dir / 'python3'} -IS\n")
    assert backends.build_backend_dir(env, tmp_path, sandboxed=True) == backend  # idempotent
    assert sorted(p.name for p in (backend / "modelport").iterdir()) == ["kernel.py", "stub.py"]
    # Triton runs the stub without arguments first and wants status 1.
    assert subprocess.run([str(stub)], capture_output=True, timeout=60).returncode == 1
    # Whatever stops the confinement, the model does not run: status 2 and the reason for Triton's log.
    result = subprocess.run([str(stub), "model.py"], capture_output=True, timeout=60, text=True,
                            env={"MODELPORT_SANDBOX_NET": "egress", "MODELPORT_SANDBOX_EGRESS_PORTS": "https"})
    assert result.returncode == 2
    assert result.stderr.startswith(serverlog.SANDBOX_ERROR_PREFIX + "could not confine the python model: ")


# --- Fail closed, and egress for operators only ------------------------------------------------------------------


@pytest.fixture
def no_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    disabled = "user namespaces are disabled (sysctl user.max_user_namespaces = 0)"
    monkeypatch.setattr(sandbox_settings, "sandbox_capabilities", lambda: sandbox.Capabilities(False, disabled))


@pytest.fixture
def python_model(alice: Person) -> None:
    from tests.artifacts import PYTHON_MODEL, PYTHON_SIGNATURE
    from tests.sandbox_helpers import python_version

    python_version(alice, "doubler", {"model.py": PYTHON_MODEL.encode()}, PYTHON_SIGNATURE)


def test_in_production_without_a_sandbox_python_models_are_refused_with_what_to_do(
    alice: Person, python_model: None, no_sandbox: None, settings: Any
) -> None:
    settings.SANDBOX_REQUIRED = True
    response = alice.client().post("/api/v1/deployments/", {"name": "doubler", "models": [{"model": "doubler"}]},
                                   format="json")
    assert response.status_code == 400
    (message,) = response.json()["error"]["fields"]["runtime"]
    assert message.startswith("This machine cannot sandbox uploaded code (user namespaces are disabled")
    assert "SANDBOX_REQUIRED=false" in message and "Kubernetes" in message
    assert not Deployment.objects.exists()


def test_without_a_sandbox_onnx_models_still_deploy_and_the_opt_out_lets_python_models_run(
    alice: Person, python_model: None, no_sandbox: None, settings: Any
) -> None:
    from tests.support.versions import make_ready_version

    settings.SANDBOX_REQUIRED = True
    make_ready_version(alice, "digits")
    client = alice.client()
    assert client.post("/api/v1/deployments/", {"name": "digits", "models": [{"model": "digits"}]},
                       format="json").status_code == 201
    settings.SANDBOX_REQUIRED = False
    assert client.post("/api/v1/deployments/", {"name": "doubler", "models": [{"model": "doubler"}]},
                       format="json").status_code == 201


@pytest.mark.parametrize("fmt", ["torchscript", "tensorflow_savedmodel"])
def test_without_a_sandbox_torchscript_and_savedmodels_are_refused_too_since_their_graphs_can_read_files(
    alice: Person, no_sandbox: None, settings: Any, fmt: str
) -> None:
    from deployments.revision_spec import RevisionSpec

    settings.SANDBOX_REQUIRED = True
    spec = RevisionSpec.from_json({"models": [{"name": "m", "model": "m", "version": 1, "format": fmt}]})
    assert local_confined.runs_uploaded_code(spec)
    message = local_confined.sandbox_refusal(spec)
    assert message is not None and "TorchScript and SavedModel" in message
    settings.SANDBOX_REQUIRED = False
    assert local_confined.sandbox_refusal(spec) is None


def test_the_runtime_refuses_too_when_the_sandbox_went_away_after_the_deployment_was_made(
    alice: Person, python_model: None, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.SANDBOX_REQUIRED = True
    response = alice.client().post("/api/v1/deployments/", {"name": "doubler", "models": [{"model": "doubler"}]},
                                   format="json")
    assert response.status_code == 201
    monkeypatch.setattr(sandbox_settings, "sandbox_capabilities",
                        lambda: sandbox.Capabilities(False, "Landlock is disabled"))
    deployment = Deployment.objects.get(name="doubler")
    with pytest.raises(RuntimeUnavailable, match=r"cannot sandbox uploaded code \(Landlock is disabled\)"):
        local.LocalRuntime().launch(deployment.revision)  # type: ignore[arg-type]
    assert not TritonServer.objects.exists()


def test_local_resources_are_checked_when_the_deployment_is_made(alice: Person, digits: Any) -> None:
    response = alice.client().post("/api/v1/deployments/", {
        "name": "digits", "models": [{"model": "digits"}], "resources": {"memory": "2GB", "cpu": "0"}}, format="json")
    assert response.status_code == 400
    body = json.dumps(response.json())
    assert "'2GB' is not a Kubernetes quantity" in body and 'did you mean \\"2G\\"' in body
    assert "resources.cpu" in body
    # A quantity Kubernetes takes that the local sandbox cannot enforce (the CFS quota's floor is 10m).
    response = alice.client().post("/api/v1/deployments/", {
        "name": "digits", "models": [{"model": "digits"}], "resources": {"cpu": "5m"}}, format="json")
    assert response.status_code == 400
    assert "give at least 10m" in json.dumps(response.json())
    response = alice.client().post("/api/v1/deployments/", {
        "name": "digits", "models": [{"model": "digits"}], "resources": {"memory": "1Gi", "cpu": "500m"}},
                                   format="json")
    assert response.status_code == 201
    spec = Deployment.objects.get(name="digits").revision.spec  # type: ignore[union-attr]
    assert local_confined.limits_for(spec) == cgroups.Limits(2**30, 500, 1024)


def test_the_default_memory_limit_applies_when_a_revision_sets_none(settings: Any) -> None:
    settings.SANDBOX_DEFAULT_MEMORY = "3Gi"
    spec = RevisionSpec(runtime="local", models=())
    assert local_confined.limits_for(spec).memory_bytes == 3 * 2**30
    settings.SANDBOX_DEFAULT_MEMORY = ""
    assert local_confined.limits_for(spec) == cgroups.Limits(None, None, 1024)


def test_team_members_cannot_allow_egress_through_the_api(alice: Person, digits: Any) -> None:
    client = alice.client()
    response = client.post("/api/v1/deployments/", {"name": "digits", "models": [{"model": "digits"}],
                                                     "allow_egress": True}, format="json")
    assert response.status_code == 400 and "only an operator" in json.dumps(response.json())
    assert client.post("/api/v1/deployments/", {"name": "digits", "models": [{"model": "digits"}]},
                       format="json").status_code == 201
    response = client.patch("/api/v1/deployments/digits/", {"allow_egress": True}, format="json")
    assert response.status_code == 400 and "admin console" in json.dumps(response.json())
    body = client.get("/api/v1/deployments/digits/").json()
    assert body["allow_egress"] is False and body["sandboxed"] is None  # nothing runs yet
    assert Deployment.objects.get(name="digits").allow_egress is False


def test_an_operator_allows_egress_in_the_admin_with_an_audit_entry_and_a_restart(
    alice: Person, digits: Any, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    from django.contrib.auth import get_user_model

    assert alice.client().post("/api/v1/deployments/", {"name": "digits", "models": [{"model": "digits"}]},
                               format="json").status_code == 201
    deployment = Deployment.objects.get(name="digits")
    serving = {"revision_id": deployment.revision_id, "url": "http://127.0.0.1:9", "description": "pid 9", "ref": 9}
    Deployment.objects.filter(pk=deployment.pk).update(status=Deployment.Status.READY, serving_launch=serving)
    operator = get_user_model().objects.create_superuser("olivia", "olivia@example.com", "password")
    client = Client()
    client.force_login(operator)
    with django_capture_on_commit_callbacks() as callbacks:
        response = admin_change(client, deployment, allow_egress=True, status="ready")
    assert response.status_code == 302
    deployment.refresh_from_db()
    assert deployment.allow_egress is True
    assert deployment.status == Deployment.Status.PENDING and "egress" in deployment.status_message
    assert deployment.serving_launch == Launch.from_json(serving)  # the reconciler's records are shown, not edited
    assert len(callbacks) == 1  # the reconcile that restarts Triton with the setting
    entry = AuditEntry.objects.get(action="deployment.egress")
    assert (entry.username, entry.target, entry.detail) == ("olivia", "digits", {"allow_egress": True})
    event = deployment.events.get(kind=Event.Kind.WARNING)
    assert event.message.startswith("Outgoing connections allowed by operator olivia")
    # Saving the form again without changing egress records nothing more.
    admin_change(client, deployment)
    assert AuditEntry.objects.filter(action="deployment.egress").count() == 1
    # A team member reaches no admin page.
    member = Client()
    member.force_login(alice.user)
    assert member.get(f"/admin/deployments/deployment/{deployment.pk}/change/").status_code == 302


def _server(deployment: Deployment, **fields: Any) -> TritonServer:
    return TritonServer.objects.create(deployment=deployment, revision=deployment.revision, pid=999_999_999,
                                       http_port=18000, grpc_port=18001, metrics_port=18002, log_path="/nonexistent",
                                       state=TritonServer.State.READY, **fields)


def test_the_deployment_page_and_the_api_say_whether_it_runs_sandboxed(alice: Person, digits: Any) -> None:
    from tests.support.people import signed_in

    assert alice.client().post("/api/v1/deployments/", {"name": "digits", "models": [{"model": "digits"}]},
                               format="json").status_code == 201
    deployment = Deployment.objects.get(name="digits")
    page = signed_in(alice)
    assert b'id="deployment-sandboxed">\xe2\x80\x93<' in page.get("/deployments/digits/").content  # nothing runs
    server = _server(deployment, sandboxed=True)
    content = page.get("/deployments/digits/").content.decode()
    assert 'id="deployment-sandboxed">yes</dd>' in content and 'id="deployment-egress">blocked' in content
    assert alice.client().get("/api/v1/deployments/digits/").json()["sandboxed"] is True
    TritonServer.objects.filter(pk=server.pk).update(sandboxed=False, sandbox_note="SANDBOX_ENABLED is false")
    content = page.get("/deployments/digits/").content.decode()
    assert "<strong>no</strong>: SANDBOX_ENABLED is false" in content
    assert alice.client().get("/api/v1/deployments/").json()[0]["sandboxed"] is False


def test_the_operators_overview_shows_the_machines_sandbox_and_each_servers(
    alice: Person, digits: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.contrib.auth import get_user_model

    from web import overview

    monkeypatch.setattr(overview, "worker_ping", lambda timeout=1.0: overview.Probe([], "no worker answered"))
    assert alice.client().post("/api/v1/deployments/", {"name": "digits", "models": [{"model": "digits"}]},
                               format="json").status_code == 201
    _server(Deployment.objects.get(name="digits"), sandboxed=False, sandbox_note="no Landlock")
    operator = get_user_model().objects.create_superuser("olivia", "olivia@example.com", "password")
    client = Client()
    client.force_login(operator)
    monkeypatch.setattr(sandbox_settings, "sandbox_capabilities",
                        lambda: sandbox.Capabilities(False, "user namespaces are disabled"))
    content = client.get("/admin/overview/").content.decode()
    assert "<strong>not available</strong>: user namespaces are disabled. Python models run unconfined" in content
    assert '<td class="sandboxed"><strong>no</strong> <span class="help">(no Landlock)</span></td>' in content
    monkeypatch.setattr(sandbox_settings, "sandbox_capabilities",
                        lambda: sandbox.Capabilities(True, landlock_abi=7, cgroups=cgroups.Layout(1, {})))
    assert "available (Landlock ABI 7, cgroup v1)" in client.get("/admin/overview/").content.decode()


def test_start_up_checks_warn_when_the_sandbox_is_off_missing_or_weaker(settings: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from deployments.checks import sandbox_check

    settings.SANDBOX_ENABLED = False
    assert [m.id for m in sandbox_check()] == ["modelport.W020"]
    settings.SANDBOX_ENABLED = True
    settings.SANDBOX_REQUIRED = True
    monkeypatch.setattr(sandbox_settings, "sandbox_capabilities",
                        lambda: sandbox.Capabilities(False, "no user namespaces"))
    (message,) = sandbox_check()
    assert message.id == "modelport.W021"
    assert message.msg == ("This machine cannot sandbox the local Tritons: no user namespaces; "
                           "python models are refused (SANDBOX_REQUIRED).")
    monkeypatch.setattr(sandbox_settings, "sandbox_capabilities",
                        lambda: sandbox.Capabilities(True, notes=("no Landlock",)))
    assert [(m.id, m.msg) for m in sandbox_check()] == [("modelport.W022", "The sandbox is weaker here: no Landlock.")]
    monkeypatch.setattr(sandbox_settings, "sandbox_capabilities", lambda: sandbox.Capabilities(True, landlock_abi=7))
    assert sandbox_check() == []


def test_the_deploy_form_shows_the_refusal_beside_the_runtime(alice: Person, python_model: None, no_sandbox: None,
                                                             settings: Any) -> None:
    from tests.support.people import signed_in
    from web.tests.deploy_forms import errors_of, form_data

    settings.SANDBOX_REQUIRED = True
    response = signed_in(alice).post("/deployments/new/?model=doubler&version=1", form_data(
        name="doubler", **{"m0-dynamic_batching": None, "m0-preferred_batch_size": "", "m0-instance_count": "1"}))
    form_errors, _ = errors_of(response)
    assert form_errors["runtime"][0].startswith("This machine cannot sandbox uploaded code")
    assert not Deployment.objects.exists()


# --- One-shot runs -------------------------------------------------------------------------------------------------

ONE_SHOT = """
import json, os, socket, sys
result = {"uid": os.getuid(), "secret": os.environ.get("SECRET_KEY"), "etc_shadow": os.path.exists("/etc/shadow")}
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
    result["tcp"] = "connected"
except OSError as exc:
    result["tcp"] = exc.strerror
try:
    result["interfaces"] = sorted(name for _, name in socket.if_nameindex())
except OSError as exc:
    result["interfaces"] = str(exc)
with open(os.path.join(os.environ["HOME"], "result.json"), "w") as f:
    json.dump(result, f)
if sys.argv[2] == "linger":
    if os.fork() == 0:
        os.setsid()
        os.execv("/bin/sleep", [sys.argv[3], "3600"])
    import time
    time.sleep(3600)
"""


def one_shot(tmp_path: Path, *args: str, timeout: float, program: str = ONE_SHOT) -> tuple[sandbox.Finished, Path]:
    from deployments.tests.local_triton import runtime_env

    env = runtime_env()
    script = tmp_path / "code" / "one_shot.py"
    script.parent.mkdir()
    script.write_text(program)
    os.chmod(script.parent, 0o755)
    os.chmod(script, 0o644)
    options = sandbox.Options()
    caps = sandbox.check(options)
    scratch = tmp_path / "scratch"
    sandbox.prepare_scratch(scratch, options)
    spec = sandbox.Spec(read_only=(script.parent, env.root, env.base_prefix), scratch=scratch, tcp_ports=(),
                        egress=False,
                        name=f"mp-test-{os.getpid()}", limits=cgroups.Limits(512 * 2**20, None, 64), network="none")
    with open(tmp_path / "output.log", "wb") as log:
        finished = sandbox.run(spec, caps, options, argv=[str(env.bin_dir / "python3"), "-I", str(script), *args],
                               env=sandbox.environment([env.bin_dir], scratch, {}), cwd=str(scratch), log=log,
                               timeout=timeout)
    return finished, scratch / "home" / "result.json"


def test_a_one_shot_run_has_no_network_at_all_and_its_result_in_the_scratch_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    monkeypatch.setenv("SECRET_KEY", "s3cr3t")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        finished, result = one_shot(tmp_path, str(listener.getsockname()[1]), "done", timeout=60)
    assert finished == sandbox.Finished(0, False), (tmp_path / "output.log").read_text()
    answer = json.loads(result.read_text())
    # Landlock refuses the connection first; the namespace has nothing but a loopback that is down anyway.
    assert answer == {"uid": 1000, "secret": None, "etc_shadow": False, "tcp": "Permission denied",
                      "interfaces": ["lo"]}


PRIORITY = """
import json, os
result = {"nice": os.getpriority(os.PRIO_PROCESS, 0)}
if os.path.exists("/proc/self/autogroup"):
    with open("/proc/self/autogroup") as f:
        result["autogroup_nice"] = int(f.read().split()[-1])  # "/autogroup-42 nice 10"
try:
    os.setpriority(os.PRIO_PROCESS, 0, 0)
    result["lowered"] = "done"
except OSError as exc:
    result["lowered"] = exc.strerror
with open(os.path.join(os.environ["HOME"], "result.json"), "w") as f:
    json.dump(result, f)
"""


def test_uploaded_code_runs_below_the_portals_cpu_priority_and_cannot_raise_it(tmp_path: Path) -> None:
    """Everything sandboxed runs at SANDBOX_NICE (10 by default), its session's autogroup too: with autogroups on,
    the kernel shares the CPUs between sessions first, and a nice value alone would order nothing against the
    gateway (docs/security.md, "CPU"). A hostile program's try to take its priority back is refused."""
    assert plan(tmp_path / "p")["nice"] == 10 and plan(tmp_path / "q", nice=0)["nice"] == 0
    own = os.getpriority(os.PRIO_PROCESS, 0)
    finished, result = one_shot(tmp_path, timeout=60, program=PRIORITY)
    assert finished == sandbox.Finished(0, False), (tmp_path / "output.log").read_text()
    answer = json.loads(result.read_text())
    assert answer["nice"] == max(10, own)
    assert answer["lowered"] == "Permission denied"
    if Path("/proc/self/autogroup").exists():  # a kernel with autogroups (this machine's, and CI's)
        assert answer["autogroup_nice"] == max(10, own)
    assert os.getpriority(os.PRIO_PROCESS, 0) == own  # the portal's own priority is untouched


def test_a_one_shot_run_past_its_time_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    from tests.sandbox_helpers import processes_named

    name = f"lingering-{os.getpid()}"
    finished, result = one_shot(tmp_path, "1", "linger", name, timeout=3)
    assert finished == sandbox.Finished(None, True)
    assert result.exists()  # it ran, and its detached child with it
    assert processes_named(name) == []


def _gone(name: str, seconds: float = 10) -> bool:
    from tests.sandbox_helpers import processes_named

    deadline = time.monotonic() + seconds
    while processes_named(name) and time.monotonic() < deadline:
        time.sleep(0.1)
    return processes_named(name) == []


def test_a_one_shot_run_ends_when_its_caller_gives_up_on_it(tmp_path: Path) -> None:
    """Celery's soft time limit raises inside the wait: the run must not go on without anyone waiting for it."""
    class SoftLimit(Exception):
        pass

    def expire(number: int, frame: Any) -> None:
        raise SoftLimit

    name = f"abandoned-{os.getpid()}"
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 3)
    try:
        with pytest.raises(SoftLimit):
            one_shot(tmp_path, "1", "linger", name, timeout=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert (tmp_path / "scratch" / "home" / "result.json").exists()  # it ran, and its detached child with it
    assert _gone(name)


def test_a_one_shot_run_ends_when_its_caller_is_killed(tmp_path: Path) -> None:
    """Celery's hard time limit SIGKILLs the worker child that waits: the sandbox's PID 1 dies with it."""
    from tests.sandbox_helpers import processes_named

    name = f"orphaned-{os.getpid()}"
    child = os.fork()
    if child == 0:
        try:
            one_shot(tmp_path, "1", "linger", name, timeout=120)
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 60
        while not processes_named(name) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_named(name), "the one-shot run never started"
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    assert _gone(name)
