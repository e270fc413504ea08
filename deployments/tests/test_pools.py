"""Shared servers (issue 24) without a Triton: the pools a team may use and what fits in them, and placement in
the deploy API (who may share a process, what is stored in the revision, what the deployment's JSON shows)."""

from __future__ import annotations

from typing import Any

import pytest

from deployments.models import Deployment, ModelMemory, Pool, PoolLoad
from deployments.pool_names import loaded_name
from deployments.pools import fingerprint
from deployments.revision_spec import RevisionSpec
from models_registry.tests.pipeline_versions import ready_version
from tests.artifacts import PYTHON_SIGNATURE, python_model_zip
from tests.support.people import Person
from tests.support.versions import make_ready_version


def test_every_team_sees_the_built_in_shared_pool_and_its_own_pools_only(alice: Person, charlie: Person) -> None:
    Pool.objects.create(name="acme-gpu", memory_budget_bytes=2**30, team=alice.team)
    listed = alice.client().get("/api/v1/pools/").json()
    assert [p["name"] for p in listed] == ["acme-gpu", "shared"]
    shared = listed[1]
    assert shared == {"name": "shared", "runtime": "local", "teams": "all", "memory_budget_bytes": 2 * 2**30,
                      "memory_used_bytes": 0, "models_loaded": 0, "memory_free_bytes": 2**30,
                      "idle_unload_seconds": 600,
                      "gpu": {"share": "none", "count": 0, "resources": {}, "isolation": "CPU only: no GPU"}}
    assert [p["name"] for p in charlie.client().get("/api/v1/pools/").json()] == ["shared"]


def test_what_fits_comes_from_the_measured_memory_of_the_version(alice: Person, charlie: Person) -> None:
    version = make_ready_version(alice)
    unmeasured = alice.client().get("/api/v1/pools/?model=digits").json()[0]["fit"]
    assert unmeasured["memory_bytes"] is None and unmeasured["fits"] is None and "not been measured" in unmeasured[
        "message"]
    ModelMemory.objects.create(version=version, fingerprint=fingerprint(), memory_bytes=300 * 2**20)
    fit = alice.client().get("/api/v1/pools/?model=digits&version=1").json()[0]["fit"]
    # Half of the 2 GiB pool is the team's share (POOL_TEAM_SHARE), and a copy reserves its peak times
    # POOL_MODEL_MEMORY_HEADROOM (1.5): 2 copies of 450 MiB, not 6 of 300.
    assert fit == {"model": "digits", "version": 1, "memory_bytes": 450 * 2**20, "fits": True, "copies": 2,
                   "message": fit["message"]}
    # Another team's model is as absent as one that does not exist; a bad query is a 400 saying what to fix.
    assert charlie.client().get("/api/v1/pools/?model=digits").status_code == 404
    bad = alice.client().get("/api/v1/pools/?version=x")
    assert bad.status_code == 400 and "version" in bad.json()["error"]["fields"]
    assert alice.client().get("/api/v1/pools/?version=1").status_code == 400


def _deploy(person: Person, name: str, placement: dict[str, Any] | None, model: str = "digits") -> Any:
    body: dict[str, Any] = {"name": name, "models": [{"model": model}]}
    if placement is not None:
        body["placement"] = placement
    return person.client().post("/api/v1/deployments/", body, format="json")


def test_a_shared_deployment_stores_its_placement_with_the_pools_defaults(alice: Person) -> None:
    make_ready_version(alice)
    response = _deploy(alice, "digits-shared", {"mode": "shared"})
    assert response.status_code == 201, response.json()
    data = response.json()
    assert data["placement"] == {"mode": "shared", "pool": "shared", "idle_unload_seconds": 600}
    assert [m["loaded"] for m in data["models"]] == [False]
    spec = Deployment.objects.get(name="digits-shared").revision.spec
    assert spec.placement.shared and spec.to_json()["placement"]["pool"] == "shared"
    assert RevisionSpec.from_json(spec.to_json()) == spec
    # A PATCH of the idle time keeps the mode and the pool.
    patched = alice.client().patch("/api/v1/deployments/digits-shared/", {"placement": {"idle_unload_seconds": 5}},
                                   format="json")
    assert patched.status_code == 200, patched.json()
    assert patched.json()["placement"] == {"mode": "shared", "pool": "shared", "idle_unload_seconds": 5}
    dedicated = _deploy(alice, "digits-own", None).json()
    assert dedicated["placement"] == {"mode": "dedicated"}


def test_an_old_revision_without_a_placement_reads_as_dedicated() -> None:
    spec = RevisionSpec.from_json({"spec_version": 2, "runtime": "local", "models": []})
    assert not spec.placement.shared and spec.placement.mode == "dedicated"


def test_a_python_model_may_not_share_a_process_with_other_teams(alice: Person) -> None:
    ready_version(alice, "tool", python_model_zip(), "tool.zip", signature=PYTHON_SIGNATURE)
    response = _deploy(alice, "tool-shared", {"mode": "shared"}, model="tool")
    assert response.status_code == 400
    [message] = response.json()["error"]["fields"]["placement"]
    assert "runs code a team uploaded" in message and "'dedicated'" in message and "pool of your own team" in message
    # In a pool of its own team it may.
    Pool.objects.create(name="acme-own", memory_budget_bytes=2**30, team=alice.team)
    assert _deploy(alice, "tool-own", {"mode": "shared", "pool": "acme-own"}, model="tool").status_code == 201


def test_a_python_model_in_its_teams_pool_may_list_what_the_runtime_env_has_and_nothing_more(
        alice: Person) -> None:
    Pool.objects.create(name="acme-own", memory_budget_bytes=2**30, team=alice.team)
    ready_version(alice, "met", python_model_zip({"requirements.txt": b"numpy\n"}), "met.zip", PYTHON_SIGNATURE)
    assert _deploy(alice, "met-own", {"mode": "shared", "pool": "acme-own"}, model="met").status_code == 201

    # A package the runtime env lacks would need an environment of its own, which a pool's one Triton cannot give.
    ready_version(alice, "needs", python_model_zip({"requirements.txt": b"numpy\nleftpad-modelport-test==1.0\n"}),
                  "needs.zip", PYTHON_SIGNATURE)
    response = _deploy(alice, "needs-own", {"mode": "shared", "pool": "acme-own"}, model="needs")
    assert response.status_code == 400, response.json()
    [message] = response.json()["error"]["fields"]["placement"]
    assert "needs python packages the runtime env lacks (leftpad-modelport-test==1.0)" in message
    assert "numpy" not in message  # the runtime env has it: only what is missing is named
    assert "placement mode 'dedicated'" in message and "one Python environment for the whole server" in message
    assert not Deployment.objects.filter(name="needs-own").exists()
    # Dedicated, the same version gets its environment.
    assert _deploy(alice, "needs-dedicated", {"mode": "dedicated"}, model="needs").status_code == 201


@pytest.mark.parametrize(("placement", "field", "words"), [
    ({"mode": "shared", "pool": "nope"}, "placement.pool", "GET /api/v1/pools/"),
    ({"mode": "dedicated", "pool": "shared"}, "placement.mode", "for placement mode 'shared'"),
    # A newcomer's walk: --idle-unload on a dedicated deployment is refused saying how to move it into a pool.
    ({"mode": "dedicated", "idle_unload_seconds": 300}, "placement.mode", "modelport deploy NAME --shared"),
    ({"mode": "everywhere"}, "placement.mode", "not a valid choice"),
    ({"mode": "shared", "idle_unload_seconds": -1}, "placement.idle_unload_seconds", "greater than or equal"),
])
def test_a_bad_placement_is_a_400_that_says_what_to_choose(alice: Person, placement: dict[str, Any], field: str,
                                                           words: str) -> None:
    make_ready_version(alice)
    response = _deploy(alice, "digits-bad", placement)
    assert response.status_code == 400, response.json()
    fields = response.json()["error"]["fields"]
    flat = fields.get(field) or fields.get(field.partition(".")[0], {})
    if isinstance(flat, dict):
        flat = flat.get(field.partition(".")[2], [])
    assert any(words in message for message in flat), fields


def test_another_teams_pool_is_as_absent_as_one_that_does_not_exist(alice: Person, charlie: Person) -> None:
    Pool.objects.create(name="globex-own", memory_budget_bytes=2**30, team=charlie.team)
    make_ready_version(alice)
    response = _deploy(alice, "digits-x", {"mode": "shared", "pool": "globex-own"})
    assert response.status_code == 400
    assert "no pool named 'globex-own' for your team" in response.json()["error"]["fields"]["placement.pool"][0]


def test_the_names_in_a_pool_are_unique_to_deployment_and_revision() -> None:
    assert loaded_name(12, 3, "digits") == "d12-r3-digits"
    assert PoolLoad.State.LOADED == "loaded"


def test_shared_deployments_count_nothing_against_the_teams_memory_ceiling_their_pool_budgets_it(
        alice: Person, settings: Any) -> None:
    # A pool's Triton is the operator's, bounded by its budget: thirty small shared models must not be refused as
    # thirty servers of the default memory each (they were: the sixth of 4Gi passed the team's 21.5Gi).
    settings.TEAM_MAX_MEMORY = "768Mi"
    settings.SANDBOX_SERVER_MEMORY, settings.POOL_MODEL_MEMORY_MIN = "256Mi", "128Mi"
    make_ready_version(alice)
    for index in range(6):
        response = _deploy(alice, f"shared-{index}", {"mode": "shared"})
        assert response.status_code == 201, response.json()
    for name in ("own-1", "own-2"):  # a derived 384Mi each: 768Mi of 768Mi, the shared ones holding none of it
        assert _deploy(alice, name, None).status_code == 201
    refused = _deploy(alice, "own-3", None)
    assert refused.status_code == 400
    assert "384Mi more would make 1.1Gi (the running and starting deployments hold 768Mi)" in str(refused.json())

def test_abandoning_a_relaunch_of_the_serving_revision_keeps_the_serving_load(alice: Person) -> None:
    """A failed relaunch of the revision that serves reuses the serving row (one per pool and revision): abandoning
    it must not unload it and delete the row the gateway's name mapping comes from."""
    from deployments.runtimes.base import Launch
    from deployments.runtimes.local import pool as local_pool

    make_ready_version(alice)
    assert _deploy(alice, "digits-shared", {"mode": "shared"}).status_code == 201
    deployment = Deployment.objects.get(name="digits-shared")
    load = PoolLoad.objects.create(pool=Pool.objects.get(name="shared"), revision=deployment.revision,
                                   deployment=deployment, state=PoolLoad.State.LOADED)
    serving = Launch(revision_id=deployment.revision.pk, url="http://127.0.0.1:1", description="pool",
                     ref=f"{local_pool.REF_PREFIX}{load.pk}")
    Deployment.objects.filter(pk=deployment.pk).update(serving_launch=serving.to_json(),
                                                       serving_revision=deployment.revision)
    local_pool.abandon(serving)  # the relaunch, the same row
    assert PoolLoad.objects.filter(pk=load.pk, state=PoolLoad.State.LOADED).exists()
    # A launch that does not serve is abandoned as before.
    Deployment.objects.filter(pk=deployment.pk).update(serving_launch=None)
    local_pool.abandon(serving)
    assert not PoolLoad.objects.filter(pk=load.pk).exists()


def _shared_load(person: Person, name: str, state: str = PoolLoad.State.LOADING) -> PoolLoad:
    created = _deploy(person, name, {"mode": "shared"})
    assert created.status_code == 201, created.json()
    deployment = Deployment.objects.get(name=name, team=person.team)
    return PoolLoad.objects.create(pool=Pool.objects.get(name="shared"), revision=deployment.revision,
                                   deployment=deployment, state=state)


def test_health_checks_and_observations_never_wait_for_another_teams_load(
        alice: Person, settings: Any, tmp_path: Any) -> None:
    """Another team's slow load holds the pool's lock: the reconcile lane looks again next tick instead of
    queueing behind it (a blocked observe would hold a reconcile worker for the length of that load)."""
    import threading
    import time

    from deployments.runtimes.base import Launch
    from deployments.runtimes.local import pool as local_pool

    settings.POOLS_DIR = tmp_path
    make_ready_version(alice)
    load = _shared_load(alice, "digits-shared")
    launch = Launch(revision_id=load.revision_id, url="http://127.0.0.1:1", description="pool",
                    ref=f"{local_pool.REF_PREFIX}{load.pk}")
    held, release = threading.Event(), threading.Event()

    def another_load() -> None:  # another team's load, as another process would hold the lock
        with local_pool.locked(load.pool):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=another_load, daemon=True)
    holder.start()
    assert held.wait(10)
    try:
        started = time.monotonic()
        observed = local_pool.observe(launch)
        health = local_pool.check(launch)
        with pytest.raises(local_pool.PoolBusy):
            local_pool.load_revision(load.pk, wait=False)
        assert time.monotonic() - started < 5, "observe/check waited for the pool's lock"
    finally:
        release.set()
        holder.join(10)
    assert observed.state == "starting", observed
    assert "retry shortly" in observed.message
    assert health.ok


@pytest.mark.django_db
def test_a_pool_triton_is_never_started_unsandboxed_where_the_sandbox_is_required(
        settings: Any, tmp_path: Any, monkeypatch: Any) -> None:
    from deployments.pools import shared_pool
    from deployments.runtimes.base import RuntimeUnavailable
    from deployments.runtimes.local import confined as local_confined
    from deployments.runtimes.local import pool as local_pool
    from infra import sandbox_settings
    from modelport.core.sandbox import Capabilities

    settings.POOLS_DIR = tmp_path
    settings.SANDBOX_REQUIRED = True
    monkeypatch.setattr(sandbox_settings, "sandbox_capabilities", lambda: Capabilities(False, "no user namespaces"))

    def start(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("started a pool's Triton with no sandbox")

    monkeypatch.setattr(local_confined, "start_confined", start)
    with pytest.raises(RuntimeUnavailable) as refused:
        local_pool.ensure_server(shared_pool())
    assert "SANDBOX_REQUIRED" in str(refused.value) and "no user namespaces" in str(refused.value)


def test_code_never_loads_into_an_unsandboxed_pool_triton(alice: Person, settings: Any, tmp_path: Any,
                                                          monkeypatch: Any) -> None:
    """A team's own pool may hold TorchScript, but not in a Triton that runs without the sandboxing (a machine
    with SANDBOX_REQUIRED off): the load fails with the reason, before anything reaches Triton."""
    from deployments.models import PoolServer, Revision
    from deployments.runtimes.local import pool as local_pool

    settings.POOLS_DIR = tmp_path
    pool = Pool.objects.create(name="acme-own", memory_budget_bytes=2**30, team=alice.team)
    server = PoolServer.objects.create(pool=pool, pid=1, http_port=1, grpc_port=2, metrics_port=3, log_path="x",
                                       admin_key="k", sandboxed=False)
    monkeypatch.setattr(local_pool, "_ensure_server", lambda _: server)
    deployment = Deployment.objects.create(team=alice.team, name="tool")
    revision = Revision.objects.create(deployment=deployment, number=1, spec={
        "spec_version": 2, "runtime": "local", "placement": {"mode": "shared", "pool": "acme-own"},
        "models": [{"name": "tool", "version": 1, "format": "torchscript"}]})
    load = PoolLoad.objects.create(pool=pool, revision=revision, deployment=deployment)
    done = local_pool.load_revision(load.pk)
    assert done.state == PoolLoad.State.FAILED and "not sandboxed" in done.message and "'tool'" in done.message


MIB = 2**20


def _loaded(person: Person, name: str, memory: int, *, idle_seconds: float, resident_seconds: float) -> PoolLoad:
    from datetime import timedelta

    from django.utils import timezone

    load = _shared_load(person, name, PoolLoad.State.LOADED)
    now = timezone.now()
    PoolLoad.objects.filter(pk=load.pk).update(memory_bytes=memory, last_used_at=now - timedelta(seconds=idle_seconds),
                                               loaded_at=now - timedelta(seconds=resident_seconds))
    load.refresh_from_db()
    return load


def test_one_team_can_neither_hold_the_shared_pool_nor_churn_the_other_teams_out(
        alice: Person, charlie: Person, settings: Any) -> None:
    """The shared pool (1000 MiB): a team's models take at most POOL_TEAM_SHARE of it, a load evicts the team's
    own idle models first, and another team's only once they have been resident long enough."""
    from deployments.runtimes.local import pool as local_pool

    settings.POOL_TEAM_SHARE = 0.5
    settings.POOL_EVICTION_MIN_IDLE_SECONDS = 30
    settings.POOL_EVICTION_MIN_RESIDENCY_SECONDS = 300
    make_ready_version(alice)
    make_ready_version(charlie)
    theirs = _loaded(charlie, "theirs", 450 * MIB, idle_seconds=60, resident_seconds=60)
    Pool.objects.filter(name="shared").update(memory_budget_bytes=1000 * MIB)
    own = _loaded(alice, "own-idle", 300 * MIB, idle_seconds=60, resident_seconds=3600)
    pool = Pool.objects.get(name="shared")
    new = _shared_load(alice, "incoming")
    new = PoolLoad.objects.select_related("deployment").get(pk=new.pk)

    # Past the team's share: refused, naming the share, and nobody else's model is touched.
    with pytest.raises(local_pool.PoolFull) as refused:
        local_pool._make_room(pool, new, 600 * MIB)
    assert "POOL_TEAM_SHARE" in str(refused.value)
    assert PoolLoad.objects.get(pk=theirs.pk).state == PoolLoad.State.LOADED

    # Within the share but not the pool: alice's own idle model goes, charlie's (resident a minute) stays.
    local_pool._make_room(pool, new, 400 * MIB)
    assert PoolLoad.objects.get(pk=own.pk).state == PoolLoad.State.UNLOADED
    assert PoolLoad.objects.get(pk=theirs.pk).state == PoolLoad.State.LOADED

    # When alice has nothing left to evict, charlie's recently loaded model is not churned out for her.
    PoolLoad.objects.filter(pk=theirs.pk).update(memory_bytes=700 * MIB)
    with pytest.raises(local_pool.PoolFull):
        local_pool._make_room(pool, new, 400 * MIB)
    assert PoolLoad.objects.get(pk=theirs.pk).state == PoolLoad.State.LOADED
    # Resident long enough and idle: then it may go.
    from datetime import timedelta

    from django.utils import timezone

    PoolLoad.objects.filter(pk=theirs.pk).update(loaded_at=timezone.now() - timedelta(hours=1))
    local_pool._make_room(pool, new, 400 * MIB)
    assert PoolLoad.objects.get(pk=theirs.pk).state == PoolLoad.State.UNLOADED


def test_a_version_never_measured_counts_at_its_artifacts_size_not_zero(alice: Person, settings: Any) -> None:
    from deployments.runtimes.local import pool as local_pool
    from models_registry.models import Blob

    settings.POOL_UNMEASURED_FACTOR = 2.0
    settings.POOL_MODEL_MEMORY_MIN, settings.POOL_MODEL_MEMORY_HEADROOM = "0", 1.0
    version = make_ready_version(alice)
    assert _deploy(alice, "digits-shared", {"mode": "shared"}).status_code == 201
    spec = Deployment.objects.get(name="digits-shared").revision.spec
    size = Blob.objects.get(sha256=version.sha256).size
    assert size > 0 and local_pool._estimate(spec) == 2 * size
    ModelMemory.objects.create(version=version, fingerprint=fingerprint(), memory_bytes=123)
    assert local_pool._estimate(spec) == 123


def test_a_model_reserves_its_peak_with_headroom_and_at_least_the_minimum(alice: Person, settings: Any) -> None:
    """What a local pool reserves (and limits a model's processes to) is its measured peak times
    POOL_MODEL_MEMORY_HEADROOM, never under POOL_MODEL_MEMORY_MIN: a model never measured is not let in at its
    artifact's few hundred bytes."""
    from deployments.runtimes.local import pool as local_pool

    settings.POOL_MODEL_MEMORY_MIN, settings.POOL_MODEL_MEMORY_HEADROOM = "128Mi", 1.5
    version = make_ready_version(alice)
    assert _deploy(alice, "digits-shared", {"mode": "shared"}).status_code == 201
    spec = Deployment.objects.get(name="digits-shared").revision.spec
    assert local_pool._estimate(spec) == 128 * MIB
    ModelMemory.objects.create(version=version, fingerprint=fingerprint(), memory_bytes=300 * MIB)
    assert local_pool._estimate(spec) == 450 * MIB


@pytest.mark.parametrize("headroom", [1.0, 1.5, 1.7])
def test_a_model_ended_at_its_limit_is_reserved_twice_that_limit_next(settings: Any, headroom: float) -> None:
    """The figure remembered for a model whose process passed its limit (at a load or under use) makes its next
    reservation twice that limit, whatever the headroom: a first load that needs more doubles each time."""
    from deployments.pools import figure_past_limit, reservation

    settings.POOL_MODEL_MEMORY_MIN, settings.POOL_MODEL_MEMORY_HEADROOM = "128Mi", headroom
    for limit in (128 * MIB, 256 * MIB, 300 * MIB + 7, 5 * 2**30):
        assert 2 * limit <= reservation(figure_past_limit(limit)) <= 2 * limit + 2


def test_a_load_past_the_teams_share_or_the_budget_evicts_nobody(alice: Person, charlie: Person,
                                                                 settings: Any) -> None:
    """A revision that needs more than its team may ever hold (a model loaded again with twice its limit, say) is
    refused at once: no idle model of its own team nor of another is unloaded for a load that cannot fit anyway."""
    from deployments.runtimes.local import pool as local_pool

    settings.POOL_TEAM_SHARE = 0.5
    settings.POOL_EVICTION_MIN_IDLE_SECONDS = 0
    settings.POOL_EVICTION_MIN_RESIDENCY_SECONDS = 0
    make_ready_version(alice)
    make_ready_version(charlie)
    own = _loaded(alice, "own-idle", 300 * MIB, idle_seconds=60, resident_seconds=3600)
    theirs = _loaded(charlie, "theirs", 300 * MIB, idle_seconds=60, resident_seconds=3600)
    Pool.objects.filter(name="shared").update(memory_budget_bytes=1000 * MIB)  # the built-in pool, made by a deploy
    pool = Pool.objects.get(name="shared")
    new = PoolLoad.objects.select_related("deployment").get(pk=_shared_load(alice, "incoming").pk)
    with pytest.raises(local_pool.PoolFull) as refused:
        local_pool._make_room(pool, new, 501 * MIB)
    assert "takes 501 MiB" in str(refused.value) and "POOL_TEAM_SHARE" in str(refused.value)
    assert PoolLoad.objects.get(pk=own.pk).state == PoolLoad.State.LOADED
    assert PoolLoad.objects.get(pk=theirs.pk).state == PoolLoad.State.LOADED


def test_another_teams_load_under_way_holds_its_reservation_so_two_loads_never_pass_the_budget(
        alice: Person, charlie: Person, settings: Any) -> None:
    """Triton loads a revision with only its team's lock held, so two teams' loads run side by side: what the one
    under way reserved counts against the pool's budget (not its models: not loaded yet) until its attempt ends,
    and a load of the other team that would pass the budget with it is refused instead of overcommitting the
    pool's memory (where the kernel would end some team's model process). A load never counts against itself."""
    from deployments.pools import memory_used
    from deployments.runtimes.local import pool as local_pool

    settings.POOL_TEAM_SHARE = 1.0
    make_ready_version(alice)
    make_ready_version(charlie)
    theirs = _shared_load(charlie, "theirs-loading")
    Pool.objects.filter(name="shared").update(memory_budget_bytes=1000 * MIB)  # the built-in pool, made by a deploy
    pool = Pool.objects.get(name="shared")
    PoolLoad.objects.filter(pk=theirs.pk).update(reserved_bytes=600 * MIB)
    asked = _shared_load(alice, "asked-only")  # asked for, no load under way: counts nothing
    mine = PoolLoad.objects.select_related("deployment").get(pk=_shared_load(alice, "incoming").pk)

    assert memory_used(pool) == (600 * MIB, 0)
    assert memory_used(pool, alice.team.pk) == (0, 0)
    assert memory_used(pool, charlie.team.pk, exclude=theirs.pk) == (0, 0)
    with pytest.raises(local_pool.PoolFull) as refused:
        local_pool._make_room(pool, mine, 500 * MIB)
    assert "has 400 MiB free" in str(refused.value) and "takes 500 MiB" in str(refused.value)
    local_pool._make_room(pool, mine, 400 * MIB)  # what is left fits

    # The attempt over (loaded, failed or dead: load_revision clears it), its room is free again.
    PoolLoad.objects.filter(pk=theirs.pk).update(reserved_bytes=0)
    local_pool._make_room(pool, mine, 500 * MIB)
    # A reservation left by an earlier attempt of the asking load itself is not counted against it.
    PoolLoad.objects.filter(pk=mine.pk).update(reserved_bytes=900 * MIB)
    local_pool._make_room(pool, mine, 900 * MIB)
    assert PoolLoad.objects.get(pk=asked.pk).reserved_bytes == 0


def test_the_pools_list_shows_the_teams_own_use_never_the_other_teams(alice: Person, charlie: Person) -> None:
    make_ready_version(charlie)
    _loaded(charlie, "theirs", 700 * MIB, idle_seconds=0, resident_seconds=0)
    mine = alice.client().get("/api/v1/pools/").json()[0]
    assert mine["memory_used_bytes"] == 0 and mine["models_loaded"] == 0
    # What alice may still load: her share (1 GiB), within the 2 GiB pool's free 1.3 GiB; charlie's figures nowhere.
    assert mine["memory_free_bytes"] == 2**30
    theirs = charlie.client().get("/api/v1/pools/").json()[0]
    assert theirs["memory_used_bytes"] == 700 * MIB and theirs["models_loaded"] == 1
    assert theirs["memory_free_bytes"] == 2**30 - 700 * MIB


def test_a_pool_triton_that_exits_quotes_only_the_callers_own_lines_of_its_log(tmp_path: Any, db: Any) -> None:
    """The pool's log holds every team's models' errors: a failed start tells a team only those naming its own."""
    from deployments.models import PoolServer
    from deployments.pools import shared_pool
    from deployments.runtimes.base import RuntimeUnavailable
    from deployments.runtimes.local import pool as local_pool

    log = tmp_path / "triton.log"
    log.write_text(
        "E0101 00:00:00.000000 1 model_lifecycle.cc:1] failed to load 'd99-r1-secret-fraud-model' version 1: "
        "Internal: their credentials file /data/x is missing\n")
    server = PoolServer.objects.create(pool=shared_pool(), pid=1, http_port=1, grpc_port=2, metrics_port=3,
                                       log_path=str(log), admin_key="k")  # pid 1 is no tritonserver: exited
    with pytest.raises(RuntimeUnavailable) as refused:
        local_pool._wait_live(server, "d7-r1-", seconds=1)
    assert "d99" not in str(refused.value) and "fraud" not in str(refused.value)
    with log.open("a") as out:
        out.write("E0101 00:00:01.000000 1 model_lifecycle.cc:1] failed to load 'd7-r1-digits' version 1: "
                  "Invalid argument: bad config\n")
    with pytest.raises(RuntimeUnavailable) as own:
        local_pool._wait_live(server, "d7-r1-", seconds=1)
    assert "'digits'" in str(own.value) and "d99" not in str(own.value)


def test_the_pools_list_names_none_of_another_teams_models_or_deployments_in_a_pool_open_to_all(
        alice: Person, charlie: Person) -> None:
    make_ready_version(alice)
    ModelMemory.objects.create(version=make_ready_version(charlie, "quasar"), fingerprint=fingerprint(),
                               memory_bytes=300 * MIB)
    created = _deploy(charlie, "quasar-prod", {"mode": "shared"}, model="quasar")
    assert created.status_code == 201, created.json()
    theirs = Deployment.objects.get(name="quasar-prod")
    PoolLoad.objects.create(pool=Pool.objects.get(name="shared"), revision=theirs.revision, deployment=theirs,
                            state=PoolLoad.State.LOADED, memory_bytes=1548 * MIB)

    for path in ("/api/v1/pools/", "/api/v1/pools/?model=digits"):
        response = alice.client().get(path)
        assert response.status_code == 200
        text = response.content.decode()
        for secret in ("quasar", "globex", "charlie", str(1548 * MIB)):
            assert secret not in text, (path, secret)
        [shared] = [p for p in response.json() if p["name"] == "shared"]
        # Her own use, and what she may still load: the pool's free total (500 MiB) within her share (1 GiB).
        assert (shared["memory_used_bytes"], shared["models_loaded"]) == (0, 0)
        assert shared["memory_free_bytes"] == 500 * MIB
    # Asking what fits of charlie's model is a 404 that does not say it exists.
    refused = alice.client().get("/api/v1/pools/?model=quasar")
    assert refused.status_code == 404 and "globex" not in refused.content.decode()


def test_a_pooled_pipeline_calls_its_steps_by_their_pooled_names() -> None:
    from deployments import pool_names
    from deployments.model_entry import ModelEntry
    from deployments.revision_spec import RevisionSpec
    from modelport.core.definitions import EnsembleStep, PipelineDefinition
    from modelport.core.signature import Signature

    step = EnsembleStep(model="digits", version=1, input_map={"input": "x"}, output_map={"output": "y"})
    spec = RevisionSpec(runtime="local", models=(
        ModelEntry(name="digits", version=1, format="onnx", signature=Signature()),
        ModelEntry(name="pipe", version=1, format="ensemble", signature=Signature(),
                   definition=PipelineDefinition(signature=Signature(), steps=(step,)))))
    pooled = pool_names.pooled_spec(spec, "t7-")
    assert pooled.model_names == ("t7-digits", "t7-pipe")
    assert pooled.models[1].step_references == (("t7-digits", 1),)
    assert spec.models[1].step_references == (("digits", 1),)  # the revision's own spec is untouched
    assert pool_names.load_order(spec, "t7-") == ["t7-digits", "t7-pipe"]


def test_the_sweep_of_unused_model_cgroups_keeps_those_of_another_teams_load_under_way(
        alice: Person, charlie: Person) -> None:
    """Loads run outside the pool's lock: the sweep under it (pool_memory.remove_unused) must not take the cgroup
    of a model another team is loading right now (its row says loading and has no server yet), which would leave
    that model's stubs waiting for a cgroup that is gone."""
    from deployments.models import PoolServer
    from deployments.pools import shared_pool
    from deployments.runtimes.local import pool as local_pool

    make_ready_version(alice)
    make_ready_version(charlie)
    shared = shared_pool()
    server = PoolServer.objects.create(pool=shared, pid=1, http_port=1, grpc_port=2, metrics_port=3,
                                       log_path="x", admin_key="k")
    mine = _shared_load(alice, "digits-mine", PoolLoad.State.LOADED)
    PoolLoad.objects.filter(pk=mine.pk).update(server=server)
    theirs = _shared_load(charlie, "digits-theirs")  # loading: no server yet
    failed = _shared_load(charlie, "digits-failed", PoolLoad.State.FAILED)
    kept = local_pool._loaded_names(shared, server)
    assert any(n.startswith(local_pool._prefix(mine)) for n in kept)
    assert any(n.startswith(local_pool._prefix(theirs)) for n in kept)
    assert not any(n.startswith(local_pool._prefix(failed)) for n in kept)
