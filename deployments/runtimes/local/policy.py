"""The local runtime's policy for a planned revision (LocalRuntime.check_plan): what this machine can serve (one
server, no GPU, no autoscaling), resource quantities it can enforce, requirement lines it can install, and the
sandbox's refusal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from deployments import local_env, pyenvs
from deployments.revision_spec import ModelEntry, Resources, RevisionSpec
from deployments.runtimes.local import confined, pyenv
from deployments.spec import validate_repository
from modelport.core import requirements as requirement_lines
from modelport.core import sandbox
from modelport.core.runtime_env import RuntimeEnvError, server_environment


def resource_errors(resources: Resources) -> dict[str, list[str]]:
    """resources.memory and resources.cpu the local runtime cannot enforce, per field."""
    errors: dict[str, list[str]] = {}
    for key, parse in (("memory", sandbox.memory_bytes), ("cpu", sandbox.cpu_millicores)):
        value = getattr(resources, key)
        if not value:
            continue
        try:
            parse(str(value))
        except ValueError as exc:
            errors[f"resources.{key}"] = [str(exc)]
    return errors


# Where the renderer's checks run before anything is rendered: no file is read, so any path does.
_NO_ARTIFACT_YET = Path("artifact")


def plan_errors(spec: RevisionSpec) -> dict[str, list[str]]:
    """The local runtime's policy for a planned revision (LocalRuntime.check_plan)."""
    errors: dict[str, list[str]] = {}

    def add(key: str, message: str) -> None:
        errors.setdefault(key, []).append(message)

    for entry in spec.models:
        _check_requirements(entry, add)
    if spec.placement.shared:
        refusal = pool_requirements_refusal(spec)
        if refusal:
            add("placement", refusal)
    if spec.replicas != 1:
        add("replicas", "the local runtime runs one Triton server per deployment: use replicas 1, or runtime "
                        "'kubernetes'")
    if spec.resources.gpu:
        add("resources.gpu", "the local runtime has no GPU: use gpu 0, or runtime 'kubernetes'")
    if spec.autoscaling:
        add("autoscaling", "the local runtime runs one Triton server per deployment: autoscaling needs runtime "
                           "'kubernetes'")
    for key, messages in resource_errors(spec.resources).items():
        errors.setdefault(key, []).extend(messages)
    refusal = confined.sandbox_refusal(spec)
    if refusal:
        add("runtime", refusal)
    found = validate_repository(spec.repository(lambda entry: _NO_ARTIFACT_YET), "local",
                                local_frameworks=local_env.local_frameworks())
    for key, messages in found.items():
        errors.setdefault(key, []).extend(messages)
    return errors


def _runtime_identity() -> pyenvs.RuntimeIdentity:
    env = pyenv.runtime_env()
    return pyenvs.runtime_identity(env.bin_dir / "python", env.site_packages, env=server_environment(env))


def _check_requirements(entry: ModelEntry, add: Callable[[str, str], None]) -> None:
    """The local runtime installs a python model's requirements (deployments/pyenvs.py) when each line is a plain
    requirement the runtime env does not contradict (`numpy==2.4.6` over its numpy 1.26.4 can never be installed:
    refused here, naming the line, rather than failing the build with pip's ResolutionImpossible); whether pip
    finds the rest shows when the environment is built (the deployment fails with pip's message)."""
    try:
        parsed = requirement_lines.parse_requirements(list(entry.requirements))
    except requirement_lines.RequirementError as exc:
        add(f"{entry.name}.requirements", f"model {entry.name!r} version {entry.version}: {exc}")
        return
    if not parsed:
        return
    try:
        identity = _runtime_identity()
    except (RuntimeEnvError, pyenvs.BuildError):
        return  # said when the environment is prepared: the runtime cannot install python packages
    for conflict in pyenvs.runtime_conflicts(parsed, identity):
        add(f"{entry.name}.requirements", f"model {entry.name!r} version {entry.version}: {conflict}")


def pool_requirements_refusal(spec: RevisionSpec) -> str | None:
    """Why a shared revision's python requirements cannot be met in a pool, or None. A pool's Triton runs every
    model it loads with one Python environment: the stubs take their interpreter's prefix from the first python3 on
    the server's PATH (see start_confined), fixed when the server starts, and its sandbox can read only the
    directories named then. So a pool serves requirements the runtime env already meets, and nothing that needs an
    environment of its own; a dedicated Triton gets one (deployments/pyenvs.py)."""
    for entry in spec.models:
        if not entry.requirements:
            continue
        try:
            parsed = requirement_lines.parse_requirements(list(entry.requirements))
        except requirement_lines.RequirementError:
            return None  # said beside the model's requirements (_check_requirements)
        try:
            identity = _runtime_identity()
        except (RuntimeEnvError, pyenvs.BuildError) as exc:
            return (f"model {entry.name!r} lists python requirements, and whether the runtime env a pool's Triton "
                    f"runs with meets them cannot be told here ({exc}): use placement mode 'dedicated'")
        missing = [str(r) for r in parsed if not pyenvs.satisfied_by(r, identity)]
        if missing:
            return (f"model {entry.name!r} needs python packages the runtime env lacks ({', '.join(missing)}), and "
                    "a pool's Triton runs every model it loads with the runtime env alone (one Python environment "
                    "for the whole server, fixed when it starts): use placement mode 'dedicated', where they are "
                    "installed into an environment of the deployment's own, or a version whose requirements the "
                    "runtime env already meets")
    return None
