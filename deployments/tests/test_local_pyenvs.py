"""The local runtime's side of python models' requirements: preparing a revision asks for its environment's build, the
reconciler queues it once (on the inspection queue, never in the tick), waits for it, fails with pip's lines, and
builds again on a retry.
pip is faked (test_pyenvs.py's FakePip), and the portal's own virtualenv stands in for the runtime env; the real
thing runs in tests/test_pyenvs_e2e.py."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from deployments import pyenvs, reconcile, tasks
from deployments.models import Deployment, Revision, TritonServer
from deployments.render import RenderError
from deployments.runtimes.base import PREPARED, Preparation, PreparationFailed
from deployments.runtimes.local import files as local_files
from deployments.runtimes.local import pyenv as local_pyenv
from deployments.runtimes.local import sweeps as local_sweeps
from deployments.tests.fake_pip import FakePip
from modelport.core.runtime_env import RuntimeEnv
from models_registry.tests.pipeline_versions import ready_version
from tests.artifacts import PYTHON_SIGNATURE, python_model_zip
from tests.support.people import Person


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch, settings: Any, tmp_path: Path) -> list[int]:
    """The revisions whose build was queued; PYENVS_DIR in tmp_path, the portal's virtualenv as the runtime env."""
    settings.PYENVS_DIR = tmp_path / "pyenvs"
    env = RuntimeEnv(root=Path(sys.prefix), python_version="3.11",
                                  site_packages=Path(sysconfig.get_paths()["purelib"]), tritonserver=Path("/none"))
    monkeypatch.setattr(local_pyenv, "runtime_env", lambda: env)
    calls: list[int] = []
    monkeypatch.setattr(tasks.build_python_env, "delay", calls.append)
    return calls


class _PythonEnvs:
    """The local runtime's preparation of python environments alone (no repository rendered)."""

    def prepare(self, revision: Revision) -> Preparation:
        return local_pyenv.prepare_python_env(revision)


def prepare(revision: Revision) -> Preparation:
    """What a tick does: the runtime's answer, and the build it asks for queued through the tasks."""
    return reconcile._ask_prepare(_PythonEnvs(), revision, tasks.queue_build)  # type: ignore[arg-type]


def use_pip(monkeypatch: pytest.MonkeyPatch, pip: FakePip) -> None:
    real_build = pyenvs.build

    def build(*args: Any, **kwargs: Any) -> pyenvs.BuildResult:
        return real_build(*args, **kwargs, run=pip)

    monkeypatch.setattr(pyenvs, "build", build)


def revision_needing(person: Person, requirements: bytes, name: str = "tool") -> Revision:
    ready_version(person, name, python_model_zip({"requirements.txt": requirements}), f"{name}.zip", PYTHON_SIGNATURE)
    response = person.client().post("/api/v1/deployments/", {"name": name, "models": [{"model": name}]},
                                    format="json")
    assert response.status_code == 201, response.json()
    revision = Deployment.objects.get(name=name).revision
    assert revision is not None
    return revision


def test_a_revision_without_requirements_needs_no_environment(alice: Person, queued: list[int]) -> None:
    revision = revision_needing(alice, b"# nothing\n")
    assert local_pyenv.prepare_python_env(revision) == PREPARED
    assert queued == []


def test_requirements_the_runtime_env_satisfies_need_no_environment(alice: Person, queued: list[int]) -> None:
    """The sample pipeline's preprocess step lists numpy and pillow, which the runtime env has."""
    revision = revision_needing(alice, b"numpy>=1.20\nPyYAML\n")
    assert local_pyenv.python_env_for(revision.spec) is None
    assert local_pyenv.prepare_python_env(revision) == PREPARED
    assert queued == []
    for number, needs_one in enumerate((b"pyyaml[extra]\n", b'numpy; python_version >= "3"\n')):
        other = revision_needing(alice, needs_one, name=f"other{number}")
        assert local_pyenv.python_env_for(other.spec) is not None, needs_one


def test_a_requirement_the_runtime_env_contradicts_is_refused_naming_it_never_given_to_pip(
        alice: Person, queued: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy==2.4.6 (an MLflow model's default pin) over a runtime env serving numpy 1.26.4: every package of the
    runtime env is a constraint of the build, so pip could only say ResolutionImpossible. The deployment is a 400
    naming the line; a revision planned before the runtime env changed fails its preparation saying the same."""
    numpy = next(line for line in pyenvs.runtime_identity(local_pyenv.runtime_env().bin_dir / "python",
                                                          local_pyenv.runtime_env().site_packages).distributions
                 if line.startswith("numpy=="))
    ready_version(alice, "pinned", python_model_zip({"requirements.txt": b"numpy==1.0.0\ntabulate\n"}), "pinned.zip",
                  PYTHON_SIGNATURE)
    response = alice.client().post("/api/v1/deployments/", {"name": "pinned", "models": [{"model": "pinned"}]},
                                   format="json")
    assert response.status_code == 400, response.json()
    version = numpy.partition("==")[2]
    assert response.json()["error"]["fields"]["models[0].requirements"] == [
        f"model 'pinned' version 1: numpy==1.0.0 asks for another numpy than the runtime env's {version}, and a "
        "python model's environment keeps every package the runtime env serves with at its version: ask for a "
        f"range that holds {version} (or no version), e.g. when logging an MLflow model with pip_requirements=[...]"]

    revision = revision_needing(alice, b"numpy==2.4.6\ntabulate\n", name="planned")
    pyenvs.clear_cache()
    monkeypatch.setattr(pyenvs, "runtime_identity",
                        lambda *args, **kwargs: pyenvs.RuntimeIdentity("3.11.7", ("numpy==1.26.4",)))
    with pytest.raises(RenderError, match=r"numpy==2\.4\.6 asks for another numpy than the runtime env's 1\.26\.4"):
        local_pyenv.prepare_python_env(revision)
    pip = FakePip()
    use_pip(monkeypatch, pip)
    assert local_pyenv.build_python_env(revision.pk) == revision.deployment_id
    assert pip.commands == [] and queued == []


def test_the_build_is_queued_once_waited_for_and_then_the_revision_is_prepared(
        alice: Person, queued: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    revision = revision_needing(alice, b"Tabulate>=0.9\nnumpy\n")
    assert local_pyenv.prepare_python_env(revision).build  # the runtime asks; it queues nothing itself
    assert queued == []
    waiting = prepare(revision)
    assert not waiting.done and waiting.building and not waiting.build
    assert waiting.message == "Installing python packages for revision 1: numpy, tabulate>=0.9."
    assert queued == [revision.pk]
    again = prepare(revision)
    assert (again.done, again.message, again.build, again.retry_seconds) == (False, waiting.message, False, 2.0)
    assert queued == [revision.pk]  # queued once: the next ticks only look

    use_pip(monkeypatch, FakePip())
    assert local_pyenv.build_python_env(revision.pk) == revision.deployment_id
    assert local_pyenv.prepare_python_env(revision) == PREPARED
    penv = local_pyenv.python_env_for(revision.spec)
    assert penv is not None and (penv.site_packages / "tabulate.py").exists()


def test_a_failed_build_fails_the_revision_with_pips_lines_and_a_retry_builds_again(
        alice: Person, queued: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    revision = revision_needing(alice, b"nonexistent-pkg-zzz==9.9\n")
    prepare(revision)
    use_pip(monkeypatch, FakePip(fails_with="ERROR: No matching distribution found for nonexistent-pkg-zzz==9.9"))
    local_pyenv.build_python_env(revision.pk)
    with pytest.raises(PreparationFailed) as failed:
        prepare(revision)
    assert str(failed.value) == ("pip could not install its python packages (nonexistent-pkg-zzz==9.9): No matching "
                                 "distribution found for nonexistent-pkg-zzz==9.9")
    assert failed.value.detail.endswith("ERROR: No matching distribution found for nonexistent-pkg-zzz==9.9")
    assert not prepare(revision).done  # a retry: built again
    assert queued == [revision.pk, revision.pk]


def test_an_unreachable_broker_is_waited_for_rather_than_failing_the_deployment(
        alice: Person, queued: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    def broker_down(revision_id: int) -> None:
        raise OSError("Connection refused")

    monkeypatch.setattr(tasks.build_python_env, "delay", broker_down)
    revision = revision_needing(alice, b"tabulate\n")
    waiting = prepare(revision)
    assert not waiting.done and waiting.building and "the broker is unreachable" in waiting.message
    assert waiting.retry_seconds == 5.0
    monkeypatch.setattr(tasks.build_python_env, "delay", queued.append)
    assert prepare(revision).message.startswith("Installing python packages")
    assert queued == [revision.pk]  # asked again once the broker answers


def test_a_worker_that_runs_tasks_eagerly_is_done_at_once(
        alice: Person, queued: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    use_pip(monkeypatch, FakePip())
    monkeypatch.setattr(tasks.build_python_env, "delay", local_pyenv.build_python_env)
    revision = revision_needing(alice, b"tabulate\n")
    assert prepare(revision).retry_seconds == reconcile.NOW  # the tick looks again at once...
    assert local_pyenv.prepare_python_env(revision) == PREPARED  # ...and finds it built


def test_deployments_with_the_same_requirements_share_an_environment(alice: Person, queued: list[int]) -> None:
    one = revision_needing(alice, b"tabulate\nnumpy\n", name="one")
    two = revision_needing(alice, b"numpy\ntabulate  # the same set, written in another order\n", name="two")
    other = revision_needing(alice, b"tabulate==0.9.0\n", name="other")
    penvs = [local_pyenv.python_env_for(r.spec) for r in (one, two, other)]
    assert penvs[0] == penvs[1] and penvs[0] != penvs[2]
    prepare(one)
    prepare(two)
    assert queued == [one.pk]  # the second waits for the build the first asked for


def test_unused_environments_are_swept_but_a_running_deployments_is_kept(
        alice: Person, queued: list[int], monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    use_pip(monkeypatch, FakePip())
    kept = revision_needing(alice, b"tabulate\n", name="kept")
    gone = revision_needing(alice, b"tabulate<1\n", name="gone")
    for revision in (kept, gone):
        local_pyenv.build_python_env(revision.pk)
    Deployment.objects.filter(pk=gone.deployment_id).update(desired_state=Deployment.Desired.STOPPED)
    settings.PYENV_KEEP_UNUSED_SECONDS = 0
    removed = local_sweeps.collect_python_envs()
    gone_env, kept_env = (local_pyenv.python_env_for(r.spec) for r in (gone, kept))
    assert gone_env is not None and kept_env is not None
    assert removed == [f"removed the unused python environment {gone_env.env_dir}"]
    assert kept_env.env_dir.is_dir()


def test_an_environment_a_running_triton_started_with_is_kept_after_the_runtime_env_changed(
        alice: Person, queued: list[int], monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    """Installing an extra into the runtime env changes every key; a Triton started before keeps its environment."""
    use_pip(monkeypatch, FakePip())
    revision = revision_needing(alice, b"tabulate\n")
    local_pyenv.build_python_env(revision.pk)
    started_with = local_pyenv.python_env_for(revision.spec)
    assert started_with is not None
    (local_files.repository_dir(revision).parent).mkdir(parents=True)
    (local_files.repository_dir(revision).parent / "pyenv").write_text(started_with.key)  # as _launch writes it
    TritonServer.objects.create(deployment=revision.deployment, revision=revision, pid=1, http_port=1, grpc_port=2,
                                metrics_port=3, log_path="/dev/null", state=TritonServer.State.READY)
    pyenvs.clear_cache()
    monkeypatch.setattr(pyenvs, "runtime_identity",
                        lambda *args, **kwargs: pyenvs.RuntimeIdentity("3.11.7", ("torch==2.13.0",)))
    assert local_pyenv.python_env_for(revision.spec) != started_with
    settings.PYENV_KEEP_UNUSED_SECONDS = 0
    assert local_sweeps.collect_python_envs() == []
    assert started_with.env_dir.is_dir()
    TritonServer.objects.update(state=TritonServer.State.STOPPED)
    assert local_sweeps.collect_python_envs() == [f"removed the unused python environment {started_with.env_dir}"]


def test_the_environment_of_a_canary_being_prepared_is_kept(alice: Person, queued: list[int], settings: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Between its preparation (built) and its launch a canary has no server: the sweep must not remove its
    environment then (the canary would end with 'environment is gone')."""
    use_pip(monkeypatch, FakePip())
    revision = revision_needing(alice, b"tabulate\n")
    local_pyenv.build_python_env(revision.pk)
    # Only the canary needs it: the stable revision is another (here: none that needs an environment).
    Deployment.objects.filter(pk=revision.deployment_id).update(revision=None, serving_revision=None,
                                                               canary_revision=revision, canary_percent=10)
    settings.PYENV_KEEP_UNUSED_SECONDS = 0
    assert local_sweeps.collect_python_envs() == []
    penv = local_pyenv.python_env_for(revision.spec)
    assert penv is not None and penv.env_dir.is_dir()
