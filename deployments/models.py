from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.fields.json import KeyTransform
from django.db.models.query_utils import DeferredAttribute
from django.utils import timezone

from accounts.models import Team
from deployments import logtail
from deployments.launch import Launch, LaunchEncoder
from deployments.revision_spec import RevisionSpec, SpecEncoder
from infra.names import validate_name
from models_registry.models import ModelVersion

# What ends a canary: its revision, route and launch (the guardrails stay as they were set, for the record). Here
# rather than in actions.py: the reconciler ends canaries too, and it sits below the actions.
NO_CANARY: dict[str, Any] = {"canary_revision": None, "canary_percent": 0, "canary_upstream_url": "",
                             "canary_grpc_upstream": "", "canary_launch": None, "canary_deadline": None,
                             "canary_serving_since": None}


def bounded_message(text: str) -> str:
    """What a status or an event keeps of `text`: an excerpt of at most LOG_EXCERPT_MAX_CHARS, since a runtime's
    message may carry what a model wrote (Triton's errors, a pod's log, pip's output). Compare with this, not with
    the text itself, to tell whether a status changed."""
    return logtail.excerpt(text, settings.LOG_EXCERPT_MAX_CHARS)


class _LaunchAttribute(DeferredAttribute):
    """A launch column is a Launch or None whatever it was given (a Launch, or its JSON in tests and old rows)."""

    def __set__(self, instance: models.Model, value: Any) -> None:
        instance.__dict__[self.field.attname] = Launch.from_json(value)


class LaunchField(models.JSONField):
    """A JSON column read and written as a deployments.launch.Launch, parsed here only (as RevisionSpecField is
    for the spec): a row that holds no Launch (null, or what an older version wrote) reads as None."""

    descriptor_class = _LaunchAttribute

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("null", True)
        kwargs.setdefault("blank", True)
        kwargs.setdefault("encoder", LaunchEncoder)
        super().__init__(*args, **kwargs)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        data = super().from_db_value(value, expression, connection)
        if isinstance(expression, KeyTransform):  # serving_launch__url etc.: a part of it, as JSON
            return data
        return Launch.from_json(data)

    def value_from_object(self, obj: models.Model) -> Any:
        value = super().value_from_object(obj)
        return value.to_json() if isinstance(value, Launch) else value


class Deployment(models.Model):
    class Runtime(models.TextChoices):
        LOCAL = "local", "Local Triton process"
        KUBERNETES = "kubernetes", "Kubernetes cluster"

    class Desired(models.TextChoices):
        RUNNING = "running"
        STOPPED = "stopped"
        DELETED = "deleted"  # being torn down; the reconciler removes the row when everything is gone

    class Status(models.TextChoices):
        PENDING = "pending"
        RENDERING = "rendering"
        # Installing a python model's requirements (deployments/pyenvs.py) before Triton can start.
        BUILDING = "building"
        STARTING = "starting"
        READY = "ready"
        FAILED = "failed"
        STOPPING = "stopping"
        STOPPED = "stopped"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="deployments")
    name = models.CharField(max_length=63, validators=[validate_name])
    runtime = models.CharField(max_length=16, choices=Runtime.choices, default=Runtime.LOCAL)
    desired_state = models.CharField(max_length=16, choices=Desired.choices, default=Desired.RUNNING)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    status_message = models.TextField(blank=True)
    # The revision the user asked for last; the reconciler rolls the servers toward it.
    revision = models.ForeignKey("Revision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # What the gateway routes to: switched in one UPDATE once a revision's server is ready (zero-downtime rollout).
    serving_revision = models.ForeignKey("Revision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    upstream_url = models.CharField(max_length=255, blank=True)
    # The same server's gRPC endpoint (host:port) for the gRPC gateway, switched in the same UPDATE.
    grpc_upstream = models.CharField(max_length=255, blank=True)
    # What the reconciler (deployments/reconcile.py) recorded between its ticks: the launch that serves (at
    # upstream_url), and the one starting for `revision` until `launch_deadline`.
    serving_launch = LaunchField()
    launch = LaunchField()
    launch_deadline = models.DateTimeField(null=True, blank=True)
    # After a switch, servers of other revisions keep answering the requests routed to them until then.
    drain_until = models.DateTimeField(null=True, blank=True)
    # A reconciler holds the deployment while it takes a step (a conditional update): seconds, not minutes.
    lease_until = models.DateTimeField(null=True, blank=True)
    # When the reconcile task waiting for this deployment is due (None: none waits): at most one waits per
    # deployment, so a burst of changes costs one rollout and the queue stays short (deployments/tasks.py).
    reconcile_due_at = models.DateTimeField(null=True, blank=True)
    # Outgoing connections from its sandbox (local runtime; SANDBOX_EGRESS_PORTS). Only an operator sets it, in the
    # admin console: a team's code could otherwise reach anything the portal's machine reaches.
    allow_egress = models.BooleanField(
        default=False, help_text="Let this deployment's models open outgoing connections (to the ports in "
                                 "SANDBOX_EGRESS_PORTS). Takes effect by restarting its Triton.")
    # A canary rollout (deployments/canary.py): a revision served beside `serving_revision`, taking
    # `canary_percent` of the requests once its launch is ready (its route: the canary upstreams), until it is
    # promoted (it becomes the serving revision in one UPDATE) or rolled back (by a user or by its guardrails).
    canary_revision = models.ForeignKey("Revision", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    canary_percent = models.PositiveSmallIntegerField(default=0)
    canary_upstream_url = models.CharField(max_length=255, blank=True)
    canary_grpc_upstream = models.CharField(max_length=255, blank=True)
    canary_launch = LaunchField()
    canary_deadline = models.DateTimeField(null=True, blank=True)
    canary_serving_since = models.DateTimeField(null=True, blank=True)
    # Its guardrails, compared with the stable revision over the window (defaults: docs/api.md, canary.py).
    canary_max_error_rate = models.FloatField(default=0.05)
    canary_max_p99_ratio = models.FloatField(default=2.0)
    canary_window_seconds = models.PositiveIntegerField(default=120)
    canary_min_requests = models.PositiveIntegerField(default=100)
    canary_auto_promote = models.BooleanField(default=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    status_changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="deployment_name_unique_per_team")]

    def __str__(self) -> str:
        return f"{self.team}/{self.name}"

    @property
    def endpoint(self) -> str:
        return f"/serve/{self.name}"

    @property
    def is_transitional(self) -> bool:
        return self.status in (self.Status.PENDING, self.Status.RENDERING, self.Status.BUILDING, self.Status.STARTING,
                               self.Status.STOPPING)

    def can_start(self) -> bool:
        return self.desired_state == self.Desired.STOPPED

    def can_stop(self) -> bool:
        return self.desired_state == self.Desired.RUNNING

    def claim(self, seconds: float) -> bool:
        """Take the reconciler's lease; False when another worker holds it."""
        now = timezone.now()
        until = now + timedelta(seconds=seconds)
        claimed = (
            Deployment.objects.filter(pk=self.pk)
            .filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
            .update(lease_until=until)
        )
        if claimed:
            self.lease_until = until
        return claimed == 1

    def release(self) -> None:
        Deployment.objects.filter(pk=self.pk).update(lease_until=None)

    def advance(self, status: str, message: str, **fields: Any) -> bool:
        """set_status() for the reconciler: only if nobody changed what it read (the desired state, the revision
        asked for, the status). False when a user did meanwhile; the next tick acts on that instead."""
        message = bounded_message(message)
        changed_at = timezone.now()
        same_revision = Q(revision_id=self.revision_id) if self.revision_id is not None else Q(revision__isnull=True)
        done = Deployment.objects.filter(
            same_revision, pk=self.pk, status=self.status, desired_state=self.desired_state,
        ).update(status=status, status_message=message, status_changed_at=changed_at, **fields)
        if done:
            self.status, self.status_message, self.status_changed_at = status, message, changed_at
            for key, value in fields.items():
                setattr(self, key, value)
        return done == 1

    def set_status(self, status: str, message: str = "", **fields: Any) -> None:
        message = bounded_message(message)
        self.status = status
        self.status_message = message
        self.status_changed_at = timezone.now()
        for key, value in fields.items():
            setattr(self, key, value)
        Deployment.objects.filter(pk=self.pk).update(
            status=status, status_message=message, status_changed_at=self.status_changed_at, **fields
        )


class _SpecAttribute(DeferredAttribute):
    """`revision.spec` is a RevisionSpec whatever it was given (a RevisionSpec, or its JSON in tests and fixtures)."""

    def __set__(self, instance: models.Model, value: Any) -> None:
        instance.__dict__[self.field.attname] = RevisionSpec.coerce(value) if value is not None else None


class RevisionSpecField(models.JSONField):
    """A JSON column read and written as a RevisionSpec, through its from_json and to_json only."""

    descriptor_class = _SpecAttribute

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("encoder", SpecEncoder)
        super().__init__(*args, **kwargs)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        data = super().from_db_value(value, expression, connection)
        if data is None or isinstance(expression, KeyTransform):  # spec__models etc.: a part of it, as JSON
            return data
        return RevisionSpec.from_json(data)

    def value_from_object(self, obj: models.Model) -> Any:
        value = super().value_from_object(obj)
        return value.to_json() if isinstance(value, RevisionSpec) else value


class Revision(models.Model):
    """A snapshot of a deployment's spec; every change of what it serves makes a new one. Its one field changed in
    place is a shared revision's idle time (placement.idle_unload_seconds, actions.update_deployment): how long a
    pool keeps the models loaded unused, which changes nothing of the model repository it serves."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    spec = RevisionSpecField()
    versions = models.ManyToManyField(ModelVersion, related_name="revisions")
    repository = models.CharField(max_length=500, blank=True)  # where it was rendered (a path or an s3:// URL)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["deployment", "-number"]
        constraints = [models.UniqueConstraint(fields=["deployment", "number"], name="revision_number_unique")]

    def __str__(self) -> str:
        return f"{self.deployment} r{self.number}"


class Event(models.Model):
    class Kind(models.TextChoices):
        INFO = "info"
        WARNING = "warning"
        ERROR = "error"

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="events")
    time = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.INFO)
    message = models.TextField()
    # An event that comes again and again (a shared model unloaded while idle, loaded again for a request): one row
    # per run of them, counted, its time the latest (deployments/events.py, record_repeated). "" for the others.
    reason = models.CharField(max_length=32, blank=True)
    count = models.PositiveIntegerField(default=1)
    first_time = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-time", "-id"]

    def __str__(self) -> str:
        return f"{self.time:%H:%M:%S} {self.kind}: {self.message[:60]}"


class TritonServer(models.Model):
    """A local Triton process, tracked so that it survives (and is adopted after) a restart of the web server or
    worker instead of being started twice."""

    class State(models.TextChoices):
        STARTING = "starting"
        READY = "ready"
        STOPPED = "stopped"

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="servers")
    revision = models.ForeignKey(Revision, on_delete=models.CASCADE, related_name="servers")
    pid = models.IntegerField()
    http_port = models.IntegerField()
    grpc_port = models.IntegerField()
    metrics_port = models.IntegerField()
    log_path = models.CharField(max_length=500)
    state = models.CharField(max_length=16, choices=State.choices, default=State.STARTING)
    started_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)
    # How it runs (modelport.core.sandbox): confined or not, and why not or what is weaker than designed.
    sandboxed = models.BooleanField(default=False)
    sandbox_note = models.TextField(blank=True)
    sandbox_id = models.CharField(max_length=64, blank=True)  # names its scratch directory and cgroup
    cgroups = models.JSONField(default=list, blank=True)  # its cgroup directories ([]: no resource limits)
    allow_egress = models.BooleanField(default=False)  # what it was started with
    # The key of Triton's admin APIs (model repository, logging, trace, shared memory) on this server.
    admin_key = models.CharField(max_length=64, blank=True)

    class Meta:
        ordering = ["-started_at"]
        verbose_name = "Triton server"  # the product's name, not Django's "triton server"

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.deployment} r{self.revision.number})"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


# Shared servers' rows live in their own module (issue 24); imported here so that Django finds them, and re-exported
# (`X as X`) for the modules that import them from here.
from deployments.pool_models import ModelMemory as ModelMemory  # noqa: E402
from deployments.pool_models import Pool as Pool  # noqa: E402
from deployments.pool_models import PoolLoad as PoolLoad  # noqa: E402
from deployments.pool_models import PoolPod as PoolPod  # noqa: E402
from deployments.pool_models import PoolServer as PoolServer  # noqa: E402
