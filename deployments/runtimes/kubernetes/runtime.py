"""The Kubernetes runtime: Triton pods on a cluster, one Kubernetes Deployment per Modelport deployment.

A revision's model repository is rendered for the official Triton image and uploaded to S3 under a prefix of its
own, with a manifest of what was uploaded; its manifests (deployments.runtimes.kubernetes.manifests) are applied with
server-side apply in the team's namespace, and the Deployment's rolling update (maxUnavailable 0) replaces the
previous revision's pods once the new ones are ready. The gateway routes to the Service's cluster DNS name, which
stays the same across revisions.

Triton's pods hold no S3 key: each revision gets an access Secret with presigned GET URLs for its own files,
written at every launch and renewed at half-life by a periodic task (`refresh_repository_access`), so that a pod
that starts, or restarts, at any time finds URLs that work. Modelport never applies over an object it did not
create: every object is checked for its labels before anything is applied.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from accounts.models import Team
from deployments import ceilings, logtail
from deployments.models import Deployment, Pool, Revision
from deployments.render import RenderError, render_repository
from deployments.revision_spec import RevisionSpec
from deployments.runtimes.artifacts import artifact_path
from deployments.runtimes.base import (
    PREPARED,
    Health,
    Launch,
    Observation,
    Preparation,
    RuntimeUnavailable,
    TemporaryServer,
    Wake,
)
from deployments.runtimes.kubernetes import manifests, s3repo
from deployments.runtimes.kubernetes import status as k8s_status
from deployments.runtimes.kubernetes.config import KubernetesConfig, NamespaceRefused
from deployments.runtimes.kubernetes.kube import CUSTOM_KINDS, ConfigError, Kube, KubeError, Unreachable, explain
from deployments.spec import validate_repository
from models_registry.validation import archive_limits

log = logging.getLogger(__name__)

# How often the reconciler looks at a rollout in progress (a list of its pods per look).
POLL_SECONDS = 5.0
LOG_LINES = 10  # Triton's last log lines in a failure's detail
MAX_LOG_PODS = 5
# Kinds besides the Deployment that a revision may or may not have; objects no longer wanted are removed.
SECONDARY_KINDS = (
    ("v1", "Service"),
    ("policy/v1", "PodDisruptionBudget"),
    # Before the HPA: KEDA makes an HPA of its own for a ScaledObject, which goes with it.
    (manifests.KEDA_API_VERSION, manifests.KEDA_KIND),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
)
# A Secret holds at most 1 MiB (base64 included); leave room for its metadata.
MAX_SECRET_BYTES = 900 * 1024
# Everything a deployment may own in its namespace (the access Secrets of its revisions included).
MANAGED_KINDS = (("apps/v1", "Deployment"), ("v1", "Secret"), *SECONDARY_KINDS)


def config() -> KubernetesConfig:
    return KubernetesConfig.from_settings(settings)


def _keda_made(obj: dict[str, Any]) -> bool:
    """KEDA's own HPA for a ScaledObject (keda-hpa-<name>): it copies the ScaledObject's labels, so Modelport's
    selectors find it, but it is KEDA's to change, and it goes with its ScaledObject."""
    return any(ref.get("kind") == manifests.KEDA_KIND for ref in obj["metadata"].get("ownerReferences") or [])


def managed_items(kube: Kube, api_version: str, kind: str, namespace: str, selector: str,
                  cfg: KubernetesConfig) -> list[dict[str, Any]]:
    """The objects of `kind` a selector finds that Modelport may delete. A custom kind whose CRD is absent (404) has
    none; one the Role does not grant (403, a Role from before KEDA support) is skipped unless the cluster
    autoscales with it, where the refusal stands (it must be granted)."""
    try:
        items = kube.list(api_version, kind, namespace, selector).get("items", [])
    except KubeError as exc:
        if (api_version, kind) not in CUSTOM_KINDS:
            raise
        if exc.status == 404:
            return []
        if exc.status == 403 and not (kind == manifests.KEDA_KIND and cfg.autoscaling == "keda"):
            log.warning("cannot list %s in %s (%s): grant it to remove those a previous KUBERNETES_AUTOSCALING left",
                        kind, namespace, exc.message)
            return []
        raise
    return [item for item in items if not _keda_made(item)]


def target_for(revision: Revision, cfg: KubernetesConfig, instance: str | None = None) -> manifests.Target:
    """The objects of `revision`, named `instance` (default: the deployment's name; its canary's:
    manifests.canary_name)."""
    deployment = revision.deployment
    key = s3repo.revision_prefix(cfg, deployment.team.name, deployment.name, deployment.pk, revision.number)
    name = instance or deployment.name
    return manifests.Target(team=deployment.team.name, name=name, revision=revision.number,
                            spec=revision.spec, repository_key=key,
                            deployment=deployment.name if name != deployment.name else "")


def team_ceilings(team: Team) -> manifests.TeamCeilings:
    """The team's ceilings on Kubernetes (deployments.ceilings) as the namespace's quota objects say them."""
    found = ceilings.for_team(team, Deployment.Runtime.KUBERNETES)

    def text(limit: ceilings.Limit) -> str:
        return f"{limit.value.normalize():f}" if limit.value is not None else ""

    def count(limit: ceilings.Limit) -> int:
        return int(limit.value) if limit.value is not None else 0

    return manifests.TeamCeilings(max_memory=text(found.memory), max_cpu=text(found.cpu),
                                  total_memory=text(found.total_memory), total_cpu=text(found.total_cpu),
                                  total_gpus=count(found.total_gpus), total_pods=count(found.total_replicas))


def _instance_of(launch: Launch | None) -> str | None:
    return str(launch.ref).split("/", 1)[1] if launch is not None and "/" in str(launch.ref) else None


def serving_instance(deployment: Deployment) -> str:
    """The name of the objects that serve the deployment: its own, or its canary's once one was promoted."""
    return _instance_of(deployment.serving_launch) or deployment.name


def instance_for(revision: Revision) -> str:
    """Where a revision's pods go: a rollout updates the serving Deployment in place (Kubernetes' rolling update);
    a canary gets the other name, a Deployment and Service of its own beside the serving ones."""
    deployment = Deployment.objects.get(pk=revision.deployment_id)
    serving = serving_instance(deployment)
    if revision.pk != deployment.canary_revision_id:
        return serving
    return manifests.canary_name(deployment.name) if serving == deployment.name else deployment.name


def instances(deployment: Deployment) -> tuple[str, str]:
    return deployment.name, manifests.canary_name(deployment.name)


def export_manifests(deployment: Deployment) -> str:
    """The YAML of the deployment's current revision, for GitOps (without the access Secret, which holds
    presigned URLs). Raises ManifestError."""
    cfg = config()
    revision = deployment.revision
    assert revision is not None
    try:
        namespace = cfg.namespace_for(deployment.team.name)
    except NamespaceRefused as exc:
        raise manifests.ManifestError({"team": [str(exc)]}) from None
    target = target_for(revision, cfg)
    objects = manifests.build(target, namespace, cfg)
    if cfg.create_namespaces:
        objects.insert(0, manifests.namespace_object(namespace))
    header = [
        f"Modelport deployment {deployment.team.name}/{deployment.name}, revision {revision.number}.",
        "Apply with: kubectl apply --server-side --field-manager=modelport -f -",
        f"The model repository lives at {cfg.repository_url(target.repository_key)};",
        "Modelport's worker uploads it there when it rolls the revision out. The pods hold no S3 credentials: their",
        f"init container fetches the files through presigned URLs from the Secret "
        f"{manifests.access_secret_name(target.name, target.revision)},",
        "which the worker writes and renews (not exported: the URLs grant read access to the repository).",
    ]
    header += [f"Not configured here: {problem}" for problem in cfg.problems()]
    return manifests.to_yaml(objects, header)


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_iso(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


class KubernetesRuntime:
    """Dedicated revisions on a cluster, and the cluster's connection and repositories, which the pool launcher
    (pool_runtime.KubernetesPoolRuntime; runtimes/placed.py) uses too."""

    poll_seconds = POLL_SECONDS

    def __init__(self, cfg: KubernetesConfig | None = None, now: Callable[[], datetime] = timezone.now) -> None:
        self.cfg = cfg or config()
        self.now = now  # the clock URL expiry is measured with (tests move it)
        self._kube: Kube | None = None

    @property
    def ready_timeout_seconds(self) -> float:
        return float(self.cfg.ready_timeout_seconds)

    # --- Connection -------------------------------------------------------------------------------------------

    def kube(self) -> Kube:
        """The API client, or RuntimeUnavailable saying which setting is missing."""
        problem = self.cfg.cluster_problem()
        if problem:
            raise RuntimeUnavailable(problem)
        if self._kube is None:
            try:
                self._kube = Kube.connect(self.cfg)
            except ConfigError as exc:
                raise RuntimeUnavailable(f"{exc}. Set KUBECONFIG to a working kubeconfig file.") from None
        return self._kube

    def unreachable(self, exc: Unreachable) -> RuntimeUnavailable:
        return RuntimeUnavailable(
            f"The Kubernetes API server is not reachable ({exc}): check that the cluster is up and that KUBECONFIG "
            "(or the in-cluster service account) points at it.")

    def _namespace(self, deployment: Deployment) -> str:
        try:
            return self.cfg.namespace_for(deployment.team.name)
        except NamespaceRefused as exc:
            raise RuntimeUnavailable(str(exc)) from None

    # --- Runtime protocol -------------------------------------------------------------------------------------

    def check_plan(self, spec: RevisionSpec) -> dict[str, list[str]]:
        """Triton's rules for the official image; what the cluster's configuration refuses is said at rollout, but
        for scale to zero, which only KEDA gives: said when planned, a 400 rather than a rollout that fails."""
        errors = validate_repository(spec.repository(lambda entry: Path("artifact")), "kubernetes")
        refusal = manifests.scale_to_zero_refusal(spec, self.cfg)
        if refusal:
            errors.setdefault("autoscaling.min_replicas", []).append(refusal)
        return errors

    def prepare(self, revision: Revision) -> Preparation:
        problems = self.cfg.problems()
        if problems:
            raise RuntimeUnavailable(" ".join(problems))
        target = target_for(revision, self.cfg)
        errors = manifests.check(target, self.cfg)
        if errors:
            raise RenderError(errors)
        bucket, prefix = self.cfg.s3_bucket, target.repository_key
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            s3 = s3repo.client(self.cfg)
            if not s3repo.is_uploaded(s3, bucket, prefix):
                self._render_and_upload(revision, s3, bucket, prefix)
        except (Boto3Error, BotoCoreError, ClientError) as exc:
            raise RuntimeUnavailable(
                f"The model repository cannot be uploaded to S3 (bucket {bucket!r}"
                f"{', endpoint ' + self.cfg.s3_endpoint_url if self.cfg.s3_endpoint_url else ''}): {exc}. "
                "Check KUBERNETES_S3_BUCKET, S3_ENDPOINT_URL and the S3 credentials.") from None
        Revision.objects.filter(pk=revision.pk).update(repository=self.cfg.repository_url(prefix))
        return PREPARED

    def repository_key(self, revision: Revision) -> str:
        """The S3 prefix of the revision's repository (a shared revision's too: its models renamed for the pool)."""
        deployment = revision.deployment
        return s3repo.revision_prefix(self.cfg, deployment.team.name, deployment.name, deployment.pk, revision.number)

    def upload(self, revision: Revision, spec: RevisionSpec) -> s3repo.RepositoryManifest:
        """Render `spec` (the revision's, or its pooled copy) and upload it unless it is there; its manifest."""
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, prefix = self.cfg.s3_bucket, self.repository_key(revision)
        try:
            s3 = s3repo.client(self.cfg)
            return (s3repo.read_manifest(s3, bucket, prefix)
                    or self._render_and_upload(revision, s3, bucket, prefix, spec))
        except (Boto3Error, BotoCoreError, ClientError) as exc:
            raise RuntimeUnavailable(
                f"The model repository cannot be uploaded to S3 (bucket {bucket!r}): {exc}. Check "
                "KUBERNETES_S3_BUCKET, S3_ENDPOINT_URL and the S3 credentials.") from None

    def _render_and_upload(self, revision: Revision, s3: Any, bucket: str, prefix: str,
                           spec_to_render: RevisionSpec | None = None) -> s3repo.RepositoryManifest:
        spec = (spec_to_render or revision.spec).repository(lambda entry: artifact_path(entry.sha256))
        scratch = Path(settings.VAR_DIR) / "tmp"
        scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="k8s-repository-", dir=scratch) as tmp:
            out = Path(tmp) / "repository"
            # A pool's Triton (team or open) is shared by several deployments: no constant folding at load, and each
            # model in processes of its own, confined to its memory (pool_stub.py), through a generated python model.
            shared = (spec_to_render or revision.spec).placement.shared
            render_repository(spec, "kubernetes", out, tnn_backend_name=self.cfg.tnn_backend_name,
                              archive_limits=archive_limits(), fold_constants=not shared, python_models=shared)
            return s3repo.upload_repository(s3, bucket, prefix, out)

    def access_secret(self, revision: Revision, namespace: str, owner_uid: str | None = None,
                      target: manifests.Target | None = None) -> dict[str, Any]:
        """The revision's access Secret with URLs valid from now for KUBERNETES_REPOSITORY_URL_SECONDS. A
        repository uploaded without a manifest (by an older Modelport, or interrupted) is uploaded again."""
        problem = self.cfg.s3_problem()
        if problem:
            raise RuntimeUnavailable(problem)
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        target = target or target_for(revision, self.cfg)
        bucket, prefix, seconds = self.cfg.s3_bucket, target.repository_key, self.cfg.repository_url_seconds
        try:
            s3 = s3repo.client(self.cfg)
            repository = (s3repo.read_manifest(s3, bucket, prefix)
                          or self._render_and_upload(revision, s3, bucket, prefix))
            expires_at = _iso(self.now() + timedelta(seconds=seconds))
            files = s3repo.presign(s3, bucket, prefix, repository, seconds)
        except (Boto3Error, BotoCoreError, ClientError) as exc:
            raise RuntimeUnavailable(
                f"The model repository of revision {revision.number} cannot be read from S3 (bucket {bucket!r}): "
                f"{exc}. Check KUBERNETES_S3_BUCKET, S3_ENDPOINT_URL and the S3 credentials.") from None
        secret = manifests.access_secret(target, namespace, files, repository.directories, expires_at,
                                         owner_uid=owner_uid)
        size = sum(len(value) for value in secret["data"].values())
        if size > MAX_SECRET_BYTES:
            raise RuntimeUnavailable(
                f"The model repository of revision {revision.number} has {len(files)} files: their download URLs "
                f"({size // 1024} KiB) do not fit in one Kubernetes Secret (at most 1 MiB). Serve fewer or larger "
                "files (an archive a python model unpacks, for instance).")
        return secret

    def launch(self, revision: Revision) -> Launch:
        kube = self.kube()
        deployment = revision.deployment
        namespace = self._namespace(deployment)
        target = target_for(revision, self.cfg, instance_for(revision))
        try:
            applied = self._apply(kube, revision, namespace, target)
        except Unreachable as exc:
            raise self.unreachable(exc) from None
        replicas = applied["spec"].get("replicas", target.replicas)
        return Launch(
            revision_id=revision.pk,
            url=manifests.service_url(target.name, namespace, self.cfg),
            grpc_target=manifests.service_grpc_target(target.name, namespace, self.cfg),
            description=f"Deployment {namespace}/{target.name}, {replicas} replica{'s' if replicas != 1 else ''}",
            ref=f"{namespace}/{target.name}",
        )

    def _apply(self, kube: Kube, revision: Revision, namespace: str,
               target: manifests.Target | None = None, rollout: bool = True) -> dict[str, Any]:
        """Apply every object of the revision; returns the applied Deployment. Nothing is applied when any object
        of the same name exists that Modelport did not make for this deployment.

        A `rollout` of a deployment that scales to zero starts at least one pod and pauses KEDA at the Deployment's
        replicas, so that the new revision is verified on a running pod; observe() lifts the pause once it is
        ready. Going back to the serving revision (abandon) is no rollout: KEDA keeps scaling."""
        target = target or target_for(revision, self.cfg)
        what = f"apply Deployment {namespace}/{target.name}"
        try:
            objects = manifests.build(target, namespace, self.cfg)
        except manifests.ManifestError as exc:
            raise RuntimeUnavailable(str(exc)) from None
        access_name = manifests.access_secret_name(target.name, target.revision)
        try:
            if target.autoscaling and self.cfg.autoscaling == "keda":
                what = f"list the KEDA ScaledObjects of {namespace}"
                self._require_keda(kube, namespace)
            what = f"read the objects of {namespace}/{target.name}"
            existing = self._check_ownership(
                kube, [("apps/v1", "Deployment", target.name), ("v1", "Secret", access_name),
                       *((obj["apiVersion"], obj["kind"], obj["metadata"]["name"]) for obj in objects[1:])],
                target, namespace)
            what = f"read or create the namespace {namespace}"
            self.ensure_namespace(kube, namespace, target.team)
            what = f"apply the ResourceQuota and LimitRange of the namespace {namespace}"
            for obj in manifests.ceiling_objects(namespace, target.team, team_ceilings(revision.deployment.team)):
                kube.apply(obj)
            uid = existing.get("Deployment", {}).get("metadata", {}).get("uid")
            # The access Secret goes with the Deployment (Kubernetes' garbage collector).
            access = self.access_secret(revision, namespace, owner_uid=uid, target=target)
            what = f"apply Secret {namespace}/{access['metadata']['name']}"
            kube.apply(access)  # before the Deployment: its pods mount it
            what = f"apply Deployment {namespace}/{target.name}"
            applied = kube.apply(objects[0])
            autoscaling = target.autoscaling
            paused: int | None = None
            lowest = autoscaling.min_replicas if autoscaling else 0
            if autoscaling and autoscaling.scales_to_zero and rollout:
                lowest = 1  # a revision is verified on a running pod, then KEDA may take it to zero again
            if autoscaling and int(applied["spec"].get("replicas") or 0) < lowest:
                # Stopped (scaled to zero: the HPA does not scale up from zero by itself), or autoscaling was just
                # switched on and the replica count Modelport no longer applies fell back to its default.
                kube.scale(namespace, target.name, lowest)
                applied["spec"]["replicas"] = lowest
            if autoscaling and autoscaling.scales_to_zero and rollout:
                paused = int(applied["spec"].get("replicas") or 1)
            uid = applied["metadata"]["uid"]
            if not access["metadata"].get("ownerReferences"):
                what = f"apply Secret {namespace}/{access['metadata']['name']}"
                access["metadata"]["ownerReferences"] = [manifests.owner_reference(target.name, uid)]
                kube.apply(access)
            owned = manifests.build(target, namespace, self.cfg, owner_uid=uid, paused_replicas=paused)
            # Removed before the others are applied: KEDA refuses a ScaledObject for a Deployment that an HPA
            # already scales (KUBERNETES_AUTOSCALING switched from an HPA to keda).
            what = f"remove objects of {namespace}/{target.name} the revision no longer has"
            wanted = {(obj["apiVersion"], obj["kind"]) for obj in owned}
            selector = manifests.instance_selector(target.team, target.deployment_name, target.name)
            for api_version, kind in SECONDARY_KINDS:
                if (api_version, kind) in wanted:
                    continue
                for item in managed_items(kube, api_version, kind, namespace, selector, self.cfg):
                    kube.delete(api_version, kind, namespace, item["metadata"]["name"])
            for obj in owned[1:]:
                what = f"apply {obj['kind']} {namespace}/{target.name}"
                kube.apply(obj)
        except KubeError as exc:
            raise RuntimeUnavailable(explain(exc, what)) from None
        return applied

    def _scale_to_zero(self, kube: Kube, namespace: str, deployment: Deployment, instance: str) -> None:
        """Stop one instance: its ScaledObject goes first, since KEDA scales a Deployment below minReplicaCount back
        up (an HPA leaves one at zero alone); the next launch applies it again."""
        selector = manifests.instance_selector(deployment.team.name, deployment.name, instance)
        for item in managed_items(kube, manifests.KEDA_API_VERSION, manifests.KEDA_KIND, namespace, selector,
                                  self.cfg):
            kube.delete(manifests.KEDA_API_VERSION, manifests.KEDA_KIND, namespace, item["metadata"]["name"])
        kube.scale(namespace, instance, 0)

    def _require_keda(self, kube: Kube, namespace: str) -> None:
        """RuntimeUnavailable, before anything is applied, when the cluster has no ScaledObject API (no KEDA)."""
        try:
            kube.list(manifests.KEDA_API_VERSION, manifests.KEDA_KIND, namespace, "")
        except KubeError as exc:
            if exc.status != 404:
                raise
            raise RuntimeUnavailable(
                "KUBERNETES_AUTOSCALING is keda but the cluster has no KEDA: the API server does not know "
                f"{manifests.KEDA_KIND} ({manifests.KEDA_API_VERSION}), so nothing was applied. Install KEDA "
                "(its CRDs and operator), or set KUBERNETES_AUTOSCALING to hpa or queue-ratio-hpa, or deploy "
                "without autoscaling.") from None

    def _check_ownership(self, kube: Kube, objects: list[tuple[str, str, str]], target: manifests.Target,
                         namespace: str) -> dict[str, dict[str, Any]]:
        """The existing objects by kind; RuntimeUnavailable naming the first that is not this deployment's.

        Server-side apply with force would take any object of the same name over, whoever made it: a Secret, a
        Service or a NetworkPolicy of another application, or of another team sharing the namespace. Checked
        before anything is applied (the namespace included), so a refusal leaves the cluster as it was."""
        existing: dict[str, dict[str, Any]] = {}
        for api_version, kind, name in objects:
            found = kube.get(api_version, kind, namespace, name)
            if found is None:
                continue
            if not manifests.is_managed(found, target.team, target.deployment_name, target.name):
                theirs = found["metadata"].get("labels") or {}
                raise RuntimeUnavailable(
                    f"A {kind} named {name} exists in namespace {namespace} and is not this deployment's "
                    f"(team {theirs.get(manifests.LABEL_TEAM, 'none')}, deployment "
                    f"{theirs.get(manifests.LABEL_DEPLOYMENT, 'none')}, managed by "
                    f"{theirs.get('app.kubernetes.io/managed-by', 'someone else')}): Modelport never takes over an "
                    "object it did not create, so nothing was applied. Delete or rename that object, choose another "
                    "deployment name, or map the team to a namespace of its own (KUBERNETES_NAMESPACES).")
            existing[kind] = found
        return existing

    def ensure_namespace(self, kube: Kube, namespace: str, team: str) -> None:
        try:
            exists = kube.get("v1", "Namespace", None, namespace) is not None
        except KubeError as exc:
            if exc.status != 403 or self.cfg.create_namespaces:
                raise
            exists = True  # may not read namespaces (a namespaced Role only): assume the operator made it
        if exists:
            return  # an existing namespace is left as it is, labels included
        if not self.cfg.create_namespaces:
            raise RuntimeUnavailable(
                f"The namespace {namespace} for team {team} does not exist and KUBERNETES_CREATE_NAMESPACES is "
                f"false: create it (kubectl create namespace {namespace}), or map the team to an existing "
                "namespace in KUBERNETES_NAMESPACES.")
        kube.apply(manifests.namespace_object(namespace))

    def observe(self, launch: Launch) -> Observation:
        revision = Revision.objects.select_related("deployment__team").get(pk=launch.revision_id)
        namespace, name = str(launch.ref).split("/", 1)
        selector = manifests.revision_selector(revision.deployment.team.name, name, revision.number)
        try:
            kube = self.kube()
            deployment = kube.get("apps/v1", "Deployment", namespace, name)
            if deployment is None:
                return Observation("failed", f"its Kubernetes Deployment {namespace}/{name} was deleted")
            pods = kube.list("v1", "Pod", namespace, selector)
            verdict = k8s_status.rollout(deployment, pods.get("items", []), revision=revision.number,
                                         now=timezone.now(), unschedulable_grace=self.cfg.unschedulable_grace_seconds)
            if verdict.state == "ready":
                self._resume_scaling(kube, revision, namespace, name, deployment)
                return Observation("ready", verdict.message)
            if verdict.state == "failed":
                detail = self._log_tail(kube, namespace, verdict.logs_pod, verdict.previous,
                                        container=verdict.logs_container)
                return Observation("failed", verdict.message, detail)
            return Observation("starting", verdict.message)
        except Unreachable as exc:
            # A blip: the reconciler looks again until the launch's deadline.
            return Observation("starting", f"the Kubernetes API server is not reachable ({exc})")
        except KubeError as exc:
            return Observation("starting", explain(exc, f"read Deployment {namespace}/{name}"))

    def _resume_scaling(self, kube: Kube, revision: Revision, namespace: str, name: str,
                        deployment: dict[str, Any]) -> None:
        """A scale-to-zero revision is ready: its ScaledObject is applied without the rollout's pause, so that KEDA
        scales it again (to zero when no request comes). Applied again at each look while ready: idempotent."""
        autoscaling = revision.spec.autoscaling
        if not (autoscaling and autoscaling.scales_to_zero and self.cfg.autoscaling == "keda"):
            return
        target = target_for(revision, self.cfg, name)
        for obj in manifests.build(target, namespace, self.cfg, owner_uid=deployment["metadata"]["uid"]):
            if obj["kind"] == manifests.KEDA_KIND:
                kube.apply(obj)

    def _log_tail(self, kube: Kube, namespace: str, pod: str | None, previous: bool, lines: int = LOG_LINES,
                  container: str = manifests.CONTAINER) -> str:
        if not pod:
            return ""
        for use_previous in ([True, False] if previous else [False]):
            try:
                text = _pod_log(kube, namespace, pod, container, lines, settings.LOG_TAIL_MAX_BYTES,
                                previous=use_previous)
            except (KubeError, Unreachable):
                continue
            if text.strip():
                return text.rstrip("\n")
        return ""

    def abandon(self, launch: Launch) -> None:
        """The revision did not become ready: go back to the serving revision, or scale to zero."""
        revision = Revision.objects.select_related("deployment__team", "deployment__serving_revision").get(
            pk=launch.revision_id)
        deployment = Deployment.objects.select_related("team", "serving_revision").get(pk=revision.deployment_id)
        namespace, name = str(launch.ref).split("/", 1)
        serving = deployment.serving_revision
        try:
            kube = self.kube()
            if (serving is not None and serving.pk != revision.pk and deployment.upstream_url
                    and name == serving_instance(deployment)):
                # A rollout updated the serving Deployment in place: back to the serving revision.
                self._apply(kube, serving, namespace, target_for(serving, self.cfg, name), rollout=False)
            else:  # a first revision, or a canary beside the serving one
                self._scale_to_zero(kube, namespace, deployment, name)
        except (KubeError, Unreachable, RuntimeUnavailable) as exc:
            log.warning("could not abandon %s: %s", launch.description, exc)

    def check(self, deployment: Deployment, launch: Launch) -> Health:
        problem = self.cfg.cluster_problem()
        if problem:
            return Health(False, problem)
        namespace = self._namespace(deployment)
        name = _instance_of(launch) or deployment.name
        try:
            kube = self.kube()
            obj = kube.get("apps/v1", "Deployment", namespace, name)
            serving = Revision.objects.filter(pk=launch.revision_id).first() or deployment.serving_revision
            scaling = serving.spec.autoscaling if serving is not None else None
            ok, message = k8s_status.health(obj, may_be_zero=bool(scaling and scaling.scales_to_zero))
            if ok:
                return Health(True)
            detail = ""
            if obj is not None and serving is not None:
                selector = manifests.revision_selector(deployment.team.name, name, serving.number)
                pods = kube.list("v1", "Pod", namespace, selector).get("items", [])
                now = timezone.now()
                for pod in pods:
                    problem_verdict = k8s_status.pod_problem(pod, now=now, unschedulable_grace=0)
                    if problem_verdict is not None:
                        detail = problem_verdict.message
                        logs = self._log_tail(kube, namespace, problem_verdict.logs_pod, problem_verdict.previous,
                                              container=problem_verdict.logs_container)
                        detail += f"\n{logs}" if logs else ""
                        break
            return Health(False, message, detail)
        except Unreachable as exc:
            # A blip most likely; the pods still serve. The next check looks again.
            log.warning("cannot check deployment %s (%s/%s) on Kubernetes: %s", deployment.pk, namespace,
                        deployment.name, exc)
            return Health.cannot_tell(f"the Kubernetes API server is not reachable ({exc})")
        except KubeError as exc:
            # Refused (RBAC, credentials): not healthy as far as anyone can tell, and no restart would help. The
            # deployment's status names the rules to grant; it keeps its route, since its pods most likely serve.
            log.warning("cannot check deployment %s (%s/%s) on Kubernetes: %s %s: %s", deployment.pk, namespace,
                        deployment.name, exc.status, exc.reason, exc.message)
            return Health.cannot_tell(explain(exc, f"read Deployment {namespace}/{deployment.name}"))
        except RuntimeUnavailable as exc:
            log.warning("cannot check deployment %s (%s/%s) on Kubernetes: %s", deployment.pk, namespace,
                        deployment.name, exc)
            return Health.cannot_tell(str(exc))

    def retire(self, deployment: Deployment, keep: Sequence[Launch]) -> list[str]:
        """Kubernetes replaced the old pods itself; what is left is the old revisions' access Secrets and their
        repositories in S3, and the objects of a canary rolled back (or of the serving revision a canary replaced
        when it was promoted)."""
        keep_numbers = set(Revision.objects.filter(pk__in=[launch.revision_id for launch in keep])
                           .values_list("number", flat=True))
        messages: list[str] = []
        team = deployment.team.name
        if not self.cfg.cluster_problem():
            namespace = self._namespace(deployment)
            try:
                kube = self.kube()
                kept = {_instance_of(launch) for launch in keep}
                for instance in instances(deployment) if keep else ():
                    if instance not in kept and kube.get("apps/v1", "Deployment", namespace, instance) is not None:
                        selector = manifests.instance_selector(team, deployment.name, instance)
                        for api_version, kind in (("apps/v1", "Deployment"), *SECONDARY_KINDS):
                            for item in managed_items(kube, api_version, kind, namespace, selector, self.cfg):
                                kube.delete(api_version, kind, namespace, item["metadata"]["name"])
                        messages.append(f"Removed the Kubernetes Deployment {namespace}/{instance}, which no longer "
                                        "serves.")
                for item in kube.list("v1", "Secret", namespace,
                                      manifests.access_selector(team, deployment.name)).get("items", []):
                    if (item["metadata"].get("labels") or {}).get(manifests.LABEL_REVISION) not in {
                            str(number) for number in keep_numbers}:
                        kube.delete("v1", "Secret", namespace, item["metadata"]["name"])
            except (KubeError, Unreachable, RuntimeUnavailable) as exc:
                log.warning("could not remove old access Secrets of %s: %s", deployment, exc)
        if not self.cfg.s3_configured:
            return messages
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            s3 = s3repo.client(self.cfg)
            prefix = s3repo.deployment_prefix(self.cfg, team, deployment.name, deployment.pk)
            for number in s3repo.uploaded_revisions(s3, self.cfg.s3_bucket, prefix):
                if number not in keep_numbers:
                    s3repo.delete_repository(s3, self.cfg.s3_bucket, s3repo.revision_prefix(
                        self.cfg, team, deployment.name, deployment.pk, number))
                    messages.append(f"Removed the model repository of revision {number} from S3.")
        except (BotoCoreError, ClientError) as exc:
            log.warning("could not remove old repositories of %s: %s", deployment, exc)
        return messages

    def stop(self, deployment: Deployment) -> None:
        if self.cfg.cluster_problem():
            return  # no cluster: nothing of it can be running
        for instance in instances(deployment):  # its own Deployment and its canary's
            try:
                # Unchecked: a refused namespace still gets the team's own objects (found by label) stopped.
                self._scale_to_zero(self.kube(), self.cfg.team_namespace(deployment.team.name), deployment, instance)
            except KubeError as exc:
                if exc.status != 404:
                    raise RuntimeUnavailable(explain(exc, f"scale {instance} to zero")) from None
            except Unreachable as exc:
                raise self.unreachable(exc) from None

    def teardown(self, deployment: Deployment) -> None:
        """Delete every object labelled for the deployment, then its repositories in S3."""
        team, namespace = deployment.team.name, self.cfg.team_namespace(deployment.team.name)  # unchecked, as stop
        if not self.cfg.cluster_problem():
            selector = manifests.managed_selector(team, deployment.name)
            try:
                kube = self.kube()
                for api_version, kind in MANAGED_KINDS:
                    for item in managed_items(kube, api_version, kind, namespace, selector, self.cfg):
                        kube.delete(api_version, kind, namespace, item["metadata"]["name"])
            except KubeError as exc:
                if exc.status != 404:  # 404: the namespace is gone, and everything with it
                    raise RuntimeUnavailable(explain(exc, f"delete the objects of {deployment.name}")) from None
            except Unreachable as exc:
                raise self.unreachable(exc) from None
        if self.cfg.s3_configured:
            from botocore.exceptions import BotoCoreError, ClientError

            try:
                s3repo.delete_prefix(s3repo.client(self.cfg), self.cfg.s3_bucket,
                                     s3repo.deployment_prefix(self.cfg, team, deployment.name, deployment.pk))
            except (BotoCoreError, ClientError) as exc:
                raise RuntimeUnavailable(f"The model repositories cannot be deleted from S3: {exc}") from None

    # --- Presigned URLs ---------------------------------------------------------------------------------------

    def refresh_repository_access(self, deployment: Deployment) -> list[int]:
        """Renew the access Secrets of the deployment's current and serving revisions once half their URLs' life
        has passed; returns the revision numbers renewed.

        An update (PUT with the resourceVersion just read), not an apply: it never re-creates a Secret that a
        teardown deleted meanwhile, and loses to any concurrent change (the next pass tries again)."""
        if self.cfg.cluster_problem() or self.cfg.s3_problem():
            return []
        wanted = {r.number: r for r in (deployment.revision, deployment.serving_revision, deployment.canary_revision)
                  if r is not None}
        namespace = self._namespace(deployment)
        kube = self.kube()
        renewed = []
        margin = timedelta(seconds=self.cfg.repository_url_seconds / 2)
        try:
            secrets = kube.list("v1", "Secret", namespace,
                                manifests.access_selector(deployment.team.name, deployment.name)).get("items", [])
            for secret in secrets:
                meta = secret["metadata"]
                label = str((meta.get("labels") or {}).get(manifests.LABEL_REVISION, ""))
                revision = wanted.get(int(label)) if label.isdecimal() and label.isascii() else None
                expires_at = _parse_iso((meta.get("annotations") or {}).get(manifests.ANNOTATION_URLS_EXPIRE))
                if revision is None or (expires_at is not None and expires_at - self.now() > margin):
                    continue
                owner = next((ref["uid"] for ref in meta.get("ownerReferences") or []
                              if ref.get("kind") == "Deployment"),
                             None)
                instance = str((meta.get("labels") or {}).get("app.kubernetes.io/instance") or deployment.name)
                fresh = self.access_secret(revision, namespace, owner_uid=owner,
                                           target=target_for(revision, self.cfg, instance))
                fresh["metadata"]["resourceVersion"] = meta["resourceVersion"]
                try:
                    kube.replace(fresh)
                except KubeError as exc:
                    if exc.status in (404, 409):  # deleted or changed since listed: nothing to renew, or next pass
                        continue
                    raise
                renewed.append(revision.number)
        except KubeError as exc:
            what = f"renew the access Secrets of {namespace}/{deployment.name}"
            raise RuntimeUnavailable(explain(exc, what)) from None
        except Unreachable as exc:
            raise self.unreachable(exc) from None
        return renewed

    def logs(self, deployment: Deployment, lines: int, revision: Revision | None = None) -> str:
        problem = self.cfg.cluster_problem()
        if problem:
            return f"No logs: {problem}\n"
        revision = revision or deployment.serving_revision or deployment.revision
        if revision is None:
            return ""
        try:
            namespace = self._namespace(deployment)
            kube = self.kube()
            # That revision's pods only: a canary's (or a rolled-back one's) say nothing about what serves.
            selector = manifests.revision_selector(deployment.team.name, deployment.name, revision.number)
            pods = kube.list("v1", "Pod", namespace, selector).get("items", [])
            pods.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]), reverse=True)
            pods = pods[:MAX_LOG_PODS]
            # The answer stays within LOG_TAIL_MAX_BYTES however many pods there are.
            budget = settings.LOG_TAIL_MAX_BYTES // max(1, len(pods))
            if len(pods) == 1:
                return _pod_log(kube, namespace, pods[0]["metadata"]["name"], manifests.CONTAINER, lines, budget)
            parts = []
            for pod in pods:
                pod_name = pod["metadata"]["name"]
                try:
                    text = _pod_log(kube, namespace, pod_name, manifests.CONTAINER, lines, budget)
                except KubeError as exc:
                    text = f"(no log: {exc.message})\n"
                parts.append(f"==> pod/{pod_name} <==\n{text}")
            return "\n".join(parts)
        except Unreachable as exc:
            return f"No logs: {self.unreachable(exc)}\n"
        except (KubeError, RuntimeUnavailable) as exc:
            return f"No logs: {exc}\n"

    # --- What the pages, the API and the tuner ask (base.Answers) ------------------------------------------------

    can_tune = False  # a tune measures temporary Tritons on this machine; a cluster's pods are not started for one

    def configuration_problems(self) -> list[str]:
        return self.cfg.problems()

    def isolation(self, deployment: Deployment) -> dict[str, Any] | None:
        return None  # the cluster confines its pods (docs/kubernetes.md); no local sandbox to speak of

    def server_alive(self, pid: int) -> bool:
        return False  # no server of this runtime is a process on this machine

    def start_temporary(self, spec: RevisionSpec, workdir: Path, label: str) -> TemporaryServer:
        raise RuntimeUnavailable(f"The Kubernetes runtime starts no temporary server ({label}): a tune measures "
                                 "temporary Tritons on this machine.")

    def stop_temporary(self, server: TemporaryServer) -> None:
        raise RuntimeUnavailable("The Kubernetes runtime starts no temporary server.")

    def temporary_processes(self, root: Path) -> list[tuple[int, float]]:
        return []

    def stop_process(self, pid: int) -> None:
        raise RuntimeUnavailable(f"The Kubernetes runtime runs no process on this machine (pid {pid}).")

    def refresh_pool_figures(self, shared: Pool) -> None:
        pass  # a cluster pool's figures are not read from here


    def wake(self, load_id: int, wait_seconds: float) -> Wake:
        return Wake(failure="its revision is not in a pool")  # placed.py sends a pool's wakes to the pool launcher

    def unload_idle(self) -> list[str]:
        return []

    def sweep_orphans(self) -> list[str]:
        return []  # what a deployment leaves on the cluster is removed by its retire and teardown

    def refresh_access(self) -> int:
        return refresh_repository_access(self)


def _pod_log(kube: Kube, namespace: str, pod: str, container: str, lines: int, max_bytes: int, *,
             previous: bool = False) -> str:
    """A container's last `lines` lines, at most `max_bytes` read, each cut at LOG_LINE_MAX_BYTES: what the team's
    model wrote is bounded before it is decoded (the kubelet's limitBytes counts from the start of the tail: a giant
    line comes as its first bytes, cut with a marker)."""
    data = kube.pod_log(namespace, pod, container, tail_lines=lines, limit_bytes=max_bytes, previous=previous)
    return logtail.tail_text(data, lines, max_bytes=max_bytes, line_max=settings.LOG_LINE_MAX_BYTES)


def refresh_repository_access(runtime: KubernetesRuntime | None = None) -> int:
    """Periodic (Celery beat, through Runtime.refresh_access): renew the presigned URLs of every running Kubernetes
    deployment, failed ones included (a failed rollout leaves the previous revision serving, and its pods may
    restart). Returns how many access Secrets were renewed."""
    runtime = runtime or KubernetesRuntime()
    if runtime.cfg.cluster_problem() or runtime.cfg.s3_problem():
        return 0
    renewed = 0
    deployments = Deployment.objects.select_related("team", "revision", "serving_revision", "canary_revision").filter(
        runtime=Deployment.Runtime.KUBERNETES, desired_state=Deployment.Desired.RUNNING)
    for deployment in deployments:
        try:
            numbers = runtime.refresh_repository_access(deployment)
        except RuntimeUnavailable as exc:
            log.warning("cannot renew the repository URLs of %s: %s", deployment, exc)
            continue
        for number in numbers:
            log.info("renewed the repository URLs of %s revision %s", deployment, number)
        renewed += len(numbers)
    return renewed
