"""Shared revisions on the Kubernetes runtime (issue 24): a pool's Triton Deployment, and its loads Secret.

The reconciler's steps for a shared revision (KubernetesPoolRuntime, the pool launcher the registry puts beside
KubernetesRuntime, whose connection and repositories it uses; runtimes/placed.py), as in a local pool:

- prepare: the revision's models are rendered renamed `d<deployment>-r<revision>-<model>` (as in a local pool)
  and uploaded to S3 under the revision's prefix, with the manifest of their sizes and sha256;
- launch: the pool's objects are applied (pool_manifests.py; every one checked to be this pool's first), and the
  revision's entry (its models in load order, its files with presigned URLs) is added to the pool's loads Secret
  with a conditional update (the resourceVersion just read), so that two workers never lose each other's entries;
- observe: each running pod's agent reports, in the last status line of its container's log, what it loaded and
  what it refused; the revision is ready once every running pod has it loaded, failed once one refused it;
- retire, stop, teardown: the revision's entries are removed from the Secret (the agents unload them and remove
  their files); what a deployment left in S3 is removed by KubernetesRuntime as for a dedicated one.

Only the pool's own objects are ever applied or edited, and in its loads Secret only the deployment's own keys.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from deployments import logtail, pool_events, pool_names, pool_policy, pools
from deployments.models import Deployment, ModelMemory, Pool, PoolLoad, Revision
from deployments.pool_models import SHARING_STRATEGIES, SHARING_STRATEGY_LABEL, GpuShare
from deployments.revision_spec import RevisionSpec
from deployments.runtimes.base import (
    POOL_REF_PREFIX,
    PREPARED,
    Health,
    Launch,
    Observation,
    Preparation,
    RuntimeUnavailable,
    Wake,
    is_pool_launch,
)
from deployments.runtimes.kubernetes import manifests, pool_agent, pool_manifests, pool_restarts, s3repo
from deployments.runtimes.kubernetes import status as k8s_status
from deployments.runtimes.kubernetes.config import KubernetesConfig, NamespaceRefused
from deployments.runtimes.kubernetes.kube import Kube, KubeError, Unreachable, explain
from deployments.runtimes.kubernetes.runtime import KubernetesRuntime

REF_PREFIX = POOL_REF_PREFIX
AGENT_LOG_LINES = 200
AGENT_LOG_BYTES = 256 * 1024
MAX_SECRET_BYTES = 900 * 1024
MAX_POOL_NAME = 63 - len("pool-") - len("-agent")  # the Service's name is a DNS label; the ConfigMap's the longest


def target_for(pool: Pool, cfg: KubernetesConfig) -> pool_manifests.PoolTarget:
    selector: dict[str, str] = {}
    if pool.gpu_type:
        selector[cfg.gpu_node_label] = cfg.gpu_label_value(pool.gpu_type)
    strategy = SHARING_STRATEGIES.get(GpuShare(pool.gpu_share))
    if strategy:
        selector[SHARING_STRATEGY_LABEL] = strategy
    return pool_manifests.PoolTarget(
        name=pool.name, team=pool.team.name if pool.team is not None else "",
        memory_budget_bytes=pool.memory_budget_bytes,
        gpu_requests=tuple(pool.gpu_requests().items()), gpu_node_selector=tuple(sorted(selector.items())),
        gpu_load_fraction=pool.gpu_load_fraction, gpu_count=pool.gpu_count, min_replicas=pool.min_replicas,
        max_replicas=max(pool.min_replicas, pool.max_replicas))


def namespace_for(pool: Pool, cfg: KubernetesConfig) -> str:
    """A team's own pool runs in the team's namespace; a pool open to every team in KUBERNETES_POOL_NAMESPACE."""
    if pool.team is None:
        return cfg.pool_namespace
    try:
        return cfg.namespace_for(pool.team.name)
    except NamespaceRefused as exc:
        raise RuntimeUnavailable(str(exc)) from None


def _pool_of(revision: Revision) -> Pool:
    pool = Pool.objects.select_related("team").filter(name=revision.spec.placement.pool).first()
    if pool is None or pool.runtime != Pool.Runtime.KUBERNETES:
        raise RuntimeUnavailable(f"pool {revision.spec.placement.pool!r} is not a pool on the kubernetes runtime "
                                 "(an operator removed or changed it): choose another pool, or placement "
                                 "'dedicated'")
    if len(pool.name) > MAX_POOL_NAME:
        raise RuntimeUnavailable(f"pool {pool.name!r} has a name over {MAX_POOL_NAME} characters, too long for its "
                                 "Kubernetes objects: an operator must rename it")
    return pool


revision_key = pool_names.revision_key


# --- Preparing and launching --------------------------------------------------------------------------------------


def prepare(rt: KubernetesRuntime, revision: Revision) -> None:
    """Render the revision's models renamed for the pool and upload them (idempotent)."""
    _pool_of(revision)
    prefix = pool_names.name_prefix(revision.deployment_id, revision.number)
    rt.upload(revision, pool_names.pooled_spec(revision.spec, prefix))


def launch(rt: KubernetesRuntime, revision: Revision) -> Launch:
    pool = _pool_of(revision)
    kube = rt.kube()
    namespace = namespace_for(pool, rt.cfg)
    target = target_for(pool, rt.cfg)
    load, _ = PoolLoad.objects.get_or_create(pool=pool, revision=revision, defaults={
        "deployment": revision.deployment, "idle_unload_seconds": revision.spec.placement.idle_unload_seconds})
    launch = Launch(revision_id=revision.pk, url=pool_manifests.service_url(target, namespace, rt.cfg),
                    grpc_target=pool_manifests.service_grpc_target(target, namespace, rt.cfg),
                    ref=f"{REF_PREFIX}{load.pk}",
                    description=f"pool {pool.name!r}: Deployment {namespace}/{target.object_name}")
    if load.state != PoolLoad.State.LOADED:
        refusal = _over_budget(pool, load, revision)
        if refusal:
            PoolLoad.objects.filter(pk=load.pk).update(state=PoolLoad.State.FAILED, message=refusal)
            return launch  # observe says why; nothing is asked of the agents
        PoolLoad.objects.filter(pk=load.pk).update(state=PoolLoad.State.LOADING, message="")
    try:
        apply_pool(rt, kube, pool, namespace, target)
        sync_marks(rt, kube, pool, namespace)  # what _make_room evicted is unloaded before this one loads
        _set_entry(kube, target, namespace, revision_key(revision.deployment_id, revision.number),
                   _entry(rt, revision), idle=_idle_now(load.pk))
    except Unreachable as exc:
        raise rt.unreachable(exc) from None
    return launch


def _held(pool: Pool, load: PoolLoad) -> list[pool_policy.Held]:
    """The pool's other loading and loaded revisions, each at what its models' process limits add up to."""
    rows = (PoolLoad.objects.filter(pool=pool, state__in=[PoolLoad.State.LOADING, PoolLoad.State.LOADED])
            .exclude(pk=load.pk).select_related("deployment", "revision"))
    return [pool_policy.Held(
        load_id=row.pk, team_id=row.deployment.team_id,
        state=pool_policy.LOADED if row.state == PoolLoad.State.LOADED else pool_policy.LOADING,
        charge=row.memory_bytes, last_used_at=row.last_used_at, loaded_at=row.loaded_at,
        name=f"{row.deployment.name} r{row.revision.number}") for row in rows]


def _over_budget(pool: Pool, load: PoolLoad, revision: Revision) -> str:
    """Why the revision may not go into the pool now ("" when it may). Each revision counts, whether loading or
    loaded, at what its models took when they last loaded in this pool (the agents' figures, ModelMemory under the
    pool's fingerprint) or, never measured there, at its artifacts' size times POOL_UNMEASURED_FACTOR, against the
    team's share and the pool's budget, so that one team cannot fill the pods' memory (the pod is OOM-killed with
    every team's models in it) nor their repository emptyDir. The rule, and which idle revisions are evicted for
    it, is deployments/pool_policy.py's, as in a local pool. An eviction is a conditional update of the victim's
    row (a use recorded meanwhile keeps it, and the policy is asked again without it); its entry is marked
    unloaded by sync_marks (the launch's, or the next periodic pass when a request woke the load)."""
    need = pools.cluster_charge(revision.spec, pool)
    PoolLoad.objects.filter(pk=load.pk).update(memory_bytes=need)
    team_id = revision.deployment.team_id
    budget, rules, now = pools.budget_of(pool), pools.eviction_rules(), timezone.now()
    spared: set[int] = set()
    while True:
        held = _held(pool, load)
        room = pool_policy.make_room(budget, held, team_id, need, now, rules, spared)
        if not room.fits:
            return pool_policy.refusal(budget, held, team_id, need)
        if not room.evict:
            return ""
        for victim in sorted(PoolLoad.objects.filter(pk__in=room.evict).select_related("deployment"),
                             key=lambda v: room.evict.index(v.pk)):
            if PoolLoad.objects.filter(pk=victim.pk, state=PoolLoad.State.LOADED,
                                       last_used_at=victim.last_used_at).update(
                    state=PoolLoad.State.UNLOADED,
                    message="evicted: the pool needed its memory for another model (least recently used first)"):
                pool_events.evicted(victim.deployment, pool.name, (now - victim.last_used_at).total_seconds()
                                    if victim.last_used_at is not None else 0.0)
        spared.update(room.evict)


def sync_marks(rt: KubernetesRuntime, kube: Kube, pool: Pool, namespace: str) -> None:
    """Mark unloaded, in the loads Secret, the entries of the pool's revisions whose rows say unloaded (evicted or
    idle) and whose entries do not say so yet."""
    target = target_for(pool, rt.cfg)
    unloaded = list(PoolLoad.objects.filter(pool=pool, state=PoolLoad.State.UNLOADED).select_related("revision"))
    if not unloaded:
        return
    data = _loads_data(kube, target, namespace)  # read once for all of them: this runs every few seconds
    for load in unloaded:
        key = revision_key(load.deployment_id, load.revision.number)
        if _listed(data, key) == "loaded":
            _set_entry(kube, target, namespace, key, _entry(rt, load.revision), idle=_idle_now(load.pk))


def apply_pool(rt: KubernetesRuntime, kube: Kube, pool: Pool, namespace: str,
               target: pool_manifests.PoolTarget) -> None:
    """Apply the pool's objects; nothing is applied when any object of the same name is not this pool's."""
    objects = pool_manifests.build(target, namespace, rt.cfg)
    what = f"read the objects of pool {pool.name!r} in {namespace}"
    try:
        names = [(obj["apiVersion"], obj["kind"], obj["metadata"]["name"]) for obj in objects]
        names += [("v1", "Secret", pool_manifests.admin_secret_name(target)),
                  ("v1", "Secret", pool_manifests.loads_secret_name(target))]
        existing = check_ownership(kube, names, target, namespace)
        what = f"read or create the namespace {namespace}"
        rt.ensure_namespace(kube, namespace, target.team or pool.name)
        if ("Secret", pool_manifests.admin_secret_name(target)) not in existing:
            what = f"create the admin key Secret of pool {pool.name!r}"
            kube.apply(pool_manifests.admin_secret(target, namespace, secrets.token_urlsafe(32)))
        if ("Secret", pool_manifests.loads_secret_name(target)) not in existing:
            what = f"create the loads Secret of pool {pool.name!r}"
            kube.apply(pool_manifests.loads_secret(target, namespace, {}))
        wanted = {(obj["apiVersion"], obj["kind"]) for obj in objects}
        for obj in objects:
            what = f"apply {obj['kind']} {namespace}/{obj['metadata']['name']}"
            kube.apply(obj)
        what = f"remove objects of pool {pool.name!r} it no longer has"
        for api_version, kind in (("policy/v1", "PodDisruptionBudget"), ("autoscaling/v2", "HorizontalPodAutoscaler")):
            if (api_version, kind) in wanted:
                continue
            for item in kube.list(api_version, kind, namespace, pool_manifests.pool_selector(target)).get("items", []):
                if pool_manifests.is_managed(item, target):
                    kube.delete(api_version, kind, namespace, item["metadata"]["name"])
    except KubeError as exc:
        raise RuntimeUnavailable(explain(exc, what)) from None


def check_ownership(kube: Kube, names: list[tuple[str, str, str]], target: pool_manifests.PoolTarget,
                    namespace: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The existing objects by (kind, name); RuntimeUnavailable naming the first that is not this pool's."""
    existing: dict[tuple[str, str], dict[str, Any]] = {}
    for api_version, kind, name in names:
        found = kube.get(api_version, kind, namespace, name)
        if found is None:
            continue
        if not pool_manifests.is_managed(found, target):
            theirs = found["metadata"].get("labels") or {}
            raise RuntimeUnavailable(
                f"A {kind} named {name} exists in namespace {namespace} and is not pool {target.name!r}'s (managed "
                f"by {theirs.get('app.kubernetes.io/managed-by', 'someone else')}, pool "
                f"{theirs.get(pool_manifests.LABEL_POOL, 'none')}): Modelport never takes over an object it did not "
                "create, so nothing was applied. An operator must delete or rename that object, or the pool.")
        existing[(kind, name)] = found
    return existing


def _entry(rt: KubernetesRuntime, revision: Revision) -> dict[str, Any]:
    """The revision's entry in the loads Secret, with URLs valid from now for KUBERNETES_REPOSITORY_URL_SECONDS."""
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    key = revision_key(revision.deployment_id, revision.number)
    prefix = pool_names.name_prefix(revision.deployment_id, revision.number)
    spec = pool_names.pooled_spec(revision.spec, prefix)
    cfg = rt.cfg
    s3_prefix = rt.repository_key(revision)
    try:
        s3 = s3repo.client(cfg)
        repository = s3repo.read_manifest(s3, cfg.s3_bucket, s3_prefix) or rt.upload(revision, spec)
        files = s3repo.presign(s3, cfg.s3_bucket, s3_prefix, repository, cfg.repository_url_seconds)
    except (Boto3Error, BotoCoreError, ClientError) as exc:
        raise RuntimeUnavailable(f"The model repository of revision {revision.number} cannot be read from S3 "
                                 f"(bucket {cfg.s3_bucket!r}): {exc}") from None
    expires_at = (rt.now() + timedelta(seconds=cfg.repository_url_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    limits = {prefix + name: limit for name, limit in pools.process_limits(revision.spec, _pool_of(revision)).items()}
    return pool_manifests.load_entry(key, pool_names.load_order(revision.spec, prefix), files,
                                     list(repository.directories), expires_at, memory_limits=limits)


def _idle_now(load_id: int) -> Callable[[], bool]:
    """Whether the load's entry is to be marked unloaded, read from its row at the moment the Secret is written."""
    def idle() -> bool:
        return PoolLoad.objects.filter(pk=load_id, state=PoolLoad.State.UNLOADED).exists()
    return idle


def _set_entry(kube: Kube, target: pool_manifests.PoolTarget, namespace: str, key: str,
               entry: dict[str, Any] | None, idle: Callable[[], bool] | None = None) -> None:
    """Add (or with None, remove) one revision's key of the loads Secret: a PUT with the resourceVersion just read,
    so a concurrent change (another deployment's launch) is never lost: it makes this one fail, to be retried.

    `idle` says, after each read of the Secret, whether the entry is marked unloaded: the row's state read after
    the Secret, so that of an idle unload and a request's wake racing, the last write to succeed carries the
    row's last state (the other's write fails on the resourceVersion and is tried again)."""
    import base64
    import json

    name = pool_manifests.loads_secret_name(target)
    field = f"{key}.json"
    try:
        for _ in range(3):
            secret = kube.get("v1", "Secret", namespace, name)
            if secret is None:
                if entry is None:
                    return
                raise RuntimeUnavailable(f"the loads Secret {namespace}/{name} of pool {target.name!r} is missing: "
                                         "the next launch creates it again")
            if not pool_manifests.is_managed(secret, target):
                raise RuntimeUnavailable(f"the Secret {namespace}/{name} is not pool {target.name!r}'s: Modelport "
                                         "never edits an object it did not create")
            data = dict(secret.get("data") or {})
            if entry is None:
                if field not in data:
                    return
                del data[field]
            else:
                written = {**entry, "unloaded": True} if idle is not None and idle() else entry
                data[field] = base64.b64encode(json.dumps(written, sort_keys=True).encode()).decode()
            if sum(len(value) for value in data.values()) > MAX_SECRET_BYTES:
                raise RuntimeUnavailable(
                    f"pool {target.name!r} holds as many revisions as its loads Secret can list (1 MiB of download "
                    "URLs): stop a deployment in it, or choose another pool")
            secret["data"] = data
            try:
                kube.replace(secret)
                return
            except KubeError as exc:
                if exc.status == 409:  # changed since read: read it again
                    continue
                if exc.status == 404 and entry is None:
                    return
                raise
        raise RuntimeUnavailable(f"the loads Secret of pool {target.name!r} kept changing while it was updated: "
                                 "the next tick tries again")
    except KubeError as exc:
        raise RuntimeUnavailable(explain(exc, f"update Secret {namespace}/{name}")) from None


def entries(kube: Kube, target: pool_manifests.PoolTarget, namespace: str) -> dict[str, datetime | None]:
    """The revision keys the pool's loads Secret lists now, with when each entry's URLs expire (None: unreadable)."""
    import base64
    import json

    secret = kube.get("v1", "Secret", namespace, pool_manifests.loads_secret_name(target))
    if secret is None or not pool_manifests.is_managed(secret, target):
        return {}
    found: dict[str, datetime | None] = {}
    for field, value in (secret.get("data") or {}).items():
        try:
            expires = datetime.fromisoformat(str(json.loads(base64.b64decode(value))["expires_at"])
                                             .replace("Z", "+00:00"))
        except (ValueError, TypeError, KeyError):
            expires = None
        found[field.removesuffix(".json")] = expires
    return found


# --- Observing ----------------------------------------------------------------------------------------------------


def entry_sha256(kube: Kube, target: pool_manifests.PoolTarget, namespace: str, key: str) -> str | None:
    """The sha256 of the revision's entry as the agents read it (the bytes the kubelet mounts), None if unlisted."""
    import base64
    import binascii
    import hashlib

    secret = kube.get("v1", "Secret", namespace, pool_manifests.loads_secret_name(target))
    if secret is None or not pool_manifests.is_managed(secret, target):
        return None
    value = (secret.get("data") or {}).get(f"{key}.json")
    try:
        return hashlib.sha256(base64.b64decode(value, validate=True)).hexdigest() if value else None
    except (binascii.Error, ValueError):
        return None


def _load_of(launch: Launch) -> PoolLoad | None:
    try:
        load_id = int(str(launch.ref).removeprefix(REF_PREFIX))
    except ValueError:
        return None
    return PoolLoad.objects.select_related("pool__team", "revision", "deployment").filter(pk=load_id).first()


def pool_pods(rt: KubernetesRuntime, kube: Kube, pool: Pool, namespace: str) -> list[dict[str, Any]]:
    """Every pod of the pool, running or not."""
    target = target_for(pool, rt.cfg)
    return list(kube.list("v1", "Pod", namespace, pool_manifests.pool_selector(target)).get("items", []))


def agent_statuses(rt: KubernetesRuntime, kube: Kube, pool: Pool, namespace: str,
                   pods: list[dict[str, Any]] | None = None) -> list[tuple[str, dict[str, Any] | None]]:
    """(pod, its agent's last status or None) of every running pod of the pool (of `pods`, already listed)."""
    if pods is None:
        pods = pool_pods(rt, kube, pool, namespace)
    found = []
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        if (pod.get("status") or {}).get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
            continue
        name = pod["metadata"]["name"]
        try:
            text = kube.pod_log(namespace, name, pool_manifests.AGENT_CONTAINER, tail_lines=AGENT_LOG_LINES,
                                limit_bytes=AGENT_LOG_BYTES).decode("utf-8", "replace")
        except KubeError:
            text = ""
        found.append((name, pool_agent.parse_status(text)))
    return found


def observe(rt: KubernetesRuntime, launch: Launch) -> Observation:
    load = _load_of(launch)
    if load is None:
        return Observation("failed", "its models are no longer in the pool")
    if load.state == PoolLoad.State.FAILED:
        return Observation("failed", load.message)
    pool = load.pool
    key = revision_key(load.deployment_id, load.revision.number)
    namespace = namespace_for(pool, rt.cfg)
    try:
        kube = rt.kube()
        current = entry_sha256(kube, target_for(pool, rt.cfg), namespace, key)
        statuses = agent_statuses(rt, kube, pool, namespace)
    except Unreachable as exc:
        return Observation("starting", f"the Kubernetes API server is not reachable ({exc})")
    except KubeError as exc:
        return Observation("starting", f"cannot read the pods of pool {pool.name!r}: {exc.message}")
    for pod, status in statuses:
        failed = (status or {}).get("failed", {}).get(key) if status else None
        if failed and status is not None and "sha256" in status and status["sha256"].get(key) != current:
            failed = None  # it refused an earlier entry of this key (removed and added again): not this one
        if failed:
            message = f"pool {pool.name!r} (pod {pod}) refused it: {str(failed).replace(key + '-', '')}"
            PoolLoad.objects.filter(pk=load.pk).update(state=PoolLoad.State.FAILED, message=message[:2000])
            return Observation("failed", message)
    if not statuses:
        return Observation("starting", f"no pod of pool {pool.name!r} is running yet")
    waiting = [pod for pod, status in statuses if status is None or key not in status["loaded"]]
    if waiting:
        return Observation("starting", f"waiting for the agent of {len(waiting)} of {len(statuses)} pod(s) of pool "
                                       f"{pool.name!r} to load it (the kubelet updates the mounted loads Secret "
                                       "within about a minute)")
    remember_memory(load, statuses)
    now = timezone.now()
    PoolLoad.objects.filter(pk=load.pk).update(state=PoolLoad.State.LOADED, message="", loaded_at=now,
                                               last_used_at=now)
    return Observation("ready", f"loaded in pool {pool.name!r} on {len(statuses)} pod(s)")


def check(rt: KubernetesRuntime, launch: Launch) -> Health:
    load = _load_of(launch)
    if load is None:
        return Health(False, "its models are no longer in the pool")
    if load.state == PoolLoad.State.FAILED:
        return Health(False, load.message)
    pool = load.pool
    namespace = namespace_for(pool, rt.cfg)
    target = target_for(pool, rt.cfg)
    try:
        kube = rt.kube()
        ok, message = k8s_status.health(kube.get("apps/v1", "Deployment", namespace, target.object_name))
        if not ok:
            return Health(False, f"pool {pool.name!r}: {message}")
        key = revision_key(load.deployment_id, load.revision.number)
        listed = entries(kube, target, namespace)
        if key not in listed:
            return Health(False, f"its entry is no longer in the loads Secret of pool {pool.name!r}")
        expires_at = listed[key]
        if expires_at is None or expires_at - rt.now() < timedelta(seconds=rt.cfg.repository_url_seconds / 2):
            # Renewed at half-life, as a dedicated revision's access Secret: a pod the autoscaler adds (or one
            # that restarts) fetches the files with URLs that work.
            _set_entry(kube, target, namespace, key, _entry(rt, load.revision), idle=_idle_now(load.pk))
        if load.woken_at is not None:
            settle_woken(rt, kube, load, namespace, agent_statuses(rt, kube, pool, namespace))
    except Unreachable as exc:
        return Health.cannot_tell(f"the Kubernetes API server is not reachable ({exc})")
    except (KubeError, RuntimeUnavailable) as exc:
        return Health.cannot_tell(str(exc))
    return Health(True)


# --- On demand: idle unloads and the wake of a held request -------------------------------------------------------

# How far ahead of the worker's clock an agent's "last used" may be and still count (clock skew between nodes); a
# figure further ahead, or not a positive integer, is ignored: the status line is written next to a team's code.
MAX_CLOCK_SKEW_MS = 60_000


def last_used(statuses: list[tuple[str, dict[str, Any] | None]], key: str, now: datetime) -> datetime | None:
    """The latest inference any running pod's agent saw of the revision (from Triton's statistics), or None."""
    now_ms = int(now.timestamp() * 1000)
    seen = []
    for _pod, status in statuses:
        value = ((status or {}).get("last_used") or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= now_ms + MAX_CLOCK_SKEW_MS:
            seen.append(min(value, now_ms))
    return datetime.fromtimestamp(max(seen) / 1000, tz=now.tzinfo) if seen else None


def _kube_pools() -> list[Pool]:
    return list(Pool.objects.select_related("team").filter(runtime=Pool.Runtime.KUBERNETES, loads__state__in=[
        PoolLoad.State.LOADED, PoolLoad.State.LOADING, PoolLoad.State.UNLOADED]).distinct())


def unload_idle(rt: KubernetesRuntime) -> list[str]:
    """Periodic: in each cluster pool, tell its deployments of a restart of the pool's Triton and of their models
    loaded back (pool_restarts.py), record the revisions' last use from the agents, mark the entries of those
    unused for their idle_unload_seconds unloaded (the agents unload them and remove their files), and load the
    ones a request woke. A line per restart, revision unloaded or loaded."""
    done: list[str] = []
    for pool in _kube_pools():
        try:
            namespace = namespace_for(pool, rt.cfg)
            kube = rt.kube()
            pods = pool_pods(rt, kube, pool, namespace)  # listed once per pass, for both
            statuses = agent_statuses(rt, kube, pool, namespace, pods)
            done += pool_restarts.watch(kube, pool, namespace, pods, statuses)
            done += _unload_idle_in(rt, kube, pool, namespace, statuses)
            sync_marks(rt, kube, pool, namespace)  # evicted for a request's wake
            for load in PoolLoad.objects.filter(pool=pool, state=PoolLoad.State.LOADING, woken_at__isnull=False) \
                    .select_related("pool__team", "revision", "deployment"):
                if settle_woken(rt, kube, load, namespace, statuses):
                    done.append(f"loaded {load.deployment} r{load.revision.number} in pool {pool.name!r} again")
        except (Unreachable, KubeError, RuntimeUnavailable) as exc:
            done.append(f"pool {pool.name!r}: cannot look now ({exc})")
    return done


def _unload_idle_in(rt: KubernetesRuntime, kube: Kube, pool: Pool, namespace: str,
                    statuses: list[tuple[str, dict[str, Any] | None]]) -> list[str]:
    now = timezone.now()
    target = target_for(pool, rt.cfg)
    done = []
    for load in PoolLoad.objects.filter(pool=pool, state=PoolLoad.State.LOADED).select_related("revision",
                                                                                                "deployment"):
        key = revision_key(load.deployment_id, load.revision.number)
        load.pool = pool
        remember_memory(load, statuses)  # what it grew to under use
        seen = last_used(statuses, key, now)
        if seen is not None and (load.last_used_at is None or seen > load.last_used_at):
            PoolLoad.objects.filter(pk=load.pk).update(last_used_at=seen)
            load.last_used_at = seen
        last = load.last_used_at or load.loaded_at or now
        if load.idle_unload_seconds <= 0 or now - last < timedelta(seconds=load.idle_unload_seconds):
            continue
        # Claimed with a conditional update: a wake or a use recorded meanwhile keeps it loaded.
        if not PoolLoad.objects.filter(pk=load.pk, state=PoolLoad.State.LOADED,
                                       last_used_at=load.last_used_at).update(
                state=PoolLoad.State.UNLOADED, message=f"unloaded after {load.idle_unload_seconds} s unused; the "
                                                       "next request loads it again"):
            continue
        pool_events.idle_unloaded(load.deployment, pool.name, (now - last).total_seconds(),
                                  load.idle_unload_seconds, load.idle_unload_seconds)
        _set_entry(kube, target, namespace, key, _entry(rt, load.revision), idle=_idle_now(load.pk))
        done.append(f"unloaded {load.deployment} r{load.revision.number} from pool {pool.name!r}")
    return done


def remember_memory(load: PoolLoad, statuses: list[tuple[str, dict[str, Any] | None]]) -> None:
    """Keep what the pods' agents measured of the revision's models (ModelMemory under the pool's fingerprint, so
    that "fits N more", the budget and each process's limit at the next load use it) and count it on the row: the
    most seen, at each load and at each periodic pass (a model's peak under use, its own processes', grows after its
    load). The status line is written next to a team's code: only figures of this pool's running pods that list the
    revision loaded, for its own models, each a positive integer within the pool's budget, are taken, and of several
    pods the largest."""
    key = revision_key(load.deployment_id, load.revision.number)
    spec = load.revision.spec
    models = {entry.name: entry for entry in spec.models}
    seen: dict[str, int] = {}
    for _pod, status in statuses:
        figures = ((status or {}).get("memory") or {}).get(key)
        if status is None or key not in status["loaded"] or not isinstance(figures, dict):
            continue
        for model, value in figures.items():
            if (model in models and isinstance(value, int) and not isinstance(value, bool)
                    and 0 < value <= load.pool.memory_budget_bytes):
                seen[model] = max(seen.get(model, 0), value)
    fingerprint = pools.fingerprint(load.pool)
    ids = [models[model].version_id for model in seen if models[model].version_id is not None]
    known = dict(ModelMemory.objects.filter(version_id__in=ids, fingerprint=fingerprint)
                 .values_list("version_id", "memory_bytes"))
    changed = False
    for model, value in seen.items():
        version_id = models[model].version_id
        if version_id is not None and value > known.get(version_id, 0):
            ModelMemory.objects.update_or_create(version_id=version_id, fingerprint=fingerprint,
                                                 defaults={"memory_bytes": value, "measured_at": timezone.now()})
            changed = True
    if changed or (seen and not load.memory_bytes):
        PoolLoad.objects.filter(pk=load.pk).update(memory_bytes=pools.cluster_charge(spec, load.pool))


def wake(load_id: int) -> str:
    """A request arrived for an idle-unloaded revision: ask for its load ("" when asked, else why not). Only the
    row changes here (the gateway holds no Kubernetes credentials); the worker's periodic pass and health check
    write the entry and watch the agents load it."""
    load = PoolLoad.objects.select_related("pool__team", "revision", "deployment").filter(pk=load_id).first()
    if load is None:
        return "its models are no longer in the pool"
    if load.state != PoolLoad.State.UNLOADED:
        return load.message if load.state == PoolLoad.State.FAILED else ""
    refusal = _over_budget(load.pool, load, load.revision)
    if refusal:
        return refusal
    PoolLoad.objects.filter(pk=load.pk, state=PoolLoad.State.UNLOADED).update(
        state=PoolLoad.State.LOADING, woken_at=timezone.now(), message="loading again: a request is waiting")
    return ""


def settle_woken(rt: KubernetesRuntime, kube: Kube, load: PoolLoad, namespace: str,
                 statuses: list[tuple[str, dict[str, Any] | None]]) -> bool:
    """Write a woken load's entry without the unloaded mark and, once every running pod's agent has loaded it,
    mark it loaded with its cold start (from the wake); whether it is loaded now."""
    pool = load.pool
    key = revision_key(load.deployment_id, load.revision.number)
    target = target_for(pool, rt.cfg)
    if _listed(_loads_data(kube, target, namespace), key) != "loaded":
        # Written once per wake: rewritten at every pass (new URLs) the entry's sha256 would never match a refusal.
        _set_entry(kube, target, namespace, key, _entry(rt, load.revision), idle=_idle_now(load.pk))
    current = entry_sha256(kube, target, namespace, key)
    for pod, status in statuses:
        failed = ((status or {}).get("failed") or {}).get(key)
        if failed and (status or {}).get("sha256", {}).get(key) == current:
            message = f"pool {pool.name!r} (pod {pod}) refused it: {str(failed).replace(key + '-', '')}"
            PoolLoad.objects.filter(pk=load.pk).update(state=PoolLoad.State.FAILED, message=message[:2000],
                                                       woken_at=None)
            return False
    if not statuses or any(status is None or key not in status["loaded"] for _pod, status in statuses):
        return False
    remember_memory(load, statuses)
    now = timezone.now()
    seconds = max(0.0, (now - (load.woken_at or now)).total_seconds())
    if not PoolLoad.objects.filter(pk=load.pk, state=PoolLoad.State.LOADING).update(
            state=PoolLoad.State.LOADED, message="", loaded_at=now, last_used_at=now, woken_at=None,
            cold_start_seconds=seconds):
        return False
    pool_events.loaded_on_demand(load.deployment, pool.name, seconds)
    return True


def _loads_data(kube: Kube, target: pool_manifests.PoolTarget, namespace: str) -> dict[str, str]:
    """The loads Secret's data (base64 values by field), {} when it is missing or not the pool's."""
    secret = kube.get("v1", "Secret", namespace, pool_manifests.loads_secret_name(target))
    if secret is None or not pool_manifests.is_managed(secret, target):
        return {}
    return dict(secret.get("data") or {})


def _listed(data: dict[str, str], key: str) -> str:
    """How the loads Secret's data lists the revision: "missing", "idle" (marked unloaded, or unreadable) or
    "loaded"."""
    import base64
    import binascii

    value = data.get(f"{key}.json")
    if not value:
        return "missing"
    try:
        return "idle" if pool_agent.is_idle(base64.b64decode(value, validate=True)) else "loaded"
    except (binascii.Error, ValueError):
        return "idle"


def wait_loaded(load_id: int, seconds: float, poll: float = 0.25) -> tuple[bool, str]:
    """Wait (in the gateway's load executor) up to `seconds` for the worker to see a woken load loaded: (loaded,
    why not when it failed)."""
    import time

    deadline = time.monotonic() + seconds
    while True:
        row = PoolLoad.objects.filter(pk=load_id).values("state", "message").first()
        if row is None:
            return False, "its models are no longer in the pool"
        if row["state"] == PoolLoad.State.LOADED:
            return True, ""
        if row["state"] == PoolLoad.State.FAILED:
            return False, str(row["message"])
        if time.monotonic() >= deadline:
            return False, ""
        time.sleep(poll)


# --- A shared deployment's log -------------------------------------------------------------------------------------

MAX_LOG_PODS = 3


def _only_mine(line: str, deployment_id: int) -> bool:
    """Whether the line names this deployment's revisions or models and no other deployment's: a line of Triton's
    or the agent's about another team's model may quote what that team chose (an error, a tensor name), and so
    name this deployment's models to put words in its log."""
    return pool_names.deployments_named(line) == {deployment_id}


def shared_log_lines(agent_text: str, triton_text: str, deployment_id: int) -> list[str]:
    """Of a pool pod's two logs (already bounded and escaped by logtail), the agent's lines about this deployment's
    revisions (not its status lines, which list every revision) and the lines Triton itself wrote naming its models
    (not what a model's process printed), each naming no other deployment."""
    agent_line = re.compile(rf"^modelport-pool-agent: d{deployment_id}-r[0-9]{{1,9}}: ")
    found = [line for line in agent_text.split("\n") if agent_line.match(line) and _only_mine(line, deployment_id)]
    found += [line for line in triton_text.split("\n")
              if logtail.TRITON_LINE_RE.match(line) and _only_mine(line, deployment_id)]
    return found


def logs(rt: KubernetesRuntime, deployment: Deployment, lines: int, revision: Revision) -> str:
    """The lines of the pool's pods that concern this revision of the deployment (shared_log_lines), never another
    team's: the agent's, then Triton's, per pod, at most `lines` of each pod and LOG_TAIL_MAX_BYTES read in all."""
    spec = revision.spec
    if not spec.placement.shared:
        return ""
    # Its models' names (d1-r2-digits) and the agent's lines about it (modelport-pool-agent: d1-r2: ...).
    this_revision = re.compile(rf"(?<![A-Za-z0-9_-])d{deployment.pk}-r{revision.number}[-:]")
    pool = Pool.objects.select_related("team").filter(name=spec.placement.pool,
                                                      runtime=Pool.Runtime.KUBERNETES).first()
    if pool is None:
        return ""
    namespace = namespace_for(pool, rt.cfg)
    kube = rt.kube()
    pods = kube.list("v1", "Pod", namespace, pool_manifests.pool_selector(target_for(pool, rt.cfg))).get("items", [])
    pods.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]), reverse=True)
    pods = pods[:MAX_LOG_PODS]
    budget = settings.LOG_TAIL_MAX_BYTES // max(1, 2 * len(pods))
    parts = []
    for pod in pods:
        name = pod["metadata"]["name"]
        texts = []
        for container in (pool_manifests.AGENT_CONTAINER, manifests.CONTAINER):
            try:
                # Many more lines than asked: most are other deployments'. Bounded in bytes all the same.
                data = kube.pod_log(namespace, name, container, tail_lines=max(lines * 20, 1000), limit_bytes=budget)
            except KubeError:
                data = b""
            texts.append(logtail.tail_text(data, max(lines * 20, 1000), max_bytes=budget,
                                           line_max=settings.LOG_LINE_MAX_BYTES))
        mine = [line for line in shared_log_lines(texts[0], texts[1], deployment.pk)
                if this_revision.search(line)][-lines:]
        if mine:
            parts.append(f"==> pod/{name} <==\n" + "\n".join(mine) + "\n" if len(pods) > 1 else
                         "\n".join(mine) + "\n")
    return "\n".join(parts)


# --- Removing -----------------------------------------------------------------------------------------------------


def _remove(rt: KubernetesRuntime, load: PoolLoad) -> None:
    """Take the load's entry out of its pool's loads Secret (the agents unload it), then forget the row."""
    pool = load.pool
    if not rt.cfg.cluster_problem():
        try:
            # Unchecked, as a dedicated deployment's stop: only the pool's own Secret, and in it only this key.
            namespace = rt.cfg.team_namespace(pool.team.name) if pool.team is not None else rt.cfg.pool_namespace
            _set_entry(rt.kube(), target_for(pool, rt.cfg), namespace,
                       revision_key(load.deployment_id, load.revision.number), None)
        except Unreachable as exc:
            raise rt.unreachable(exc) from None
    PoolLoad.objects.filter(pk=load.pk).delete()


def _serving(load: PoolLoad, launch: Launch) -> bool:
    serving = Launch.from_json(Deployment.objects.filter(pk=load.deployment_id)
                               .values_list("serving_launch", flat=True).first())
    return serving is not None and serving.ref == launch.ref


def abandon(rt: KubernetesRuntime, launch: Launch) -> None:
    load = _load_of(launch)
    if load is not None and not _serving(load, launch):
        _remove(rt, load)


def _kubernetes_loads(deployment: Deployment) -> list[PoolLoad]:
    return list(PoolLoad.objects.filter(deployment=deployment, pool__runtime=Pool.Runtime.KUBERNETES)
                .select_related("pool__team", "revision"))


def retire(rt: KubernetesRuntime, deployment: Deployment, keep: Sequence[Launch]) -> list[str]:
    kept = {launch.ref for launch in keep if is_pool_launch(launch)}
    done = []
    for load in _kubernetes_loads(deployment):
        if f"{REF_PREFIX}{load.pk}" in kept:
            continue
        _remove(rt, load)
        done.append(f"Unloaded revision {load.revision.number} from pool {load.pool.name!r}.")
    return done


def stop(rt: KubernetesRuntime, deployment: Deployment) -> None:
    for load in _kubernetes_loads(deployment):
        _remove(rt, load)


# --- The pool launcher (registry.py puts it behind one Runtime with KubernetesRuntime: runtimes/placed.py) --------


class KubernetesPoolRuntime:
    """The cluster's revisions placed in a pool, through `cluster`'s connection, S3 and clock."""

    def __init__(self, cluster: KubernetesRuntime | None = None) -> None:
        self.cluster = cluster or KubernetesRuntime()

    @property
    def ready_timeout_seconds(self) -> float:
        return self.cluster.ready_timeout_seconds

    @property
    def poll_seconds(self) -> float:
        return self.cluster.poll_seconds

    def check_plan(self, spec: RevisionSpec) -> dict[str, list[str]]:
        return self.cluster.check_plan(spec)

    def prepare(self, revision: Revision) -> Preparation:
        problems = self.cluster.cfg.problems()
        if problems:
            raise RuntimeUnavailable(" ".join(problems))
        prepare(self.cluster, revision)
        return PREPARED

    def launch(self, revision: Revision) -> Launch:
        return launch(self.cluster, revision)

    def observe(self, launch: Launch) -> Observation:
        return observe(self.cluster, launch)

    def abandon(self, launch: Launch) -> None:
        abandon(self.cluster, launch)

    def check(self, deployment: Deployment, launch: Launch) -> Health:
        problem = self.cluster.cfg.cluster_problem()
        if problem:
            return Health(False, problem)
        return check(self.cluster, launch)

    def retire(self, deployment: Deployment, keep: Sequence[Launch]) -> list[str]:
        # What a shared revision left in S3 goes with the dedicated ones' (KubernetesRuntime.retire).
        return [] if self.cluster.cfg.cluster_problem() else retire(self.cluster, deployment, keep)

    def stop(self, deployment: Deployment) -> None:
        if not self.cluster.cfg.cluster_problem():  # no cluster: nothing of it can be running
            stop(self.cluster, deployment)

    def teardown(self, deployment: Deployment) -> None:
        self.stop(deployment)  # its entries in pools; a pool's own objects are never removed here

    def logs(self, deployment: Deployment, lines: int, revision: Revision | None = None) -> str:
        problem = self.cluster.cfg.cluster_problem()
        if problem:
            return f"No logs: {problem}\n"
        revision = revision or deployment.serving_revision or deployment.revision
        if revision is None:
            return ""
        try:
            return logs(self.cluster, deployment, lines, revision)
        except Unreachable as exc:
            return f"No logs: {self.cluster.unreachable(exc)}\n"
        except (KubeError, RuntimeUnavailable) as exc:
            return f"No logs: {exc}\n"

    def wake(self, load_id: int, wait_seconds: float) -> Wake:
        """Ask for the load and wait for the worker to see it loaded: only the row changes here (the gateway holds
        no Kubernetes credentials). It waits a second longer than `wait_seconds`, the held request's, so that the
        hold's own wait normally answers first (503, Retry-After), the load going on."""
        refusal = wake(load_id)
        if refusal:
            return Wake(failure=refusal)
        loaded, failure = wait_loaded(load_id, wait_seconds + 1)
        return Wake(failure=failure, loading=not loaded and not failure)

    def unload_idle(self) -> list[str]:
        if self.cluster.cfg.cluster_problem():
            return []
        # Idle entries marked unloaded, and revisions a held request woke loaded again.
        return unload_idle(self.cluster)

    def sweep_orphans(self) -> list[str]:
        return []

    def refresh_access(self) -> int:
        return 0  # a pool entry's URLs are renewed at half-life by its revision's health check (check)
