"""A shared deployment through the gateway (issue 24) with a scripted upstream standing in for the pool's Triton
(a fake: the real pool Triton runs in deployments/tests/test_local_pool_e2e.py). What is checked is what a hostile
caller could do with the gateway's choices: reach the pool unmapped, or freeze the event loop with a big answer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from asgiref.sync import sync_to_async

from deployments.models import Deployment, PoolLoad
from gateway.tests.fake_upstream import FakeUpstream, Request, echo, response
from gateway.tests.pool_support import shared_deployment
from tests.support.gateway_calls import call, run
from tests.support.people import Person

INFER = json.dumps({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}).encode()
def test_a_shared_revision_without_its_load_is_a_503_never_the_unmapped_pool(
        people: dict[str, Person], gateway_app: Any) -> None:
    """The row gone (an abandoned relaunch deleted it) while the route stays: the request must not reach the
    pool's Triton with the caller's path as it is, where `d3-r1-<victim>` is another team's model."""
    async def scenario() -> None:
        async with FakeUpstream(echo) as pool_triton:
            await sync_to_async(shared_deployment)(people["alice"], "mine", pool_triton.url, load=None)
            app = gateway_app()
            reply = await call(app, "POST", "/serve/mine/v2/models/d3-r1-victim/infer", token=people["alice"].token,
                               body=INFER, headers={"content-type": "application/json"})
            assert reply.status in (404, 503), reply.body
            assert pool_triton.requests == []
            own = await call(app, "POST", "/serve/mine/v2/models/digits/infer", token=people["alice"].token,
                             body=INFER, headers={"content-type": "application/json"})
            assert own.status == 503 and b"retry" in own.body.lower() and own.headers.get(b"retry-after")
            assert pool_triton.requests == []
            await app.close()

    run(scenario)


def test_another_pool_model_by_its_pool_name_is_not_found(people: dict[str, Person], gateway_app: Any) -> None:
    async def scenario() -> None:
        async with FakeUpstream(echo) as pool_triton:
            await sync_to_async(shared_deployment)(people["alice"], "mine", pool_triton.url)
            app = gateway_app()
            reply = await call(app, "GET", "/serve/mine/v2/models/d3-r1-victim", token=people["alice"].token)
            assert reply.status == 404 and pool_triton.requests == []
            await app.close()

    run(scenario)


def big_answer(rows: int) -> bytes:
    """Triton's JSON answer as Triton writes it (model_name first, no spaces), `rows` floats of output."""
    data = ", ".join("0.5" for _ in range(rows))  # spaced: a re-encoding would not give these bytes back
    return ('{"model_name":"d{pk}-r1-digits","model_version":"1","outputs":[{"name":"y","datatype":"FP32",'
            f'"shape":[{rows}],"data":[{data}]}}]}}').encode()


def test_a_big_pool_answer_is_streamed_with_only_its_model_name_changed(
        people: dict[str, Person], gateway_app: Any) -> None:
    """An answer of megabytes is never parsed on the event loop: its first bytes are renamed and the rest goes
    out as it comes, byte for byte, as a dedicated deployment's does."""
    answers: dict[str, bytes] = {}

    def answer(request: Request) -> bytes:
        return response(200, answers["body"], {"Content-Type": "application/json"})

    async def scenario() -> None:
        async with FakeUpstream(answer) as pool_triton:
            deployment = await sync_to_async(shared_deployment)(people["alice"], "mine", pool_triton.url)
            answers["body"] = big_answer(2_000_000).replace(b"{pk}", str(deployment.pk).encode())
            app = gateway_app()
            reply = await call(app, "POST", "/serve/mine/v2/models/digits/infer", token=people["alice"].token,
                               body=INFER, headers={"content-type": "application/json"})
            assert reply.status == 200
            expected = answers["body"].replace(f"d{deployment.pk}-r1-".encode(), b"", 1)
            assert reply.body == expected  # byte for byte: nothing was parsed and written again
            assert int(reply.headers[b"content-length"]) == len(expected)
            bodies = [m for m in reply.messages if m["type"] == "http.response.body"]
            assert len(bodies) > 2 and reply.complete  # streamed, not read whole
            assert pool_triton.requests[0].target == b"/v2/models/d%d-r1-digits/infer" % deployment.pk
            # The pool's Triton is never asked to compress: a compressed answer could not be renamed or filtered.
            await call(app, "GET", "/serve/mine/v2/models/stats", token=people["alice"].token,
                       headers={"accept-encoding": "gzip"})
            assert b"accept-encoding" not in pool_triton.requests[-1].headers
            await app.close()

    run(scenario, timeout=60)


def test_a_binary_pool_answer_keeps_its_tensors_and_gets_its_header_length_told_again(
        people: dict[str, Person], gateway_app: Any) -> None:
    tensors = bytes(range(256)) * 8192  # 2 MiB of raw output
    holder: dict[str, bytes] = {}

    def answer(request: Request) -> bytes:
        header = holder["header"]
        return response(200, header + tensors, {"Content-Type": "application/octet-stream",
                                                "Inference-Header-Content-Length": str(len(header))})

    async def scenario() -> None:
        async with FakeUpstream(answer) as pool_triton:
            deployment = await sync_to_async(shared_deployment)(people["alice"], "mine", pool_triton.url)
            holder["header"] = (b'{"id":"a\\"b","model_name":"d%d-r1-digits","model_version":"1","outputs":[{"name":'
                                b'"y","datatype":"UINT8","shape":[%d],"parameters":{"binary_data_size":%d}}]}'
                                % (deployment.pk, len(tensors), len(tensors)))
            app = gateway_app()
            reply = await call(app, "POST", "/serve/mine/v2/models/digits/infer", token=people["alice"].token,
                               body=INFER, headers={"content-type": "application/json"})
            length = int(reply.headers[b"inference-header-content-length"])
            assert json.loads(reply.body[:length])["model_name"] == "digits"
            assert reply.body[length:] == tensors
            await app.close()

    run(scenario, timeout=60)


def test_one_teams_cold_starts_are_capped_and_its_next_waits_its_turn_within_the_hold(
        people: dict[str, Person], gateway_app: Any, settings: Any, monkeypatch: Any) -> None:
    """Slow loads of one team's idle deployments take at most its share of the gateway's own load threads: its second
    waits its turn (held, then a 503 "loading" past the wait, never an immediate refusal stock tritonclient would
    not retry, issue 31) and loads once the first is done; another team still gets a load started at once; and a
    pool whose locks stay held past the wait is a 503 with Retry-After, not a request held behind it."""
    import threading

    from deployments.runtimes.local import pool as local_pool

    settings.POOL_COLD_START_WAIT_SECONDS = 0.3
    release = threading.Event()
    started: list[int] = []
    waits: list[bool | float] = []

    def slow_load(load_id: int, wait: bool | float = True) -> PoolLoad:
        waits.append(wait)
        started.append(load_id)
        release.wait(20)
        return PoolLoad.objects.get(pk=load_id)

    monkeypatch.setattr(local_pool, "load_revision", slow_load)

    async def scenario() -> None:
        async with FakeUpstream(echo) as pool_triton:
            alice, charlie = people["alice"], people["charlie"]
            loads = {}
            for person, name in ((alice, "a1"), (alice, "a2"), (charlie, "c1")):
                deployment = await sync_to_async(shared_deployment)(person, name, pool_triton.url,
                                                                    load=PoolLoad.State.UNLOADED)
                loads[name] = await sync_to_async(lambda d=deployment: PoolLoad.objects.get(deployment=d).pk)()
            app = gateway_app()

            async def ask(person: Person, name: str) -> Any:
                return await call(app, "GET", f"/serve/{name}/v2/models/digits", token=person.token)

            try:
                first = await ask(alice, "a1")
                assert first.status == 503 and b"loading its models" in first.body
                queued = await ask(alice, "a2")
                assert queued.status == 503 and b"loading its models" in queued.body, queued.body
                assert queued.headers[b"retry-after"] == b"2"
                other = await ask(charlie, "c1")
                assert other.status == 503 and b"loading its models" in other.body
                assert sorted(started) == sorted([loads["a1"], loads["c1"]]) and pool_triton.requests == []
                # Every wait for the pool's locks is bounded by the hold's (never an unbounded block).
                assert all(w is not True and w == settings.POOL_COLD_START_WAIT_SECONDS for w in waits), waits
            finally:
                release.set()
            for _ in range(100):  # a2's turn comes once a1's load is done
                if loads["a2"] in started:
                    break
                await asyncio.sleep(0.05)
            assert loads["a2"] in started

            def busy(load_id: int, wait: bool | float = True) -> PoolLoad:
                raise local_pool.PoolBusy("pool 'shared' is loading or unloading another model")

            monkeypatch.setattr(local_pool, "load_revision", busy)
            settings.POOL_COLD_START_WAIT_SECONDS = 30
            held = await ask(alice, "a2")
            assert held.status == 503 and b"busy" in held.body and held.headers[b"retry-after"] == b"2"
            await app.close()

    run(scenario, timeout=20)


def _on_cluster(deployment: Deployment) -> PoolLoad:
    """Move the deployment's load into a pool on the kubernetes runtime (idle-unloaded)."""
    from deployments.models import Pool

    pool = Pool.objects.create(name="gpu", runtime=Pool.Runtime.KUBERNETES, memory_budget_bytes=2**30)
    PoolLoad.objects.filter(deployment=deployment).update(pool=pool, state=PoolLoad.State.UNLOADED,
                                                          idle_unload_seconds=60)
    return PoolLoad.objects.get(deployment=deployment)


def test_a_request_to_an_idle_cluster_revision_is_held_until_the_worker_has_it_loaded(
        people: dict[str, Person], gateway_app: Any, settings: Any) -> None:
    """The gateway only marks the row (it holds no Kubernetes credentials); the worker (here a thread standing in
    for its periodic pass, tested against the fake API server in test_k8s_pool.py) has the agents load it and marks
    it loaded; the held request is then answered by the pool under the revision's pool name."""
    import threading
    import time

    settings.POOL_COLD_START_WAIT_SECONDS = 10
    seen: list[str] = []

    def worker(load_id: int) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = PoolLoad.objects.filter(pk=load_id).values("state", "woken_at").first()
            if row and row["state"] == PoolLoad.State.LOADING and row["woken_at"] is not None:
                seen.append("woken")
                time.sleep(0.3)
                PoolLoad.objects.filter(pk=load_id).update(state=PoolLoad.State.LOADED, woken_at=None)
                return
            time.sleep(0.05)

    async def scenario() -> None:
        async with FakeUpstream(echo) as pool_triton:
            deployment = await sync_to_async(shared_deployment)(people["alice"], "mine", pool_triton.url)
            load = await sync_to_async(_on_cluster)(deployment)
            thread = threading.Thread(target=worker, args=(load.pk,))
            thread.start()
            app = gateway_app()
            started = time.monotonic()
            reply = await call(app, "POST", "/serve/mine/v2/models/digits/infer", body=INFER,
                               token=people["alice"].token)
            thread.join(5)
            assert seen == ["woken"]
            assert reply.status == 200, reply.body
            assert time.monotonic() - started >= 0.3  # held while it loaded
            assert [r.target for r in pool_triton.requests] == [f"/v2/models/d{deployment.pk}-r1-digits/infer".encode()]
            await app.close()

    run(scenario, timeout=20)


def test_past_the_wait_an_idle_cluster_revision_is_a_503_with_retry_after_and_its_load_goes_on(
        people: dict[str, Person], gateway_app: Any, settings: Any) -> None:
    settings.POOL_COLD_START_WAIT_SECONDS = 0.3

    async def scenario() -> None:
        async with FakeUpstream(echo) as pool_triton:
            deployment = await sync_to_async(shared_deployment)(people["alice"], "mine", pool_triton.url)
            load = await sync_to_async(_on_cluster)(deployment)
            app = gateway_app()
            reply = await call(app, "GET", "/serve/mine/v2/models/digits", token=people["alice"].token)
            assert reply.status == 503 and reply.headers[b"retry-after"] == b"2" and b"loading" in reply.body
            assert pool_triton.requests == []
            row = await sync_to_async(PoolLoad.objects.get)(pk=load.pk)
            assert row.state == PoolLoad.State.LOADING and row.woken_at is not None  # for the worker to load
            await asyncio.sleep(1.5)  # the load thread's own wait ends
            await app.close()

    run(scenario, timeout=20)


def test_a_shared_deployments_readiness_is_its_own_models_never_the_pool_servers(
        people: dict[str, Person], gateway_app: Any) -> None:
    """The pool's Triton answers /v2/health/ready for every team's models (400 while another team's model loads,
    issue 30): a shared deployment's readiness is its own models' ready, idle is ready without waking it, and a
    revision still loading is not ready."""
    def pool_triton_answer(request: Request) -> bytes:
        if request.target == b"/v2/health/ready":
            return response(400)  # a neighbour's model loading, as a strict pool server says
        if request.target.endswith(b"-digits/ready"):
            return response(200)
        return response(404)

    async def scenario() -> None:
        async with FakeUpstream(pool_triton_answer) as pool_triton:
            alice = people["alice"]
            mine = await sync_to_async(shared_deployment)(alice, "mine", pool_triton.url)
            await sync_to_async(shared_deployment)(alice, "idle", pool_triton.url, load=PoolLoad.State.UNLOADED)
            await sync_to_async(shared_deployment)(alice, "starting", pool_triton.url, load=PoolLoad.State.LOADING)
            app = gateway_app()
            for method in ("GET", "HEAD"):
                reply = await call(app, method, "/serve/mine/v2/health/ready", token=alice.token)
                assert reply.status == 200 and reply.body == b"", reply.body
            assert [r.target for r in pool_triton.requests] == [f"/v2/models/d{mine.pk}-r1-digits/ready".encode()] * 2
            idle = await call(app, "GET", "/serve/idle/v2/health/ready", token=alice.token)
            starting = await call(app, "GET", "/serve/starting/v2/health/ready", token=alice.token)
            assert idle.status == 200 and starting.status == 400
            assert len(pool_triton.requests) == 2  # the idle one was not woken, nor the pool asked for it
            await app.close()

    run(scenario)
