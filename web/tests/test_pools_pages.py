"""Shared servers on the pages (issue 24): the deploy form's shared placement with what fits in each pool, planned
by the same rules as the API; the deployment page's pool, loaded or idle, and cold start; the operator overview's
pools. No Triton: the pool's loads are the rows the local runtime writes (deployments/runtimes/local/pool.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from deployments import planning
from deployments.model_entry import ModelEntry
from deployments.models import Deployment, ModelMemory, Pool, PoolLoad, PoolServer
from deployments.pools import fingerprint
from deployments.revision_spec import Placement
from models_registry.models import ModelVersion
from models_registry.tests.pipeline_versions import ready_version
from tests.artifacts import PYTHON_SIGNATURE, python_model_zip
from tests.support.deploying import deploy
from tests.support.people import Person, signed_in
from tests.support.versions import make_ready_version
from web import overview, revisions
from web.tests.deploy_forms import NEW, as_post, form_data

MiB = 2**20


def shared_form(**changes: Any) -> dict[str, Any]:
    return form_data(**{"placement": "shared", "pool": "shared", "idle_unload_seconds": "", **changes})


def measure(version: ModelVersion, memory: int) -> None:
    ModelMemory.objects.create(version=version, fingerprint=fingerprint(), memory_bytes=memory)


def load(deployment: Deployment, **fields: Any) -> PoolLoad:
    assert deployment.revision is not None
    pool = Pool.objects.get(name=deployment.revision.spec.placement.pool)
    return PoolLoad.objects.create(pool=pool, deployment=deployment, revision=deployment.revision, **fields)


def test_the_deploy_form_offers_shared_against_dedicated_with_what_fits(alice: Person, charlie: Person,
                                                                      digits: ModelVersion) -> None:
    measure(digits, 300 * MiB)
    Pool.objects.create(name="acme-own", memory_budget_bytes=2**30, team=alice.team)
    Pool.objects.create(name="globex-own", memory_budget_bytes=2**30, team=charlie.team)

    response = signed_in(alice).get(NEW)
    content = response.content.decode()

    assert "Shared: loads on demand, costs less" in content and "Dedicated: a Triton server of its own" in content
    # Dedicated unless the operator changed the default (DEPLOYMENT_DEFAULT_PLACEMENT).
    assert re.search(r'<input type="radio" name="placement" value="dedicated"[^>]* checked', content)
    # The 2 GiB built-in pool, empty: alice's team may take half of it (POOL_TEAM_SHARE), 2 copies of 300 MiB
    # reserved at 1.5 times (POOL_MODEL_MEMORY_HEADROOM); her own 1 GiB pool: all of it, 2 too. Charlie's is not there.
    assert "fits 2 more (450 MiB each)" in content.split('id="pool-fit-shared"')[1].split("</li>")[0]
    assert "fits 2 more (450 MiB each)" in content.split('id="pool-fit-acme-own"')[1].split("</li>")[0]
    assert "globex-own" not in content


def test_the_deploy_form_shows_a_cluster_pools_gpu_share_with_its_honest_isolation(
        alice: Person, digits: ModelVersion) -> None:
    Pool.objects.create(name="half-t4", runtime=Pool.Runtime.KUBERNETES, memory_budget_bytes=2**30,
                        gpu_share="hami", gpus=1, gpu_memory_mib=8192, gpu_type="tesla-t4")
    Pool.objects.create(name="sliced", runtime=Pool.Runtime.KUBERNETES, memory_budget_bytes=2**30,
                        gpu_share="time_sliced")
    content = signed_in(alice).get(NEW).content.decode()
    half = content.split('id="pool-fit-half-t4"')[1].split("</li>")[0]
    assert "8192 MiB of GPU memory" in half and "tesla-t4" in half and "no hardware or fault isolation" in half
    assert "no memory isolation" in content.split('id="pool-fit-sliced"')[1].split("</li>")[0]
    assert "GPU:" not in content.split('id="pool-fit-shared"')[1].split("</li>")[0]  # a local pool has none


def test_a_model_never_measured_says_so_instead_of_guessing(alice: Person, digits: ModelVersion) -> None:
    content = signed_in(alice).get(NEW).content.decode()
    assert "not measured yet" in content.split('id="pool-fit-shared"')[1].split("</li>")[0]


def test_a_full_pool_says_what_it_needs_and_what_is_free(alice: Person, charlie: Person,
                                                         digits: ModelVersion) -> None:
    measure(digits, 300 * MiB)
    make_ready_version(charlie, "quasar")
    other = deploy(charlie, "quasar-prod", model="quasar", placement={"mode": "shared"})
    load(other, state=PoolLoad.State.LOADED, memory_bytes=2 * 2**30 - 100 * MiB)
    content = signed_in(alice).get(NEW).content.decode()
    fit = content.split('id="pool-fit-shared"')[1].split("</li>")[0]
    assert "full now: needs 450 MiB, 100 MiB free" in fit and "1948 MiB of 2048 MiB used, 1 model loaded" in fit


def test_the_pool_list_shows_another_teams_use_as_totals_only_never_its_models_or_deployments(
        alice: Person, charlie: Person, digits: ModelVersion) -> None:
    measure(digits, 300 * MiB)
    make_ready_version(charlie, "quasar")
    theirs = deploy(charlie, "quasar-prod", model="quasar", placement={"mode": "shared"})
    load(theirs, state=PoolLoad.State.LOADED, memory_bytes=1548 * MiB)

    content = signed_in(alice).get(NEW).content.decode()

    fit = content.split('id="pool-fit-shared"')[1].split("</li>")[0]
    assert "1548 MiB of 2048 MiB used, 1 model loaded" in fit and "fits 1 more (450 MiB each)" in fit
    for secret in ("quasar", "globex", "charlie"):
        assert secret not in content, secret
    # And the edit form of alice's own shared deployment, which lists the pools too.
    mine = deploy(alice, "digits-mine", placement={"mode": "shared"})
    edit = signed_in(alice).get(f"/deployments/{mine.name}/edit/").content.decode()
    assert "1548 MiB of 2048 MiB used" in edit
    assert "quasar" not in edit and "globex" not in edit


def test_what_fits_on_the_form_is_the_teams_share_as_the_api_says(alice: Person, digits: ModelVersion) -> None:
    measure(digits, 300 * MiB)
    mine = deploy(alice, "digits-big", placement={"mode": "shared"})
    load(mine, state=PoolLoad.State.LOADED, memory_bytes=900 * MiB)
    # The pool has 1148 MiB free, but a team may take 1024 MiB of it (POOL_TEAM_SHARE 0.5) and has 900 loaded.
    fit = signed_in(alice).get(NEW).content.decode().split('id="pool-fit-shared"')[1].split("</li>")[0]
    assert "full now: needs 450 MiB, 124 MiB free" in fit
    [listed] = [p for p in alice.client().get("/api/v1/pools/?model=digits").json() if p["name"] == "shared"]
    assert listed["memory_free_bytes"] == 124 * MiB and listed["fit"]["copies"] == 0


def test_deploying_shared_through_the_form_stores_the_placement_with_the_pools_default(
        alice: Person, digits: ModelVersion) -> None:
    response = signed_in(alice).post(NEW, shared_form())
    assert response.status_code == 302, response.context["form"].errors
    spec = Deployment.objects.get(name="digits-prod").revision.spec
    assert spec.placement == Placement(mode="shared", pool="shared", idle_unload_seconds=600)

    response = signed_in(alice).post(NEW, shared_form(name="digits-quick", idle_unload_seconds="60"))
    assert response.status_code == 302
    assert Deployment.objects.get(name="digits-quick").revision.spec.placement.idle_unload_seconds == 60


def test_a_dedicated_deployment_ignores_the_hidden_pool_fields(alice: Person, digits: ModelVersion) -> None:
    response = signed_in(alice).post(NEW, shared_form(placement="dedicated", idle_unload_seconds="5"))
    assert response.status_code == 302
    assert not Deployment.objects.get(name="digits-prod").revision.spec.placement.shared


def test_a_python_model_in_the_pool_of_every_team_is_refused_beside_the_placement(alice: Person) -> None:
    ready_version(alice, "tool", python_model_zip(), "tool.zip", signature=PYTHON_SIGNATURE)
    page = signed_in(alice).get("/deployments/new/?model=tool").content.decode()
    # The pool list says so before anything is sent, the option stays listed, disabled.
    assert "every team&#x27;s: no python models" in page.split('id="pool-fit-shared"')[1].split("</li>")[0]

    response = signed_in(alice).post("/deployments/new/?model=tool", shared_form(name="tool-shared", **{
        "m0-max_batch_size": "0", "m0-dynamic_batching": None, "m0-preferred_batch_size": "",
        "m0-instance_count": "1"}))

    assert response.status_code == 200
    [message] = response.context["form"].errors["placement"]
    assert "runs code a team uploaded" in message and "'dedicated'" in message
    assert not Deployment.objects.filter(name="tool-shared").exists()


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"pool": "globex-own"}, "pool", "Select a valid choice"),  # another team's pool is not even a choice
    ({"pool": "../../etc"}, "pool", "Select a valid choice"),
    ({"placement": "everywhere"}, "placement", "Select a valid choice"),
    ({"idle_unload_seconds": "-1"}, "idle_unload_seconds", "greater than or equal to 0"),
    ({"idle_unload_seconds": str(10**12)}, "idle_unload_seconds", "less than or equal to 2592000"),
    ({"idle_unload_seconds": "10m"}, "idle_unload_seconds", "Enter a whole number"),
])
def test_a_bad_placement_gets_a_message_beside_its_field(alice: Person, charlie: Person, digits: ModelVersion,
                                                         changes: dict[str, str], field: str, words: str) -> None:
    Pool.objects.create(name="globex-own", memory_budget_bytes=2**30, team=charlie.team)
    response = signed_in(alice).post(NEW, shared_form(**changes))
    assert response.status_code == 200
    assert any(words in message for message in response.context["form"].errors[field])
    assert not Deployment.objects.filter(name="digits-prod").exists()


def test_resources_of_a_shared_deployment_are_refused_with_what_to_do(alice: Person, digits: ModelVersion) -> None:
    response = signed_in(alice).post(NEW, shared_form(memory="1Gi"))
    assert response.status_code == 200
    errors = response.context["form"].non_field_errors()
    assert any("leave resources.cpu and resources.memory empty" in message for message in errors)


def test_the_settings_form_keeps_the_placement_and_changes_only_what_is_given(alice: Person,
                                                                             digits: ModelVersion) -> None:
    deployment = deploy(alice, placement={"mode": "shared", "idle_unload_seconds": 120})
    edit = f"/deployments/{deployment.name}/edit/"
    form = signed_in(alice).get(edit).context["form"]
    assert (form.initial["placement"], form.initial["pool"], form.initial["idle_unload_seconds"]) == (
        "shared", "shared", 120)

    assert signed_in(alice).post(edit, shared_form(idle_unload_seconds="120", **{
        "m0-instance_count": "3"})).status_code == 302
    deployment.refresh_from_db()
    assert deployment.revision.spec.placement == Placement(mode="shared", pool="shared", idle_unload_seconds=120)
    assert deployment.revision.spec.models[0].instance_group.count == 3

    assert signed_in(alice).post(edit, shared_form(placement="dedicated")).status_code == 302
    deployment.refresh_from_db()
    assert not deployment.revision.spec.placement.shared
    history = signed_in(alice).get(f"/deployments/{deployment.name}/").content.decode()
    assert "placement shared in pool shared, unloaded after 120 s unused → dedicated" in history


def test_a_new_idle_time_alone_on_the_settings_page_is_saved_in_place(alice: Person, digits: ModelVersion) -> None:
    deployment = deploy(alice, placement={"mode": "shared", "idle_unload_seconds": 120})
    edit = f"/deployments/{deployment.name}/edit/"
    shown = signed_in(alice).get(edit).context
    data = as_post(shown["form"], shown["model_forms"])  # what a browser sends back, the idle time changed only
    data["idle_unload_seconds"] = "30"

    response = signed_in(alice).post(edit, data, follow=True)

    assert response.status_code == 200
    assert (f"Saved: {deployment.name} now unloads its models after 30 s unused (0: never), in place: nothing was "
            "loaded again and no new revision was made.") in response.content.decode()
    deployment.refresh_from_db()
    assert deployment.revisions.count() == 1
    assert deployment.revision.spec.placement == Placement(mode="shared", pool="shared", idle_unload_seconds=30)


def test_the_deployment_page_shows_the_pool_loaded_or_idle_and_the_cold_start(alice: Person, charlie: Person,
                                                                             digits: ModelVersion) -> None:
    deployment = deploy(alice, placement={"mode": "shared", "idle_unload_seconds": 600})
    page = f"/deployments/{deployment.name}/"

    content = signed_in(alice).get(page).content.decode()
    assert "shared in pool <code>shared</code>" in content
    assert "not loaded yet" in content and "not measured yet" in content and "unloaded after 10 min unused" in content

    row = load(deployment, state=PoolLoad.State.LOADED, memory_bytes=42 * MiB, cold_start_seconds=0.8372,
               loaded_at=timezone.now())
    live = signed_in(alice).get(f"{page}live/").content.decode()
    assert 'data-state="loaded"' in live and "loaded · 42 MiB" in live and "0.84 s, its last load" in live

    PoolLoad.objects.filter(pk=row.pk).update(state=PoolLoad.State.UNLOADED)
    assert "idle: unloaded, its next request loads it" in signed_in(alice).get(f"{page}live/").content.decode()

    PoolLoad.objects.filter(pk=row.pk).update(state=PoolLoad.State.FAILED, message="pool 'shared' is full: stop x")
    assert "pool &#x27;shared&#x27; is full: stop x" in signed_in(alice).get(page).content.decode()
    assert signed_in(charlie).get(page).status_code == 404


def test_a_dedicated_deployment_says_it_has_a_server_of_its_own(alice: Person, deployment: Deployment) -> None:
    content = signed_in(alice).get(f"/deployments/{deployment.name}/").content.decode()
    assert "dedicated: a Triton server of its own" in content and 'id="deployment-pool-state"' not in content


def test_the_overview_shows_each_pools_budget_use_and_models(alice: Person, charlie: Person, digits: ModelVersion,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(overview, "worker_ping", lambda timeout=1.0: overview.Probe([], "no worker answered"))
    Pool.objects.create(name="acme-own", memory_budget_bytes=2**30, team=alice.team)
    first = deploy(alice, "digits-a", placement={"mode": "shared"})
    load(first, state=PoolLoad.State.LOADED, memory_bytes=512 * MiB, cold_start_seconds=1.25)
    second = deploy(alice, "digits-b", placement={"mode": "shared"})
    load(second, state=PoolLoad.State.UNLOADED)
    PoolServer.objects.create(pool=Pool.objects.get(name="shared"), pid=999_999_999, http_port=1, grpc_port=2,
                              metrics_port=3, log_path="/nonexistent", admin_key="k")
    operator = Client()
    operator.force_login(get_user_model().objects.create_superuser("olivia", "o@example.com", "password"))

    content = operator.get("/admin/overview/").content.decode()

    shared = content.split('id="overview-pool-shared"')[1].split("</tr>")[0]
    assert "every team (ONNX only)" in shared and "2048 MiB" in shared and "512 MiB (25%)" in shared
    assert "999999999" in shared and "gone" in shared
    loads = content.split('id="overview-pool-loads-shared"')[1].split("</table>")[0]
    assert "digits-a" in loads and "1.25 s" in loads and "digits-b" in loads and "unloaded" in loads
    own = content.split('id="overview-pool-acme-own"')[1].split("</tr>")[0]
    assert alice.team.name in own and "not started" in own


def test_the_revision_history_names_a_change_of_placement() -> None:
    shared = Placement(mode="shared", pool="shared", idle_unload_seconds=0)
    assert revisions.placement_words(shared) == "shared in pool shared, never unloaded"
    assert revisions.placement_words(Placement()) == "dedicated"


def test_the_operators_default_placement_is_the_forms_starting_choice(alice: Person, digits: ModelVersion,
                                                                    settings: Any) -> None:
    settings.DEPLOYMENT_DEFAULT_PLACEMENT = "shared"
    content = signed_in(alice).get(NEW).content.decode()
    assert re.search(r'<input type="radio" name="placement" value="shared"[^>]* checked', content)
    assert re.search(r'id="shared-fields"[^>]*>', content).group(0).endswith('data-placement="shared">')


@pytest.mark.parametrize("idle", [-1, 30 * 86400 + 1])
def test_the_planner_bounds_the_idle_time_for_callers_that_bypass_the_forms(alice: Person, digits: ModelVersion,
                                                                            idle: int) -> None:
    request = planning.DeployRequest(runtime="local", models=(ModelEntry.asked("digits"),),
                                     placement=planning.PlacementRequest(mode="shared", idle_unload_seconds=idle))
    with pytest.raises(planning.PlanError) as refused:
        planning.plan(alice.team, request)
    assert "between 0 (never unload) and 2592000 seconds" in refused.value.errors["placement.idle_unload_seconds"][0]


def test_the_dashboard_says_where_each_deployment_runs(alice: Person, digits: ModelVersion,
                                                       django_assert_max_num_queries: Any) -> None:
    """The dashboard had no placement column: a shared deployment looked like a dedicated one until opened."""
    client = signed_in(alice)
    client.post(NEW, shared_form())
    client.post(NEW, form_data(name="digits-own"))
    shared = Deployment.objects.get(name="digits-prod")
    content = client.get("/").content.decode()
    assert '<th scope="col">Placement</th>' in content
    assert '<td id="deployment-placement-digits-prod">shared: shared, not loaded yet</td>' in content
    assert '<td id="deployment-placement-digits-own">dedicated</td>' in content
    load(shared, state=PoolLoad.State.LOADED)
    with django_assert_max_num_queries(9):  # one query for every row's load, not one per row
        content = client.get("/dashboard/live/").content.decode()
    assert '<td id="deployment-placement-digits-prod">shared: shared, loaded</td>' in content


def test_the_pool_options_are_short_and_the_list_below_says_it_all(alice: Person, digits: ModelVersion) -> None:
    """The select's text was cut off ("shared (every team, ONNX only): full now: needs 300 MiB, 124 MiB free unl")."""
    content = signed_in(alice).get(NEW).content.decode()
    option = re.search(r'<option value="shared"[^>]*>([^<]*)</option>', content)
    assert option is not None and option.group(1) == "shared (every team, ONNX only): not measured yet"
    assert "not measured yet: measured at its first load in a pool" in content.split('id="pool-fit-shared"')[1]
