"""A fake Kubernetes API server for tests: no real API server (nor kind, k3s or Docker) can run on this machine.

It speaks the REST paths and verbs the official `kubernetes` client sends (server-side apply as PATCH with
application/apply-patch+yaml and fieldManager, merge-patch of /scale, GET, LIST with labelSelector, LIST with
?watch=true streaming one JSON event per line, PUT with a resourceVersion precondition, DELETE, GET
pods/{name}/log), keeps objects in memory, and records every request, so tests can assert exactly what Modelport
sent. There are no controllers: a test hook (`on_apply`) plays the Deployment controller, scheduler and kubelet by
writing the status and pods it wants. `rbac()` plays the authorizer for a set of RBAC rules.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

TOKEN = "fake-token-for-tests"
MAX_WATCH_SECONDS = 10.0


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any = None

    @property
    def verb(self) -> str:
        if self.method == "GET" and self.query.get("watch") == "true":
            return "watch"
        return {"PATCH": "apply" if self.content_type == "application/apply-patch+yaml" else "patch",
                "PUT": "update"}.get(self.method, self.method.lower())


@dataclass
class _Event:
    rv: int
    collection: str
    type: str
    obj: dict[str, Any]


def _split(path: str) -> tuple[str, str | None, str | None]:
    """(collection path, object name, subresource) of an API path."""
    parts = [p for p in path.split("/") if p]
    head = parts[:2] if parts[0] == "api" else parts[:3]
    rest = parts[len(head):]
    if rest[:1] == ["namespaces"] and len(rest) <= 2:  # the namespaces themselves (cluster-scoped)
        collection = "/" + "/".join(head + rest[:1])
        return collection, (rest[1] if len(rest) == 2 else None), None
    collection = "/" + "/".join(head + rest[:3])
    name = rest[3] if len(rest) > 3 else None
    sub = rest[4] if len(rest) > 4 else None
    return collection, name, sub


def _matches(obj: dict[str, Any], selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


_LOG_TIME_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?Z ")


def now_iso(offset_seconds: float = 0) -> str:
    return datetime.fromtimestamp(time.time() + offset_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class FakeKube:
    token: str = TOKEN
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # object path -> object
    requests: list[Request] = field(default_factory=list)
    # (namespace, pod, previous) -> text; or (namespace, pod, container, previous) for one container of the pod
    logs: dict[tuple[Any, ...], str] = field(default_factory=dict)
    honour_limit_bytes: bool = True  # False: a server that sends the whole log whatever limitBytes says
    # Plays the controllers after each apply or scale of a Deployment: fn(fake, deployment).
    on_apply: Callable[[FakeKube, dict[str, Any]], None] | None = None
    # Runs when a watch starts (after the LIST it follows): lets a test change pods while Modelport waits.
    on_watch: Callable[[FakeKube], None] | None = None
    # The custom resources whose CRD is installed ("scaledobjects.keda.sh"): a request for another one of a group that
    # is not built in is answered 404, as an API server without that CRD does.
    custom_resources: set[str] = field(default_factory=set)
    # RBAC: a request for which this returns a message is answered 403 Forbidden with it.
    forbid: Callable[[Request], str | None] | None = None
    # (group, resource, verb) of every authorization `rbac()` made, and of those it refused.
    checked: set[tuple[str, str, str]] = field(default_factory=set)
    refused: set[tuple[str, str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._rv = 1
        self._events: list[_Event] = []
        self._cond = threading.Condition()
        fake = self

        class Handler(_Handler):
            kube = fake

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    # --- Life -----------------------------------------------------------------------------------------------

    def start(self) -> FakeKube:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "modelport", "user": {"token": self.token}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "modelport"}}],
            "current-context": "fake",
        }))
        return path

    # --- Store ----------------------------------------------------------------------------------------------

    def put(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store `obj` at `path` as the API server would (uid, resourceVersion, generation) and tell watchers."""
        with self._cond:
            old = self.objects.get(path)
            meta = obj.setdefault("metadata", {})
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            meta.setdefault("uid", (old or {}).get("metadata", {}).get("uid") or str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", (old or {}).get("metadata", {}).get("creationTimestamp") or now_iso())
            if "spec" in obj:
                old_generation = int((old or {}).get("metadata", {}).get("generation", 0))
                changed = old is None or old.get("spec") != obj.get("spec")
                meta["generation"] = old_generation + 1 if changed else old_generation
            self.objects[path] = obj
            self._events.append(_Event(self._rv, _split(path)[0], "MODIFIED" if old else "ADDED", copy.deepcopy(obj)))
            self._cond.notify_all()
            return obj

    def remove(self, path: str) -> dict[str, Any] | None:
        with self._cond:
            obj = self.objects.pop(path, None)
            if obj is not None:
                self._rv += 1
                self._events.append(_Event(self._rv, _split(path)[0], "DELETED", copy.deepcopy(obj)))
                self._cond.notify_all()
            return obj

    def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)

    def items(self, collection: str, selector: str = "") -> list[dict[str, Any]]:
        return [o for p, o in sorted(self.objects.items()) if _split(p)[0] == collection and p != collection
                and _matches(o, selector)]

    def sent(self, verb: str | None = None, kind: str | None = None) -> list[Request]:
        """Recorded requests, optionally of one verb ("apply", "patch", "get", "watch", "delete") or body kind."""
        return [r for r in self.requests if (verb is None or r.verb == verb)
                and (kind is None or (isinstance(r.body, dict) and r.body.get("kind") == kind))]

    def applied(self, kind: str) -> dict[str, Any]:
        """The last object of `kind` Modelport applied."""
        return self.sent("apply", kind)[-1].body  # type: ignore[no-any-return]

    def serves(self, path: str) -> bool:
        """Whether the API server knows `path`'s resource: every built-in group (core and *.k8s.io, and the groups
        without a dot), a custom resource only with its CRD installed (`custom_resources`)."""
        parts = [p for p in path.split("/") if p]
        if parts[:1] != ["apis"] or len(parts) < 2 or "." not in parts[1] or parts[1].endswith(".k8s.io"):
            return True
        rest = parts[3:]
        if rest[:1] == ["namespaces"] and len(rest) > 2:
            rest = rest[2:]
        return not rest or f"{rest[0]}.{parts[1]}" in self.custom_resources

    def _rv_now(self) -> int:
        return self._rv

    def events_after(self, collection: str, rv: int, selector: str) -> list[_Event]:
        return [e for e in self._events if e.rv > rv and e.collection == collection and _matches(e.obj, selector)]


class _Handler(BaseHTTPRequestHandler):
    kube: FakeKube
    protocol_version = "HTTP/1.1"
    # Headers and body leave in one segment, without Nagle's delay (else every request waits ~40 ms for an ACK).
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        return  # quiet

    # --- Plumbing -----------------------------------------------------------------------------------------------

    def _send(self, status: int, payload: Any, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _status(self, code: int, reason: str, message: str) -> None:
        self._send(code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "message": message, "reason": reason, "code": code})

    def _handle(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        content_type = (self.headers.get("Content-Type") or "").split(";")[0]
        body = yaml.safe_load(raw) if raw else None  # JSON is YAML: apply-patch+yaml bodies parse either way
        request = Request(self.command, url.path, query, content_type, body)
        self.kube.requests.append(request)
        if self.headers.get("Authorization") != f"Bearer {self.kube.token}":
            self._status(401, "Unauthorized", "Unauthorized")
            return
        refusal = self.kube.forbid(request) if self.kube.forbid else None
        if refusal:
            self._status(403, "Forbidden", refusal)
            return
        if not self.kube.serves(url.path):
            # What kube-apiserver sends for a group no CRD registered: a plain-text 404, no Status object.
            self._send(404, b"404 page not found\n", content_type="text/plain; charset=utf-8")
            return
        collection, name, sub = _split(url.path)
        path = f"{collection}/{name}" if name else collection
        if self.command == "GET" and name is None:
            if query.get("watch") == "true":
                self._watch(collection, query)
            else:
                self._list(collection, query)
        elif self.command == "GET" and sub == "log":
            self._log(collection, name or "", query)
        elif self.command == "GET":
            obj = self.kube.get(path)
            if obj is None:
                self._status(404, "NotFound", f'{collection.rsplit("/", 1)[-1]} "{name}" not found')
            else:
                self._send(200, obj)
        elif self.command == "PATCH" and content_type == "application/apply-patch+yaml":
            self._apply(path, query, body or {})
        elif self.command == "PATCH" and sub == "scale":
            self._scale(path, body or {})
        elif self.command == "PUT" and name is not None:
            self._replace(path, body or {})
        elif self.command == "DELETE":
            obj = self.kube.remove(path)
            if obj is None:
                self._status(404, "NotFound", f'"{name}" not found')
            else:
                self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                                 "details": {"name": name, "uid": obj["metadata"].get("uid")}})
        else:
            self._status(405, "MethodNotAllowed", f"{self.command} {url.path} is not supported by the fake")

    do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _handle

    # --- Verbs ---------------------------------------------------------------------------------------------------

    def _apply(self, path: str, query: dict[str, str], body: dict[str, Any]) -> None:
        if not query.get("fieldManager"):
            self._status(400, "BadRequest", "PATCH is missing the required fieldManager parameter")
            return
        old = self.kube.get(path)
        obj = copy.deepcopy(body)
        if old is not None:
            for key in ("uid", "creationTimestamp"):
                obj["metadata"][key] = old["metadata"][key]
            if "status" in old:
                obj["status"] = old["status"]
        if obj.get("kind") == "Deployment" and "replicas" not in obj["spec"]:
            # Nobody applied replicas: the field keeps its value (1 when the Deployment is created).
            obj["spec"]["replicas"] = old["spec"].get("replicas", 1) if old else 1
        self.kube.put(path, obj)
        if obj.get("kind") == "Deployment" and self.kube.on_apply:
            self.kube.on_apply(self.kube, obj)
        self._send(200, self.kube.get(path))

    def _replace(self, path: str, body: dict[str, Any]) -> None:
        old = self.kube.get(path)
        if old is None:
            self._status(404, "NotFound", f'"{path.rsplit("/", 1)[-1]}" not found')
            return
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            self._status(409, "Conflict", "the object has been modified; please apply your changes to the latest "
                                          "version and try again")
            return
        obj = copy.deepcopy(body)
        for key in ("uid", "creationTimestamp"):
            obj["metadata"][key] = old["metadata"][key]
        obj["metadata"].pop("resourceVersion", None)
        self.kube.put(path, obj)
        self._send(200, self.kube.get(path))

    def _scale(self, path: str, body: dict[str, Any]) -> None:
        obj = self.kube.get(path)
        if obj is None:
            self._status(404, "NotFound", f'deployments.apps "{path.rsplit("/", 1)[-1]}" not found')
            return
        obj = copy.deepcopy(obj)
        obj["spec"]["replicas"] = body["spec"]["replicas"]
        self.kube.put(path, obj)
        if self.kube.on_apply:
            self.kube.on_apply(self.kube, obj)
        self._send(200, {"kind": "Scale", "apiVersion": "autoscaling/v1",
                         "metadata": {"name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"]},
                         "spec": {"replicas": obj["spec"]["replicas"]}})

    def _list(self, collection: str, query: dict[str, str]) -> None:
        items = self.kube.items(collection, query.get("labelSelector", ""))
        self._send(200, {"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": str(self.kube._rv_now())},
                         "items": items})

    def _log(self, collection: str, pod: str, query: dict[str, str]) -> None:
        namespace = collection.split("/")[-2]
        previous = query.get("previous") == "true"
        # A container's own log where a test set one ((namespace, pod, container, previous)), else the pod's.
        text = self.kube.logs.get((namespace, pod, query.get("container", ""), previous))
        if text is None:
            text = self.kube.logs.get((namespace, pod, previous))
        if text is None:
            if previous:
                self._status(400, "BadRequest", f'previous terminated container "triton" in pod "{pod}" not found')
            else:
                self._status(404, "NotFound", f'pods "{pod}" not found')
            return
        lines = text.splitlines(keepends=True)
        if query.get("timestamps") != "true":
            # As the kubelet, which keeps each line's time: a test's line that starts with one is sent without it
            # unless asked for.
            lines = [_LOG_TIME_RE.sub("", line, count=1) for line in lines]
        tail = int(query.get("tailLines", len(lines)))
        body = "".join(lines[-tail:] if tail else []).encode()
        if "limitBytes" in query and self.kube.honour_limit_bytes:
            # as the kubelet: the first limitBytes bytes of the tail
            body = body[:int(query["limitBytes"])]
        self._send(200, body, "text/plain")

    def _watch(self, collection: str, query: dict[str, str]) -> None:
        rv = int(query.get("resourceVersion") or 0)
        selector = query.get("labelSelector", "")
        deadline = time.monotonic() + min(float(query.get("timeoutSeconds", MAX_WATCH_SECONDS)), MAX_WATCH_SECONDS)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if self.kube.on_watch:
            self.kube.on_watch(self.kube)
        try:
            while True:
                with self.kube._cond:
                    events = self.kube.events_after(collection, rv, selector)
                    if not events:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self.kube._cond.wait(remaining)
                        continue
                for event in events:
                    line = json.dumps({"type": event.type, "object": event.obj}).encode() + b"\n"
                    self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                    self.wfile.flush()
                    rv = event.rv
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
        self.close_connection = True


# --- Playing the authorizer --------------------------------------------------------------------------------------


def permissions(fake: FakeKube, request: Request) -> set[tuple[str, str, str, str | None]]:
    """What RBAC checks for `request`: (API group, resource[/subresource], verb, namespace or None).

    Server-side apply is a "patch", and also a "create" when the object does not exist yet."""
    parts = [p for p in request.path.split("/") if p]
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    namespace = None
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {"GET": "get" if named else "list", "DELETE": "delete", "PUT": "update", "PATCH": "patch"}[request.method]
    if request.verb == "watch":
        verb = "watch"
    checks = {(group, resource, verb, namespace)}
    if request.verb == "apply" and fake.get(request.path) is None:
        checks.add((group, resource, "create", namespace))
    return checks


def rbac(fake: FakeKube, rules: list[dict[str, Any]], namespaces: set[str] | None) -> Callable[[Request], str | None]:
    """An authorizer granting `rules` in `namespaces` (a Role bound there), or everywhere when None (a
    ClusterRole with a ClusterRoleBinding). Every check is recorded in `fake.checked`, refusals in `fake.refused`."""
    granted = {(group, resource, verb) for rule in rules for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    fake.checked, fake.refused = set(), set()

    def forbid(request: Request) -> str | None:
        for group, resource, verb, namespace in sorted(permissions(fake, request), key=str):
            fake.checked.add((group, resource, verb))
            in_scope = namespaces is None or (namespace is not None and namespace in namespaces)
            if not in_scope or (group, resource, verb) not in granted:
                fake.refused.add((group, resource, verb))
                where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
                return (f'User "system:serviceaccount:modelport:modelport" cannot {verb} resource '
                        f'"{resource}" in API group "{group}"{where}')
        return None

    return forbid


# --- Playing the controllers -------------------------------------------------------------------------------------


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}"


def make_pod(deployment: dict[str, Any], suffix: str, status: dict[str, Any]) -> dict[str, Any]:
    """A pod of the Deployment's current template (its labels and spec), with `status`."""
    template = deployment["spec"]["template"]
    revision = template["metadata"]["labels"].get("modelport.io/revision", "0")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{deployment['metadata']['name']}-r{revision}-{suffix}",
                     "namespace": deployment["metadata"]["namespace"],
                     "labels": dict(template["metadata"]["labels"])},
        "spec": copy.deepcopy(template["spec"]),
        "status": status,
    }


def ready_status() -> dict[str, Any]:
    return {
        "phase": "Running",
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
        "containerStatuses": [{"name": "triton", "ready": True, "restartCount": 0,
                               "state": {"running": {"startedAt": now_iso()}}}],
    }


def loading_status() -> dict[str, Any]:
    return {
        "phase": "Running",
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "triton", "ready": False, "restartCount": 0,
                               "state": {"running": {"startedAt": now_iso()}}}],
    }


def image_pull_status(image: str) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [{"name": "triton", "ready": False, "restartCount": 0, "image": image, "state": {
            "waiting": {"reason": "ImagePullBackOff",
                        "message": f'Back-off pulling image "{image}": ErrImagePull: failed to pull and unpack '
                                   f'image "{image}": not found'}}}],
    }


def unschedulable_status(message: str, since_seconds: float = 600) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                        "lastTransitionTime": now_iso(-since_seconds)}],
    }


def oom_status() -> dict[str, Any]:
    return {
        "phase": "Running",
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "triton", "ready": False, "restartCount": 2,
                               "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}},
                               "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}],
    }


def crash_loop_status(restarts: int = 3, exit_code: int = 1) -> dict[str, Any]:
    return {
        "phase": "Running",
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "triton", "ready": False, "restartCount": restarts,
                               "state": {"waiting": {"reason": "CrashLoopBackOff",
                                                     "message": "back-off 40s restarting failed container"}},
                               "lastState": {"terminated": {"reason": "Error", "exitCode": exit_code}}}],
    }


def _replace_pods(fake: FakeKube, deployment: dict[str, Any], pods: list[dict[str, Any]]) -> None:
    namespace = deployment["metadata"]["namespace"]
    instance = deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"]
    for old in fake.items(f"/api/v1/namespaces/{namespace}/pods", f"app.kubernetes.io/instance={instance}"):
        fake.remove(pod_path(namespace, old["metadata"]["name"]))
    for pod in pods:
        fake.put(pod_path(namespace, pod["metadata"]["name"]), pod)


def set_deployment_status(fake: FakeKube, deployment: dict[str, Any], *, updated: int, available: int,
                          replicas: int | None = None, conditions: list[dict[str, Any]] | None = None) -> None:
    path = (f"/apis/apps/v1/namespaces/{deployment['metadata']['namespace']}/deployments/"
            f"{deployment['metadata']['name']}")
    obj = copy.deepcopy(fake.get(path) or deployment)
    obj["status"] = {
        "observedGeneration": obj["metadata"]["generation"],
        "replicas": updated if replicas is None else replicas,
        "updatedReplicas": updated,
        "readyReplicas": available,
        "availableReplicas": available,
        "conditions": conditions or [],
    }
    with fake._cond:  # status is a subresource: no generation bump, but watchers hear of it
        obj["metadata"]["resourceVersion"] = str(fake._rv + 1)
        fake._rv += 1
        fake.objects[path] = obj
        fake._cond.notify_all()


def rollout_succeeds(fake: FakeKube, deployment: dict[str, Any]) -> None:
    """The controllers bring up every replica of the new template, ready, and remove the old pods."""
    replicas = int(deployment["spec"].get("replicas", 1))
    _replace_pods(fake, deployment, [make_pod(deployment, str(i), ready_status()) for i in range(replicas)])
    set_deployment_status(fake, deployment, updated=replicas, available=replicas, conditions=[
        {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
        {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}])


def pod_stays(status: dict[str, Any]) -> Callable[[FakeKube, dict[str, Any]], None]:
    """A controller whose new pod stays in `status` (zero replicas available)."""

    def controller(fake: FakeKube, deployment: dict[str, Any]) -> None:
        if not deployment["spec"].get("replicas"):
            _replace_pods(fake, deployment, [])
            set_deployment_status(fake, deployment, updated=0, available=0)
            return
        _replace_pods(fake, deployment, [make_pod(deployment, "0", copy.deepcopy(status))])
        set_deployment_status(fake, deployment, updated=1, available=0, conditions=[
            {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}])

    return controller


def fetch_failed_status(exit_code: int, restarts: int = 2) -> dict[str, Any]:
    """The init container that fetches the repository keeps exiting with `exit_code`; Triton never starts."""
    return {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "False"}],
        "initContainerStatuses": [{"name": "fetch-repository", "ready": False, "restartCount": restarts,
                                   "state": {"waiting": {"reason": "CrashLoopBackOff",
                                                         "message": "back-off 40s restarting failed container"}},
                                   "lastState": {"terminated": {"reason": "Error", "exitCode": exit_code}}}],
        "containerStatuses": [{"name": "triton", "ready": False, "restartCount": 0,
                               "state": {"waiting": {"reason": "PodInitializing"}}}],
    }


def mounted_access(fake: FakeKube, pod: dict[str, Any]) -> dict[str, Any] | None:
    """What the kubelet mounts into the pod's init container when it starts: the current content of the Secret
    its repository-access volume names (decoded manifest.json), or None when that Secret does not exist."""
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "repository-access"]
    namespace = pod["metadata"]["namespace"]
    secret = fake.get(f"/api/v1/namespaces/{namespace}/secrets/{volume['secret']['secretName']}")
    if secret is None:
        return None
    return json.loads(base64.b64decode(secret["data"]["manifest.json"]))  # type: ignore[no-any-return]
