"""Rollout and pod states turned into messages a user can act on: pure functions over the API's JSON."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from deployments.runtimes.kubernetes.status import health, pod_problem, rollout, unschedulable_message

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def deployment(generation: int = 2, observed: int = 2, replicas: int = 2, updated: int = 2, total: int = 2,
               available: int = 2, conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "digits", "generation": generation}, "spec": {"replicas": replicas},
            "status": {"observedGeneration": observed, "replicas": total, "updatedReplicas": updated,
                       "availableReplicas": available, "conditions": conditions or []}}


def pod(container_status: dict[str, Any] | None = None, conditions: list[dict[str, Any]] | None = None,
        limits: dict[str, str] | None = None, node_selector: dict[str, str] | None = None,
        **status: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "triton", "image": "nvcr.io/nvidia/tritonserver:24.10-py3",
                                            "resources": {"limits": limits or {"memory": "4Gi"}}}]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    body: dict[str, Any] = {"phase": "Running", "conditions": conditions or [], **status}
    if container_status is not None:
        body["containerStatuses"] = [{"name": "triton", "restartCount": 0, "ready": False, **container_status}]
    return {"metadata": {"name": "digits-r2-0", "namespace": "modelport-acme"}, "spec": spec, "status": body}


def unschedulable(message: str, minutes: int = 10) -> list[dict[str, Any]]:
    since = (NOW - timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
             "lastTransitionTime": since}]


def verdict_of(*pods: dict[str, Any], dep: dict[str, Any] | None = None) -> Any:
    return rollout(dep or deployment(), list(pods), revision=2, now=NOW, unschedulable_grace=120)


def test_a_complete_rollout_is_ready() -> None:
    ready = pod({"ready": True, "state": {"running": {}}})
    assert verdict_of(ready, ready).state == "ready"


def test_a_rollout_waits_for_the_controller_and_for_old_pods() -> None:
    assert verdict_of(dep=deployment(generation=3, observed=2)).message == \
        "Kubernetes has not yet acted on the new revision"
    assert verdict_of(dep=deployment(updated=1)).message == "1 of 2 pods run revision 2"
    assert verdict_of(dep=deployment(total=3)).message == "1 pod(s) of the previous revision are still being replaced"
    loading = pod({"state": {"running": {}}})
    assert (verdict_of(loading, dep=deployment(available=1)).message
            == "1 of 2 pods are ready: Triton is loading the models")


def test_a_stalled_rollout_fails() -> None:
    stalled = deployment(available=0, conditions=[{"type": "Progressing", "status": "False",
                                                   "reason": "ProgressDeadlineExceeded"}])
    assert verdict_of(dep=stalled).message == ("The rollout of revision 2 made no progress in time "
                                               "(ProgressDeadlineExceeded).")


def test_a_quota_that_refuses_the_pods_fails_at_once() -> None:
    refused = deployment(updated=0, available=0, conditions=[{
        "type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
        "message": 'pods "digits-abc" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1'}])
    verdict = verdict_of(dep=refused)
    assert verdict.state == "failed"
    assert "exceeded quota: gpus" in verdict.message and "ResourceQuota" in verdict.message


def test_a_container_kubernetes_cannot_start_says_why() -> None:
    verdict = pod_problem(pod({"state": {"waiting": {"reason": "CreateContainerConfigError",
                                                     "message": 'configmap "x" not found'}}}),
                          now=NOW, unschedulable_grace=120)
    assert verdict is not None and verdict.state == "failed"
    assert verdict.message == "Kubernetes cannot start Triton's container (CreateContainerConfigError: configmap " \
                              "\"x\" not found)."


def fetching(init_status: dict[str, Any]) -> dict[str, Any]:
    """A pod whose init container (fetch-repository) is in `init_status`, Triton waiting for it."""
    waiting = pod({"state": {"waiting": {"reason": "PodInitializing"}}}, phase="Pending")
    waiting["spec"]["initContainers"] = [{"name": "fetch-repository", "image": "nvcr.io/nvidia/tritonserver:24.10-py3"}]
    waiting["status"]["initContainerStatuses"] = [{"name": "fetch-repository", "ready": False, "restartCount": 0,
                                                   **init_status}]
    return waiting


def test_a_pod_fetching_its_repository_is_waiting() -> None:
    verdict = pod_problem(fetching({"state": {"running": {}}}), now=NOW, unschedulable_grace=120)
    assert verdict is not None
    assert (verdict.state, verdict.message) == ("waiting", "fetching the model repository from S3")


def test_a_tampered_repository_fails_the_rollout_with_the_init_containers_log() -> None:
    verdict = verdict_of(fetching({"restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                   "lastState": {"terminated": {"exitCode": 2}}}))
    assert verdict.state == "failed"
    assert verdict.message.startswith("The model repository could not be fetched into pod digits-r2-0 (its init "
                                      "container fetch-repository exited with code 2, 1 restart): a file of the model "
                                      "repository does not match what Modelport recorded")
    assert (verdict.logs_pod, verdict.previous, verdict.logs_container) == ("digits-r2-0", True, "fetch-repository")


def test_expired_urls_and_unreachable_s3_say_what_to_check() -> None:
    expired = verdict_of(fetching({"state": {"terminated": {"exitCode": 3}}}))
    assert "S3 refused the presigned download URLs" in expired.message and "beat" in expired.message
    assert expired.previous is False  # the container that just exited is the current one
    unreachable = verdict_of(fetching({"restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                       "lastState": {"terminated": {"exitCode": 1}}}))
    assert "KUBERNETES_TRITON_EGRESS" in unreachable.message


def test_a_fetch_that_succeeded_after_a_failed_try_is_no_problem() -> None:
    done = fetching({"restartCount": 1, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                     "lastState": {"terminated": {"exitCode": 1}}})
    assert pod_problem(done, now=NOW, unschedulable_grace=120) == pod_problem(
        pod({"state": {"waiting": {"reason": "PodInitializing"}}}, phase="Pending"), now=NOW, unschedulable_grace=120)


def test_an_init_image_that_cannot_be_pulled_names_the_setting() -> None:
    verdict = verdict_of(fetching({"state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}))
    assert verdict.state == "failed" and "KUBERNETES_FETCH_IMAGE" in verdict.message


def test_unschedulable_pods_fail_only_after_the_grace_period() -> None:
    message = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    early = pod_problem(pod(conditions=unschedulable(message, minutes=1)), now=NOW, unschedulable_grace=120)
    assert early is not None and early.state == "waiting" and early.message == f"waiting for a node ({message})"
    late = pod_problem(pod(conditions=unschedulable(message, minutes=3)), now=NOW, unschedulable_grace=120)
    assert late is not None and late.state == "failed" and late.message.startswith("No node has the free GPU(s)")


def test_the_scheduler_message_is_explained_per_cause() -> None:
    mig = pod(limits={"memory": "4Gi", "nvidia.com/mig-1g.10gb": "1"})
    assert unschedulable_message(mig, "0/2 nodes are available: 2 Insufficient nvidia.com/mig-1g.10gb.").startswith(
        "No node has a free MIG slice 1g.10gb (1 wanted)")
    selected = pod(node_selector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    assert unschedulable_message(selected, "0/3 nodes are available: 3 node(s) didn't match Pod's node "
                                           "affinity/selector.").startswith(
        "No node has the label nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3")
    assert unschedulable_message(pod(), "0/3 nodes are available: 3 Insufficient memory.").startswith(
        "No node has enough memory free for it")
    assert "KUBERNETES_GPU_TOLERATIONS" in unschedulable_message(
        pod(), "0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: ml}.")
    assert unschedulable_message(pod(), "something new").startswith("Kubernetes cannot schedule Triton's pod")


def test_oomkilled_wins_over_the_crash_loop_it_causes() -> None:
    verdict = verdict_of(pod({"restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                              "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}},
                             limits={"memory": "8Gi"}))
    assert verdict.state == "failed" and "OOMKilled) at its limit of 8Gi" in verdict.message
    assert verdict.logs_pod == "digits-r2-0" and verdict.previous


def test_a_first_exit_fails_without_waiting_for_the_back_off() -> None:
    verdict = verdict_of(pod({"restartCount": 1, "state": {"running": {}},
                              "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}))
    assert verdict.state == "failed"
    assert verdict.message == "Triton exited with code 1 (pod digits-r2-0, 1 restart). Its last log lines say why:"


def test_an_evicted_pod_fails() -> None:
    verdict = verdict_of(pod(phase="Failed", reason="Evicted", message="The node was low on resource: memory."))
    assert verdict.message == ("Kubernetes stopped Triton's pod digits-r2-0 "
                               "(Evicted: The node was low on resource: memory.).")


def test_a_pod_being_deleted_is_ignored() -> None:
    going = pod({"state": {"waiting": {"reason": "ImagePullBackOff"}}})
    going["metadata"]["deletionTimestamp"] = "2026-11-29T11:59:00Z"
    assert verdict_of(going).state == "ready"


def test_health_needs_one_available_pod() -> None:
    assert health(deployment(available=1)) == (True, "")
    assert health(deployment(available=0)) == (False, "none of its 2 Triton pod(s) is ready")
    assert health(deployment(replicas=0, available=0)) == (False, "its Kubernetes Deployment was scaled to zero")
    assert health(None) == (False, "its Kubernetes Deployment is gone")
