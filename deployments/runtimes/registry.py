"""Which Runtime serves a deployment: a name (Deployment.runtime) to a factory.

Each runtime is two launchers behind one Runtime (runtimes/placed.py): its dedicated servers and its pool launcher,
chosen here once, so that neither forks on a revision's placement. The factories import their implementation when
first called, so that importing the registry (the reconciler, the API) loads neither the Kubernetes client nor the
sandbox; base.py, the protocol, imports no implementation at all.
Tests put a fake runtime in place with `monkeypatch.setitem(FACTORIES, "local", lambda: fake)`.
"""

from __future__ import annotations

from collections.abc import Callable

from django.core.checks import CheckMessage

from deployments.models import Deployment
from deployments.runtimes.base import ManifestsRefused, Runtime
from deployments.runtimes.placed import Placed


def _local() -> Runtime:
    from deployments.runtimes.local.pool import LocalPoolRuntime
    from deployments.runtimes.local.runtime import LocalRuntime

    return Placed(LocalRuntime(), LocalPoolRuntime())


def _kubernetes() -> Runtime:
    from deployments.runtimes.kubernetes.pool_runtime import KubernetesPoolRuntime
    from deployments.runtimes.kubernetes.runtime import KubernetesRuntime

    cluster = KubernetesRuntime()
    return Placed(cluster, KubernetesPoolRuntime(cluster))


FACTORIES: dict[str, Callable[[], Runtime]] = {
    Deployment.Runtime.LOCAL: _local,
    Deployment.Runtime.KUBERNETES: _kubernetes,
}


def runtime_named(name: str) -> Runtime:
    try:
        factory = FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown runtime {name!r}: use one of {', '.join(FACTORIES)}") from None
    return factory()


def runtime_for(deployment: Deployment) -> Runtime:
    return runtime_named(deployment.runtime)


def runtimes() -> list[Runtime]:
    """Every runtime, for the periodic passes (idle unloads, orphan sweeps)."""
    return [runtime_named(name) for name in FACTORIES]


def can_tune(deployment: Deployment) -> bool:
    """Whether a tune can measure the deployment: its runtime starts temporary servers on this machine (the local
    one does, the Kubernetes one does not). The API, the page's tune panel and its form all ask this."""
    return runtime_for(deployment).can_tune


CANNOT_TUNE = "a tune measures temporary Tritons on this machine: only local deployments can be tuned"


def settings_checks() -> list[CheckMessage]:
    """The runtimes' checks of their own settings (a Kubernetes quantity or egress rule that does not parse)."""
    from deployments.runtimes.kubernetes.checks import kubernetes_settings

    return kubernetes_settings()


def kubernetes_manifests(deployment: Deployment) -> str:
    """The YAML of the deployment's current revision on the configured cluster, for GitOps. Raises
    ManifestsRefused (runtimes/base.py) with what the revision lacks there."""
    from deployments.runtimes.kubernetes.manifests import ManifestError
    from deployments.runtimes.kubernetes.runtime import export_manifests

    try:
        return export_manifests(deployment)
    except ManifestError as exc:
        raise ManifestsRefused(str(exc)) from None


def connect_receivers() -> None:
    """Connect what the runtimes answer for the apps below (the model registry's python_trial_call: a sandboxed Triton
    of the model's own, the local runtime's work)."""
    from deployments.runtimes.local import trial_call  # noqa: F401 - its receiver connects on import
