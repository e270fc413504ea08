"""Scale to zero through the gateway, on the fake Kubernetes API server (deployments/tests/fake_kube.py: no real API
server, KEDA or kube-proxy runs on this machine). The deployment is rolled out by the real runtime onto the fake; the
test then plays what the cluster does: KEDA (it reads the gateway's `modelport_gateway_held_requests` gauge, which is
what its demand trigger queries through Prometheus, and scales the Deployment from 0 to 1 with the /scale PATCH
KEDA's operator sends), the Deployment controller and kubelet (fake_kube.rollout_succeeds makes the pod ready), and
kube-proxy (the Service's port refuses connections while no pod is ready, and answers once one is: a scripted Triton
is started on it then).

What is checked: a request to the deployment at zero is held, not refused, while its pod starts, and forwarded once
Triton answers ready; the hostile case, one team's many held requests, never holds another team's, which is held and
answered beside them, while the hoarding team's own extra request is a 503 with Retry-After past its bound."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import replace
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from prometheus_client import REGISTRY
from tritonclient.grpc import service_pb2 as pb

from deployments.models import Deployment, Revision
from deployments.runtimes.kubernetes import manifests
from deployments.runtimes.kubernetes.config import KubernetesConfig
from deployments.runtimes.kubernetes.kube import Kube
from deployments.runtimes.kubernetes.runtime import KubernetesRuntime, target_for
from deployments.tests import fake_kube
from deployments.tests.fake_kube import FakeKube
from gateway.tests.fake_upstream import FakeUpstream, Request, echo, response
from gateway.tests.grpc_support import PREFIX, infer_request, meta, stack
from tests.support.gateway_calls import call, run
from tests.support.people import Person

pytestmark = pytest.mark.kube

PROMETHEUS = "http://prometheus.observability.svc:9090"
INFER = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}).encode()
HOARD = 3  # GATEWAY_MAX_HELD_PER_TEAM here


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def triton(request: Request) -> bytes:
    if request.target == b"/v2/health/ready":
        return response(200)
    return echo(request)


def scale_to_zero_deployment(person: Person, name: str, upstream_url: str) -> Deployment:
    """A dedicated cluster deployment serving revision 1, which scales to zero, its Service at `upstream_url`."""
    deployment = Deployment.objects.create(team=person.team, name=name, runtime=Deployment.Runtime.KUBERNETES,
                                           upstream_url=upstream_url, status=Deployment.Status.READY)
    revision = Revision.objects.create(deployment=deployment, number=1, spec={
        "spec_version": 2, "runtime": "kubernetes",
        "autoscaling": {"min_replicas": 0, "max_replicas": 2, "metric": "cpu", "target": 70},
        "models": [{"name": "digits", "model": "digits", "version": 1, "format": "onnx", "max_batch_size": 8,
                    "instance_group": {"count": 1, "kind": "cpu", "gpus": []}, "response_cache": False}]})
    Deployment.objects.filter(pk=deployment.pk).update(serving_revision=revision, revision=revision)
    deployment.refresh_from_db()
    return deployment


def held(team: str, deployment: str) -> float:
    return REGISTRY.get_sample_value("modelport_gateway_held_requests", {"team": team, "deployment": deployment}) or 0


def replicas(kube: FakeKube, namespace: str, name: str) -> int:
    obj = kube.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}")
    assert obj is not None
    return int(obj["spec"]["replicas"])


def test_a_request_at_zero_is_held_until_its_pod_is_ready_and_another_teams_held_requests_never_hold_it(
        people: dict[str, Person], gateway_app: Any, kube: FakeKube, cfg: KubernetesConfig, settings: Any) -> None:
    settings.KUBERNETES_AUTOSCALING, settings.KUBERNETES_KEDA_PROMETHEUS_URL = "keda", PROMETHEUS
    settings.GATEWAY_MAX_HELD_PER_TEAM = HOARD
    settings.GATEWAY_SCALE_FROM_ZERO_WAIT_SECONDS = 10.0
    kube.custom_resources.add("scaledobjects.keda.sh")
    kube.on_apply = fake_kube.rollout_succeeds
    alice, charlie = people["alice"], people["charlie"]
    port, charlies_port = free_port(), free_port()  # nothing listens: a Service without a ready endpoint
    runtime = KubernetesRuntime(replace(cfg, autoscaling="keda", keda_prometheus_url=PROMETHEUS))
    namespace = cfg.team_namespace(alice.team.name)

    # Its objects as the runtime renders them (test_k8s_autoscaling.py rolls one out through the runtime), applied;
    # then KEDA takes the idle Deployment to zero.
    digits = scale_to_zero_deployment(alice, "digits", f"http://127.0.0.1:{port}")
    scale_to_zero_deployment(charlie, "hoard", f"http://127.0.0.1:{charlies_port}")
    keda_client = Kube.connect(runtime.cfg)
    for obj in manifests.build(target_for(digits.revision, runtime.cfg), namespace, runtime.cfg):  # type: ignore[arg-type]
        keda_client.apply(obj)
    scaled = kube.get(f"/apis/keda.sh/v1alpha1/namespaces/{namespace}/scaledobjects/digits")
    assert scaled is not None and scaled["spec"]["minReplicaCount"] == 0
    assert replicas(kube, namespace, "digits") == 1
    keda_client.scale(namespace, "digits", 0)
    assert replicas(kube, namespace, "digits") == 0

    async def keda_and_kube_proxy(stop: asyncio.Event) -> FakeUpstream:
        """KEDA's poll: demand above 0 and the Deployment at zero, scale it to one; once its pod is ready the
        Service's port answers. Charlie's deployment is never woken (its pod never comes)."""
        pod = FakeUpstream(triton)
        while not stop.is_set():
            if held(alice.team.name, "digits") > 0 and replicas(kube, namespace, "digits") == 0:
                await sync_to_async(keda_client.scale)(namespace, "digits", 1)
                assert replicas(kube, namespace, "digits") == 1  # the fake's controller made its pod ready
                pod.server = await asyncio.start_server(pod._serve, "127.0.0.1", port)
            await asyncio.sleep(0.05)
        return pod

    async def until(check: Any, what: str) -> None:
        deadline = time.monotonic() + 8
        while not check():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.02)

    async def scenario() -> None:
        app = gateway_app()
        stop = asyncio.Event()
        pod_task: asyncio.Task[FakeUpstream] | None = None
        try:
            def ask(person: Person, name: str) -> asyncio.Task[Any]:
                return asyncio.ensure_future(call(app, "POST", f"/serve/{name}/v2/models/digits/infer",
                                                  token=person.token, body=INFER,
                                                  headers={"content-type": "application/json"}))

            # Charlie holds as many requests as a team may, and one more is refused at once.
            hoard = [ask(charlie, "hoard") for _ in range(HOARD)]
            await until(lambda: held(charlie.team.name, "hoard") == HOARD, "charlie's requests are held")
            extra = await ask(charlie, "hoard")
            assert extra.status == 503 and extra.headers.get(b"retry-after"), extra.body
            assert b"GATEWAY_MAX_HELD_PER_TEAM" in extra.body

            # Alice's request is held beside them (her team's count is her own), and wakes her deployment.
            pod_task = asyncio.ensure_future(keda_and_kube_proxy(stop))
            reply = await ask(alice, "digits")
            assert reply.status == 200, reply.body
            assert json.loads(reply.body)["target"] == "/v2/models/digits/infer"
            assert held(alice.team.name, "digits") == 0
            # Up now: the next request is forwarded without a wait.
            again = await ask(alice, "digits")
            assert again.status == 200, again.body

            # Charlie's pod never comes: each held request ends with a 503 and Retry-After, the count with them.
            for task in hoard:
                answer = await task
                assert answer.status == 503 and answer.headers.get(b"retry-after"), answer.body
            assert held(charlie.team.name, "hoard") == 0
        finally:
            stop.set()
            if pod_task is not None:
                pod = await pod_task
                if pod.server is not None:
                    await pod.__aexit__()
            await app.close()

    run(scenario, timeout=60)


def test_over_grpc_a_request_at_zero_is_held_and_forwarded_once_triton_answers_ready(
        people: dict[str, Person], settings: Any) -> None:
    """The gRPC gateway holds the same way: it asks the revision's Triton over HTTP whether it is ready (its pod's
    HTTP port, which the NetworkPolicy opens to the gateway's pods as the gRPC one), then forwards over gRPC."""
    settings.GATEWAY_SCALE_FROM_ZERO_WAIT_SECONDS = 10.0
    alice = people["alice"]
    port = free_port()

    async def scenario() -> None:
        async with stack() as (_, fake, channel):
            def rows() -> None:
                deployment = scale_to_zero_deployment(alice, "digits-prod", f"http://127.0.0.1:{port}")
                Deployment.objects.filter(pk=deployment.pk).update(grpc_upstream=fake.target)

            await sync_to_async(rows)()
            sent = infer_request([2, 2], bytes(range(16)))
            asked = asyncio.ensure_future(channel.unary_unary(PREFIX + "ModelInfer")(
                sent, metadata=meta(alice), timeout=20))
            deadline = time.monotonic() + 8
            while held(alice.team.name, "digits-prod") < 1:
                assert time.monotonic() < deadline, "the request is held"
                await asyncio.sleep(0.02)
            assert fake.calls == []  # nothing reached Triton while no pod was ready
            async with FakeUpstream(triton) as pod:
                pod.server.close()  # type: ignore[union-attr]  # the fake's own port is not the Service's
                pod.server = await asyncio.start_server(pod._serve, "127.0.0.1", port)
                answer = pb.ModelInferResponse.FromString(await asyncio.wait_for(asked, 15))
            assert answer.raw_output_contents == [bytes(range(16))]
            assert [c.method for c in fake.calls] == ["ModelInfer"]
            assert held(alice.team.name, "digits-prod") == 0

    run(scenario, timeout=40)
