"""Which Runtime serves a deployment: a name (Deployment.runtime) to a factory.

Each runtime is two launchers behind one Runtime (runtimes/placed.py): its dedicated servers and its pool launcher,
chosen here once, so that neither forks on a revision's placement. The factories import their implementation when
first called, so that importing the registry (the reconciler, the API) loads neither the Kubernetes client nor the
sandbox; base.py, the protocol, imports no implementation at all.
Tests put a fake runtime in place with `monkeypatch.setitem(FACTORIES, "local", lambda: fake)`.
"""

from __future__ import annotations

from collections.abc import Callable

from deployments.models import Deployment
from deployments.runtimes.base import Runtime
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
