"""A shared deployment's page header says whether its pool's Triton runs sandboxed: the deployment has no Triton
of its own, and the header said "Sandboxed –" while its events said the pool's was sandboxed."""

from __future__ import annotations

from deployments.models import Deployment, PoolServer
from deployments.pools import shared_pool
from models_registry.models import ModelVersion
from tests.support.deploying import post_deployment
from tests.support.people import Person, signed_in


def pool_server(sandboxed: bool) -> PoolServer:
    return PoolServer.objects.create(pool=shared_pool(), pid=2**22 + 11, http_port=1, grpc_port=2, metrics_port=3,
                                     log_path="/nonexistent", admin_key="k", sandboxed=sandboxed)


def test_a_shared_deployments_header_shows_its_pools_sandboxing(alice: Person, digits: ModelVersion) -> None:
    assert post_deployment(alice, placement={"mode": "shared"}).status_code == 201
    page = signed_in(alice)
    assert 'id="deployment-sandboxed">–<' in page.get("/deployments/digits-prod/").content.decode()  # none runs

    server = pool_server(sandboxed=True)
    content = page.get("/deployments/digits-prod/").content.decode()
    assert "the Triton of pool &#x27;shared&#x27;, shared with other deployments" in content
    assert '">yes</dd>' in content.split('id="deployment-sandboxed"')[1][:200]
    assert 'id="deployment-egress">blocked' in content

    PoolServer.objects.filter(pk=server.pk).update(sandboxed=False)
    content = page.get("/deployments/digits-prod/").content.decode()
    assert "<strong>no</strong>: the Triton of pool &#x27;shared&#x27;" in content


def test_a_dedicated_deployment_is_not_shown_a_pools_sandboxing(alice: Person, digits: ModelVersion) -> None:
    assert post_deployment(alice).status_code == 201
    pool_server(sandboxed=True)
    assert Deployment.objects.get().revision.spec.placement.shared is False  # type: ignore[union-attr]

    content = signed_in(alice).get("/deployments/digits-prod/").content.decode()

    assert 'id="deployment-sandboxed">–<' in content
