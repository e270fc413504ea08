"""The Kubernetes runtime: Triton pods on a cluster, one Kubernetes Deployment per Modelport deployment.

A revision's model repository is rendered for the official Triton image and uploaded to S3 under a prefix of its
own; its manifests (deployments.k8s.manifests) are applied with server-side apply in the team's namespace, and
the Deployment's rolling update (maxUnavailable 0) replaces the previous revision's pods once the new ones are
ready. The gateway routes to the Service's cluster DNS name, which stays the same across revisions.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from deployments.k8s import manifests, s3repo
from deployments.k8s import status as k8s_status
from deployments.k8s.config import KubernetesConfig
from deployments.k8s.kube import ConfigError, Kube, KubeError, Unreachable
from deployments.models import Deployment, Revision
from deployments.render import RenderError, render_repository
from deployments.runtimes.base import Health, Launch, Ready, RuntimeUnavailable
from deployments.snapshot import repository_spec
from models_registry.validation import archive_limits

log = logging.getLogger(__name__)

# A watch lasts at most this long, so that the reconciler renews its lease and notices cancellations.
WATCH_SECONDS = 5
LOG_LINES = 10  # Triton's last log lines in a failure's detail
MAX_LOG_PODS = 5
# Kinds besides the Deployment that a revision may or may not have; objects no longer wanted are removed.
SECONDARY_KINDS = (
    ("v1", "Service"),
    ("policy/v1", "PodDisruptionBudget"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("networking.k8s.io/v1", "NetworkPolicy"),
)


def config() -> KubernetesConfig:
    return KubernetesConfig.from_settings(settings)


def target_for(revision: Revision, cfg: KubernetesConfig) -> manifests.Target:
    deployment = revision.deployment
    key = s3repo.revision_prefix(cfg, deployment.team.name, deployment.name, deployment.pk, revision.number)
    return manifests.Target(team=deployment.team.name, name=deployment.name, revision=revision.number,
                            spec=revision.spec, repository_key=key)


def export_manifests(deployment: Deployment) -> str:
    """The YAML of the deployment's current revision, for GitOps (without the S3 credentials Secret).
    Raises ManifestError."""
    cfg = config()
    revision = deployment.revision
    assert revision is not None
    namespace = cfg.namespace_for(deployment.team.name)
    target = target_for(revision, cfg)
    objects = manifests.build(target, namespace, cfg)
    if cfg.create_namespaces:
        objects.insert(0, manifests.namespace_object(namespace))
    header = [
        f"Modelport deployment {deployment.team.name}/{deployment.name}, revision {revision.number}.",
        "Apply with: kubectl apply --server-side --field-manager=modelport -f -",
        f"Triton loads the model repository from {cfg.repository_url(target.repository_key)};",
        "Modelport's worker uploads it there when it rolls the revision out.",
    ]
    if cfg.s3_secret_name:
        header.append(f"Triton reads its S3 credentials from the Secret {cfg.s3_secret_name} of namespace {namespace} "
                      "(keys AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), which is not exported.")
    header += [f"Not configured here: {problem}" for problem in cfg.problems()]
    return manifests.to_yaml(objects, header)


def _explain(exc: KubeError, what: str) -> str:
    if exc.status == 401:
        return (f"The Kubernetes API server did not accept Modelport's credentials while trying to {what} "
                f"({exc.message}): check the user of KUBECONFIG, or the service account token in-cluster.")
    if exc.status == 403:
        return (f"Kubernetes refused to let Modelport {what}: {exc.message}. Give the worker's service account the "
                "permissions of platform/kubernetes/base/rbac.yaml.")
    return f"Kubernetes refused to {what} ({exc.status} {exc.reason}): {exc.message}"


class KubernetesRuntime:
    def __init__(self, cfg: KubernetesConfig | None = None) -> None:
        self.cfg = cfg or config()
        self._kube: Kube | None = None

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

    def _unreachable(self, exc: Unreachable) -> RuntimeUnavailable:
        return RuntimeUnavailable(
            f"The Kubernetes API server is not reachable ({exc}): check that the cluster is up and that KUBECONFIG "
            "(or the in-cluster service account) points at it.")

    def _namespace(self, deployment: Deployment) -> str:
        return self.cfg.namespace_for(deployment.team.name)

    # --- Runtime protocol -------------------------------------------------------------------------------------

    def prepare(self, revision: Revision) -> None:
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

    def _render_and_upload(self, revision: Revision, s3: Any, bucket: str, prefix: str) -> None:
        from deployments.runtimes.local import artifact_path

        spec = repository_spec(revision.spec,
                               lambda entry: artifact_path(entry["sha256"]) if entry.get("sha256") else None)
        scratch = Path(settings.VAR_DIR) / "tmp"
        scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="k8s-repository-", dir=scratch) as tmp:
            out = Path(tmp) / "repository"
            render_repository(spec, "kubernetes", out, tnn_backend_name=self.cfg.tnn_backend_name,
                              archive_limits=archive_limits())
            s3repo.upload_repository(s3, bucket, prefix, out)

    def launch(self, revision: Revision) -> Launch:
        kube = self.kube()
        deployment = revision.deployment
        namespace = self._namespace(deployment)
        target = target_for(revision, self.cfg)
        try:
            applied = self._apply(kube, target, namespace)
        except Unreachable as exc:
            raise self._unreachable(exc) from None
        replicas = applied["spec"].get("replicas", target.replicas)
        return Launch(
            revision_id=revision.pk,
            url=manifests.service_url(target.name, namespace, self.cfg),
            description=f"Deployment {namespace}/{target.name}, {replicas} replica{'s' if replicas != 1 else ''}",
            ref=f"{namespace}/{target.name}",
        )

    def _apply(self, kube: Kube, target: manifests.Target, namespace: str) -> dict[str, Any]:
        """Apply every object of `target`; returns the applied Deployment."""
        what = f"apply Deployment {namespace}/{target.name}"
        try:
            objects = manifests.build(target, namespace, self.cfg)
        except manifests.ManifestError as exc:
            raise RuntimeUnavailable(str(exc)) from None
        try:
            what = f"read or create the namespace {namespace}"
            self._ensure_namespace(kube, namespace, target.team)
            if self.cfg.s3_secret_name and self.cfg.s3_credentials:
                what = f"write the Secret {namespace}/{self.cfg.s3_secret_name}"
                kube.apply(manifests.s3_secret(namespace, self.cfg))
            existing = kube.get("apps/v1", "Deployment", namespace, target.name)
            if existing is not None:
                theirs = existing["metadata"].get("labels") or {}
                if theirs.get(manifests.LABEL_TEAM) != target.team or \
                        theirs.get("app.kubernetes.io/managed-by") != manifests.MANAGED_BY:
                    raise RuntimeUnavailable(
                        f"A Deployment named {target.name} exists in namespace {namespace} and is not this "
                        f"deployment's (team {theirs.get(manifests.LABEL_TEAM, 'none')}, managed by "
                        f"{theirs.get('app.kubernetes.io/managed-by', 'someone else')}): choose another name or "
                        "map the team to its own namespace (KUBERNETES_NAMESPACES).")
            what = f"apply Deployment {namespace}/{target.name}"
            applied = kube.apply(objects[0])
            autoscaling = target.autoscaling
            if autoscaling and int(applied["spec"].get("replicas") or 0) < int(autoscaling["min_replicas"]):
                # Stopped (scaled to zero: the HPA does not scale up from zero by itself), or autoscaling was just
                # switched on and the replica count Modelport no longer applies fell back to its default.
                kube.scale(namespace, target.name, int(autoscaling["min_replicas"]))
                applied["spec"]["replicas"] = int(autoscaling["min_replicas"])
            owned = manifests.build(target, namespace, self.cfg, owner_uid=applied["metadata"]["uid"])
            for obj in owned[1:]:
                what = f"apply {obj['kind']} {namespace}/{target.name}"
                kube.apply(obj)
            what = f"remove objects of {namespace}/{target.name} the revision no longer has"
            wanted = {(obj["apiVersion"], obj["kind"]) for obj in owned}
            selector = manifests.managed_selector(target.team, target.name)
            for api_version, kind in SECONDARY_KINDS:
                if (api_version, kind) in wanted:
                    continue
                for item in kube.list(api_version, kind, namespace, selector).get("items", []):
                    kube.delete(api_version, kind, namespace, item["metadata"]["name"])
        except KubeError as exc:
            raise RuntimeUnavailable(_explain(exc, what)) from None
        return applied

    def _ensure_namespace(self, kube: Kube, namespace: str, team: str) -> None:
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

    def wait_ready(self, launch: Launch, keep_waiting: Callable[[], bool]) -> Ready:
        revision = Revision.objects.select_related("deployment__team").get(pk=launch.revision_id)
        namespace, name = str(launch.ref).split("/", 1)
        selector = manifests.revision_selector(revision.deployment.team.name, name, revision.number)
        deadline = time.monotonic() + self.cfg.ready_timeout_seconds
        kube = self.kube()
        message = "waiting for Kubernetes"
        while True:
            resource_version = ""
            try:
                deployment = kube.get("apps/v1", "Deployment", namespace, name)
                if deployment is None:
                    return Ready(False, f"its Kubernetes Deployment {namespace}/{name} was deleted")
                pods = kube.list("v1", "Pod", namespace, selector)
                resource_version = pods.get("metadata", {}).get("resourceVersion", "")
                verdict = k8s_status.rollout(deployment, pods.get("items", []), revision=revision.number,
                                             now=timezone.now(),
                                             unschedulable_grace=self.cfg.unschedulable_grace_seconds)
                message = verdict.message
                if verdict.state == "ready":
                    return Ready(True, verdict.message)
                if verdict.state == "failed":
                    detail = self._log_tail(kube, namespace, verdict.logs_pod, verdict.previous)
                    return Ready(False, verdict.message, detail)
            except Unreachable as exc:
                message = f"the Kubernetes API server is not reachable ({exc})"  # a blip: keep trying until the deadline
            except KubeError as exc:
                message = _explain(exc, f"read Deployment {namespace}/{name}")
            if time.monotonic() >= deadline:
                return Ready(False, f"not ready after {self.cfg.ready_timeout_seconds} s: {message}")
            if not keep_waiting():
                return Ready(False, "cancelled", cancelled=True)
            self._wait_for_change(kube, namespace, selector, resource_version)

    def _wait_for_change(self, kube: Kube, namespace: str, selector: str, resource_version: str) -> None:
        """Block until a pod of the revision changes, or WATCH_SECONDS pass."""
        if not resource_version:
            time.sleep(1)  # no list to watch from (the API server did not answer): retry shortly
            return
        try:
            for _event in kube.watch_pods(namespace, selector, resource_version, WATCH_SECONDS):
                return
        except (KubeError, Unreachable) as exc:
            log.info("watching pods of %s in %s: %s", selector, namespace, exc)
            time.sleep(1)

    def _log_tail(self, kube: Kube, namespace: str, pod: str | None, previous: bool, lines: int = LOG_LINES) -> str:
        if not pod:
            return ""
        for use_previous in ([True, False] if previous else [False]):
            try:
                text = kube.pod_log(namespace, pod, manifests.CONTAINER, tail_lines=lines, previous=use_previous)
            except (KubeError, Unreachable):
                continue
            if text.strip():
                return "\n".join(text.rstrip("\n").splitlines()[-lines:])
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
            if serving is not None and serving.pk != revision.pk and deployment.upstream_url:
                self._apply(kube, target_for(serving, self.cfg), namespace)
            else:
                kube.scale(namespace, name, 0)
        except (KubeError, Unreachable, RuntimeUnavailable) as exc:
            log.warning("could not abandon %s: %s", launch.description, exc)

    def check(self, deployment: Deployment) -> Health:
        problem = self.cfg.cluster_problem()
        if problem:
            return Health(False, problem)
        namespace = self._namespace(deployment)
        try:
            kube = self.kube()
            obj = kube.get("apps/v1", "Deployment", namespace, deployment.name)
            ok, message = k8s_status.health(obj)
            if ok:
                return Health(True)
            serving = deployment.serving_revision
            detail = ""
            if obj is not None and serving is not None:
                selector = manifests.revision_selector(deployment.team.name, deployment.name, serving.number)
                pods = kube.list("v1", "Pod", namespace, selector).get("items", [])
                now = timezone.now()
                for pod in pods:
                    problem_verdict = k8s_status.pod_problem(pod, now=now, unschedulable_grace=0)
                    if problem_verdict is not None:
                        detail = problem_verdict.message
                        logs = self._log_tail(kube, namespace, problem_verdict.logs_pod, problem_verdict.previous)
                        detail += f"\n{logs}" if logs else ""
                        break
            return Health(False, message, detail)
        except (Unreachable, KubeError, RuntimeUnavailable) as exc:
            # Cannot tell from here; the pods most likely still serve. Try again at the next check.
            log.warning("cannot check %s on Kubernetes: %s", deployment, exc)
            return Health(True)

    def retire(self, deployment: Deployment, keep: Launch) -> list[str]:
        """Kubernetes replaced the old pods itself; what is left is the old revisions' repositories in S3."""
        if not self.cfg.s3_configured:
            return []
        from botocore.exceptions import BotoCoreError, ClientError

        keep_number = Revision.objects.filter(pk=keep.revision_id).values_list("number", flat=True).first()
        messages = []
        team = deployment.team.name
        try:
            s3 = s3repo.client(self.cfg)
            prefix = s3repo.deployment_prefix(self.cfg, team, deployment.name, deployment.pk)
            for number in s3repo.uploaded_revisions(s3, self.cfg.s3_bucket, prefix):
                if number != keep_number:
                    s3repo.delete_repository(s3, self.cfg.s3_bucket, s3repo.revision_prefix(
                        self.cfg, team, deployment.name, deployment.pk, number))
                    messages.append(f"Removed the model repository of revision {number} from S3.")
        except (BotoCoreError, ClientError) as exc:
            log.warning("could not remove old repositories of %s: %s", deployment, exc)
        return messages

    def stop(self, deployment: Deployment) -> None:
        if self.cfg.cluster_problem():
            return  # no cluster: nothing of it can be running
        try:
            self.kube().scale(self._namespace(deployment), deployment.name, 0)
        except KubeError as exc:
            if exc.status != 404:
                raise RuntimeUnavailable(_explain(exc, f"scale {deployment.name} to zero")) from None
        except Unreachable as exc:
            raise self._unreachable(exc) from None

    def teardown(self, deployment: Deployment) -> None:
        """Delete every object labelled for the deployment, then its repositories in S3."""
        team, namespace = deployment.team.name, self._namespace(deployment)
        if not self.cfg.cluster_problem():
            selector = manifests.managed_selector(team, deployment.name)
            try:
                kube = self.kube()
                for api_version, kind in [("apps/v1", "Deployment"), *SECONDARY_KINDS]:
                    for item in kube.list(api_version, kind, namespace, selector).get("items", []):
                        kube.delete(api_version, kind, namespace, item["metadata"]["name"])
            except KubeError as exc:
                if exc.status != 404:  # 404: the namespace is gone, and everything with it
                    raise RuntimeUnavailable(_explain(exc, f"delete the objects of {deployment.name}")) from None
            except Unreachable as exc:
                raise self._unreachable(exc) from None
        if self.cfg.s3_configured:
            from botocore.exceptions import BotoCoreError, ClientError

            try:
                s3repo.delete_prefix(s3repo.client(self.cfg), self.cfg.s3_bucket,
                                     s3repo.deployment_prefix(self.cfg, team, deployment.name, deployment.pk))
            except (BotoCoreError, ClientError) as exc:
                raise RuntimeUnavailable(f"The model repositories cannot be deleted from S3: {exc}") from None

    def logs(self, deployment: Deployment, lines: int) -> str:
        problem = self.cfg.cluster_problem()
        if problem:
            return f"No logs: {problem}\n"
        namespace = self._namespace(deployment)
        try:
            kube = self.kube()
            pods = kube.list("v1", "Pod", namespace,
                             manifests.managed_selector(deployment.team.name, deployment.name)).get("items", [])
            pods.sort(key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]), reverse=True)
            pods = pods[:MAX_LOG_PODS]
            if len(pods) == 1:
                return kube.pod_log(namespace, pods[0]["metadata"]["name"], manifests.CONTAINER, tail_lines=lines)
            parts = []
            for pod in pods:
                pod_name = pod["metadata"]["name"]
                try:
                    text = kube.pod_log(namespace, pod_name, manifests.CONTAINER, tail_lines=lines)
                except KubeError as exc:
                    text = f"(no log: {exc.message})\n"
                parts.append(f"==> pod/{pod_name} <==\n{text}")
            return "\n".join(parts)
        except Unreachable as exc:
            return f"No logs: {self._unreachable(exc)}\n"
        except (KubeError, RuntimeUnavailable) as exc:
            return f"No logs: {exc}\n"
