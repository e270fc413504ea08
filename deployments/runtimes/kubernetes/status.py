"""What the state of a Deployment and its pods means for the user: pure functions over the API's JSON (dicts as
the API server sends them), so that each message can be tested from a recorded or hand-written pod.

`rollout()` answers "is the revision serving yet, still on its way, or stuck?" like `kubectl rollout status`
(observedGeneration, updated/available replicas, conditions), and turns the pod problems users hit into messages
that say what to change: an image that cannot be pulled, no free GPU, OOMKilled, Triton exiting on start.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from deployments.runtimes.kubernetes.manifests import CONTAINER, INIT_CONTAINER

State = Literal["ready", "waiting", "failed"]

IMAGE_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
CONFIG_REASONS = ("CreateContainerConfigError", "CreateContainerError", "RunContainerError")


@dataclass(frozen=True)
class Verdict:
    state: State
    message: str
    # A pod whose log explains a failure; `previous`: the log of the container that exited before.
    logs_pod: str | None = None
    previous: bool = False
    logs_container: str = CONTAINER


# What the init container's exit codes mean (deployments/runtimes/kubernetes/fetch_repository.py), and what to do
# about it.
FETCH_EXITS = {
    2: ("a file of the model repository does not match what Modelport recorded when it uploaded it (size or "
        "sha256), so the pod refused to serve it. Someone changed the repository in S3 after the upload: deploy "
        "the revision again (change and save the deployment) so that Modelport uploads it anew, and find out who "
        "can write to the bucket"),
    3: ("S3 refused the presigned download URLs (expired, or signed with credentials S3 no longer accepts). "
        "Modelport's worker renews them ahead of expiry: check that the Celery worker and beat run and that "
        "their S3 credentials are valid"),
}
FETCH_FAILED = ("the model repository could not be downloaded from S3. Check that KUBERNETES_TRITON_EGRESS lets "
                "Triton's pods reach the S3 endpoint (and KUBERNETES_DNS_NAMESPACE its DNS), and that the endpoint "
                "is reachable from the cluster under the name in S3_ENDPOINT_URL")


def _get(obj: Mapping[str, Any] | None, *path: str, default: Any = None) -> Any:
    for key in path:
        if not isinstance(obj, Mapping) or key not in obj:
            return default
        obj = obj[key]
    return obj


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in _get(obj, "status", "conditions", default=[]) or []:
        if condition.get("type") == kind:
            return condition  # type: ignore[no-any-return]
    return None


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _container_spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = _get(pod, "spec", "containers", default=[]) or []
    for container in containers:
        if container.get("name") == CONTAINER:
            return container  # type: ignore[no-any-return]
    return containers[0] if containers else {}


def _container_status(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    statuses = _get(pod, "status", "containerStatuses", default=[]) or []
    for status in statuses:
        if status.get("name") == CONTAINER:
            return status  # type: ignore[no-any-return]
    return statuses[0] if statuses else None


def _pod_name(pod: Mapping[str, Any]) -> str:
    return str(_get(pod, "metadata", "name", default="?"))


def _init_status(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for status in _get(pod, "status", "initContainerStatuses", default=[]) or []:
        if status.get("name") == INIT_CONTAINER:
            return status  # type: ignore[no-any-return]
    return None


def _init_problem(pod: Mapping[str, Any], status: Mapping[str, Any]) -> Verdict | None:
    """Why the init container that fetches the repository has not finished, if it is stuck."""
    name = _pod_name(pod)
    namespace = _get(pod, "metadata", "namespace", default="")
    waiting = _get(status, "state", "waiting") or {}
    terminated = _get(status, "state", "terminated") or {}
    last = _get(status, "lastState", "terminated") or {}
    reason = waiting.get("reason", "")
    restarts = int(status.get("restartCount", 0))
    if reason in IMAGE_PULL_REASONS:
        image = status.get("image") or next((c.get("image", "") for c in _get(pod, "spec", "initContainers",
                                                                                  default=[]) or []), "")
        return Verdict("failed", (
            f"Kubernetes cannot pull the image {image!r} of the init container that fetches the model repository "
            f"({reason}: {waiting.get('message', '').strip() or 'no details'}). Check KUBERNETES_FETCH_IMAGE (empty: "
            f"the Triton image) and, for a private registry, KUBERNETES_IMAGE_PULL_SECRETS in namespace {namespace}."))
    if reason in CONFIG_REASONS:
        return Verdict("failed", f"Kubernetes cannot start the init container that fetches the model repository "
                                 f"({reason}: {waiting.get('message', '').strip()}).")
    if terminated and not terminated.get("exitCode"):
        return None  # done: the repository is in place
    exited = terminated if terminated.get("exitCode") else last
    code = exited.get("exitCode")
    if code and (terminated.get("exitCode") or reason == "CrashLoopBackOff" or restarts):
        what = FETCH_EXITS.get(int(code), FETCH_FAILED)
        return Verdict("failed", (
            f"The model repository could not be fetched into pod {name} (its init container {INIT_CONTAINER} exited "
            f"with code {code}, {restarts} restart{'s' if restarts != 1 else ''}): {what}. Its last log lines say "
            "why:"), logs_pod=name, previous=not terminated.get("exitCode"), logs_container=INIT_CONTAINER)
    if _get(status, "state", "running") is not None:
        return Verdict("waiting", "fetching the model repository from S3")
    if reason == "PodInitializing" or not status:
        return None
    if reason:
        return Verdict("waiting", f"starting the init container ({reason})")
    return None


# --- One pod ------------------------------------------------------------------------------------------------


def pod_problem(pod: Mapping[str, Any], *, now: datetime, unschedulable_grace: float) -> Verdict | None:
    """A failed verdict for a pod that will not serve without a change, a waiting one saying what it waits for,
    or None for a pod that is ready."""
    name = _pod_name(pod)
    spec = _container_spec(pod)
    namespace = _get(pod, "metadata", "namespace", default="")

    if _get(pod, "status", "phase") == "Failed":
        reason = _get(pod, "status", "reason", default="Failed")
        message = _get(pod, "status", "message", default="")
        return Verdict("failed", f"Kubernetes stopped Triton's pod {name} ({reason}: {message}).".replace(": )", ")"))

    init = _init_status(pod)
    if init is not None and not init.get("ready"):
        problem = _init_problem(pod, init)
        if problem is not None:
            return problem

    status = _container_status(pod)
    if status is not None:
        waiting = _get(status, "state", "waiting") or {}
        terminated = _get(status, "state", "terminated") or {}
        last = _get(status, "lastState", "terminated") or {}
        reason = waiting.get("reason", "")
        restarts = int(status.get("restartCount", 0))
        if reason in IMAGE_PULL_REASONS:
            return Verdict("failed", (
                f"Kubernetes cannot pull the Triton image {spec.get('image', '')!r} ({reason}: "
                f"{waiting.get('message', '').strip() or 'no details'}). Check the image name and tag "
                f"(KUBERNETES_TRITON_IMAGE, or the deployment's image) and that the registry is reachable; for a "
                f"private registry, name a Secret of namespace {namespace} in KUBERNETES_IMAGE_PULL_SECRETS."))
        if reason in CONFIG_REASONS:
            message = waiting.get("message", "").strip()
            return Verdict("failed", f"Kubernetes cannot start Triton's container ({reason}: {message}).")
        if "OOMKilled" in (terminated.get("reason"), last.get("reason")):
            limit = _get(spec, "resources", "limits", "memory", default="its memory limit")
            return Verdict("failed", (
                f"Triton ran out of memory and was killed (OOMKilled) at its limit of {limit}: the models need "
                "more memory than that to load and serve. Raise resources.memory, or serve fewer or smaller models."),
                logs_pod=name, previous=not terminated)
        if reason == "CrashLoopBackOff" or terminated.get("exitCode") or (restarts and last.get("exitCode")):
            exited = terminated or last
            code = exited.get("exitCode", "?")
            return Verdict("failed", (
                f"Triton exited with code {code} (pod {name}, {restarts} restart{'s' if restarts != 1 else ''}"
                + (", CrashLoopBackOff" if reason == "CrashLoopBackOff" else "")
                + "). Its last log lines say why:"), logs_pod=name, previous=not terminated)

    scheduled = _condition(pod, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        message = str(scheduled.get("message", "")).strip()
        since = _parse_time(scheduled.get("lastTransitionTime"))
        waited = (now - since).total_seconds() if since else 0.0
        if waited >= unschedulable_grace:
            return Verdict("failed", unschedulable_message(pod, message))
        return Verdict("waiting", f"waiting for a node ({message})")

    if status is None:
        return Verdict("waiting", "waiting for its pod to start")
    if status.get("ready"):
        return None
    if _get(status, "state", "waiting", "reason"):
        return Verdict("waiting", f"starting the container ({status['state']['waiting']['reason']})")
    return Verdict("waiting", "Triton is loading the models")


def unschedulable_message(pod: Mapping[str, Any], scheduler: str) -> str:
    """Why no node takes the pod, from the scheduler's message ("0/3 nodes are available: 3 Insufficient ...")."""
    spec = _container_spec(pod)
    limits = _get(spec, "resources", "limits", default={}) or {}
    detail = f" (the scheduler: {scheduler})"
    mig = next((key for key in limits if key.startswith("nvidia.com/mig-")), None)
    if mig and f"Insufficient {mig}" in scheduler:
        profile = mig.removeprefix("nvidia.com/mig-")
        return (f"No node has a free MIG slice {profile} ({limits[mig]} wanted){detail}. Choose another "
                "mig_profile, stop another deployment that holds such slices, or add MIG-partitioned GPU nodes.")
    if "Insufficient nvidia.com/gpu" in scheduler:
        return (f"No node has {limits.get('nvidia.com/gpu', 'the')} free GPU(s) for it{detail}. Ask for fewer "
                "GPUs (resources.gpu) or replicas, stop another deployment that holds GPUs, or add GPU nodes.")
    selector = _get(pod, "spec", "nodeSelector", default={}) or {}
    if selector and ("node affinity/selector" in scheduler or "node selector" in scheduler):
        wanted = ", ".join(f"{k}={v}" for k, v in selector.items())
        return (f"No node has the label {wanted}{detail}. Check resources.gpu_type (KUBERNETES_GPU_TYPES maps "
                "types to label values) or label the GPU nodes.")
    for resource, field in (("cpu", "resources.cpu"), ("memory", "resources.memory")):
        if f"Insufficient {resource}" in scheduler:
            return f"No node has enough {resource} free for it{detail}. Lower {field} or replicas, or add nodes."
    if "untolerated taint" in scheduler:
        return (f"Every node that fits has a taint the pod does not tolerate{detail}. Add the taint's key to "
                "KUBERNETES_GPU_TOLERATIONS, or untaint the nodes.")
    return f"Kubernetes cannot schedule Triton's pod{detail}."


# --- The rollout --------------------------------------------------------------------------------------------


def rollout(deployment: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], *, revision: int, now: datetime,
            unschedulable_grace: float) -> Verdict:
    """Where the rollout of `revision` stands; `pods` are the pods of that revision."""
    notes: list[str] = []
    for pod in sorted(pods, key=_pod_name):
        if _get(pod, "metadata", "deletionTimestamp"):
            continue  # going away (an earlier attempt's pod): says nothing about this rollout
        problem = pod_problem(pod, now=now, unschedulable_grace=unschedulable_grace)
        if problem is not None and problem.state == "failed":
            return problem
        if problem is not None:
            notes.append(problem.message)
    note = f": {notes[0]}" if notes else ""

    generation = int(_get(deployment, "metadata", "generation", default=0))
    observed = int(_get(deployment, "status", "observedGeneration", default=0))
    if observed < generation:
        return Verdict("waiting", "Kubernetes has not yet acted on the new revision")
    progressing = _condition(deployment, "Progressing")
    if progressing is not None and progressing.get("reason") == "ProgressDeadlineExceeded":
        return Verdict("failed", f"The rollout of revision {revision} made no progress in time "
                                 f"(ProgressDeadlineExceeded){note}.")
    failure = _condition(deployment, "ReplicaFailure")
    if failure is not None and failure.get("status") == "True":
        return Verdict("failed", f"Kubernetes cannot create Triton's pods ({failure.get('reason')}: "
                                 f"{failure.get('message', '')}). A ResourceQuota or LimitRange of the namespace may "
                                 "refuse them: lower the resources or ask the cluster operator.")
    desired = int(_get(deployment, "spec", "replicas", default=1))
    status = _get(deployment, "status", default={}) or {}
    updated = int(status.get("updatedReplicas", 0))
    replicas = int(status.get("replicas", 0))
    available = int(status.get("availableReplicas", 0))
    if desired == 0:
        return Verdict("waiting", "the Deployment is scaled to zero")
    if updated < desired:
        return Verdict("waiting", f"{updated} of {desired} pods run revision {revision}{note}")
    if replicas > updated:
        return Verdict("waiting", f"{replicas - updated} pod(s) of the previous revision are still being replaced")
    if available < updated:
        return Verdict("waiting", f"{available} of {desired} pods are ready{note}")
    return Verdict("ready", f"{available} of {desired} pods ready")


def health(deployment: Mapping[str, Any] | None, may_be_zero: bool = False) -> tuple[bool, str]:
    """Whether a serving Deployment still serves: at least one available pod, or, `may_be_zero` (it scales to zero),
    none asked for (KEDA took it to zero; the gateway holds the next request while a pod starts)."""
    if deployment is None:
        return False, "its Kubernetes Deployment is gone"
    desired = int(_get(deployment, "spec", "replicas", default=1))
    available = int(_get(deployment, "status", "availableReplicas", default=0) or 0)
    if desired == 0 and may_be_zero:
        return True, ""
    if desired == 0:
        return False, "its Kubernetes Deployment was scaled to zero"
    if available == 0:
        return False, f"none of its {desired} Triton pod(s) is ready"
    return True, ""
