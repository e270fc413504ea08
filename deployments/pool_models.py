"""Shared servers (issue 24): pools of Triton servers that many deployments' models are loaded into on demand.

The rows: a `Pool` is the operator's (a runtime, a memory budget, which teams may use it); a `PoolServer` is one of
its Triton processes on this machine (the local runtime runs one per pool); a `PoolLoad` is one revision's models
in a pool (loaded, unloaded while idle, failed), and `ModelMemory` what a model version was measured to take when
it loaded (per machine), from which "fits N more" is computed. Imported by deployments.models, so that Django
finds them; the logic lives in deployments/pools.py and deployments/runtimes/local/pool.py.
"""

from __future__ import annotations

import re
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from accounts.models import Team
from infra.names import validate_name

SHARED_POOL = "shared"  # the built-in pool on the local runtime, open to every team
_MIG_PROFILE_RE = re.compile(r"[1-7]g\.[0-9]{1,3}gb(\+me)?")


def validate_mig_profile(value: str) -> None:
    if value and not _MIG_PROFILE_RE.fullmatch(value):
        raise ValidationError(f"{value!r} is not a MIG profile such as 1g.10gb or 3g.40gb")


class GpuShare(models.TextChoices):
    """How a pool's pods get GPUs on a cluster. Each holds a different promise; `isolation_label` says which."""

    NONE = "none", "No GPU (CPU only)"
    WHOLE = "whole", "Whole GPUs (nvidia.com/gpu)"
    MIG = "mig", "MIG slices (nvidia.com/mig-<profile>)"
    TIME_SLICED = "time_sliced", "Time-sliced GPUs (device plugin sharing replicas)"
    MPS = "mps", "MPS shares (device plugin MPS sharing)"
    HAMI = "hami", "Memory-capped fractions (HAMi nvidia.com/gpumem, nvidia.com/gpucores)"


# The node label NVIDIA's GPU feature discovery sets to the device plugin's sharing strategy of the node's GPUs:
# a time-sliced or MPS pool's pods go only where the GPUs are shared so (else nvidia.com/gpu is a whole GPU).
SHARING_STRATEGY_LABEL = "nvidia.com/gpu.sharing-strategy"
# Whole GPUs go only where they are not shared: on a time-sliced or MPS node an nvidia.com/gpu is a share, and
# "isolated" would be false.
SHARING_STRATEGIES = {GpuShare.WHOLE: "none", GpuShare.TIME_SLICED: "time-slicing", GpuShare.MPS: "mps"}


def gpu_requests(share: str, count: int, mig_profile: str = "", memory_mib: int = 0,
                 cores_percent: int = 0) -> dict[str, str]:
    if share == GpuShare.NONE or count <= 0:
        return {}
    if share == GpuShare.MIG:
        return {f"nvidia.com/mig-{mig_profile}": str(count)}
    if share == GpuShare.HAMI:
        found = {"nvidia.com/gpu": str(count), "nvidia.com/gpumem": str(memory_mib)}
        if cores_percent:
            found["nvidia.com/gpucores"] = str(cores_percent)
        return found
    # Whole, time-sliced and MPS: the device plugin advertises each share as an nvidia.com/gpu.
    return {"nvidia.com/gpu": str(count)}


def isolation_label(share: str, count: int, mig_profile: str = "", memory_mib: int = 0, cores_percent: int = 0,
                    gpu_type: str = "") -> str:
    of = f" {gpu_type}" if gpu_type else ""
    if share == GpuShare.NONE:
        return "CPU only: no GPU"
    if share == GpuShare.WHOLE:
        return f"{count} whole{of} GPU(s) per pod: memory and faults isolated from other pods"
    if share == GpuShare.MIG:
        return (f"{count} MIG slice(s) {mig_profile}{of} per pod: memory and compute isolated in hardware from other "
                "slices")
    if share == GpuShare.TIME_SLICED:
        return (f"{count} time-sliced share(s) of a{of} GPU per pod: no memory isolation and no fault isolation "
                "(pods on the GPU take turns and one can use up its memory)")
    if share == GpuShare.MPS:
        return (f"{count} MPS share(s) of a{of} GPU per pod: memory and compute capped per share, no fault "
                "isolation (one client's GPU error can stop the others on the GPU)")
    cores = f", {cores_percent}% of its cores" if cores_percent else ", its cores shared"
    return (f"{count} HAMi fraction(s) of a{of} GPU per pod: {memory_mib} MiB of GPU memory{cores}, capped in "
            "software (HAMi's CUDA interception), no hardware or fault isolation")


class Pool(models.Model):
    class Runtime(models.TextChoices):
        LOCAL = "local", "Local Triton process"
        KUBERNETES = "kubernetes", "Kubernetes cluster"

    name = models.CharField(max_length=63, unique=True, validators=[validate_name])
    runtime = models.CharField(max_length=16, choices=Runtime.choices, default=Runtime.LOCAL)
    memory_budget_bytes = models.BigIntegerField(help_text="What the models loaded in it may take together, as "
                                                           "measured when each loads.")
    # None: every team may use it, and then it serves only what cannot execute code (docs/pools.md).
    team = models.ForeignKey(Team, null=True, blank=True, on_delete=models.CASCADE, related_name="pools",
                             help_text="Empty: open to every team (ONNX only). A team: that team's own pool, where "
                                       "python models, TorchScript and SavedModels may go too.")
    idle_unload_seconds = models.PositiveIntegerField(default=600, help_text=(
        "A model unused this long is unloaded (its next request loads it again); 0: never unload."))
    # On a cluster (runtime kubernetes): what each of the pool's Triton pods gets of the GPUs (docs/pools.md,
    # "GPU share classes"), how many pods, and what Triton may load on each GPU.
    gpu_share = models.CharField(max_length=16, choices=GpuShare.choices, default=GpuShare.NONE, help_text=(
        "What each pod of the pool gets of the GPUs, and so how far it is isolated from the other pods on them."))
    gpus = models.PositiveSmallIntegerField(default=0, help_text=(
        "Per pod: whole GPUs, MIG slices, time-sliced or MPS shares (the device plugin's replicas), or HAMi "
        "virtual GPUs, as the share class says; 0 with a GPU class counts as 1."))
    mig_profile = models.CharField(max_length=32, blank=True, validators=[validate_mig_profile], help_text=(
        "With MIG: the profile, as in nvidia.com/mig-<profile> (1g.10gb, 3g.40gb, ...)."))
    gpu_memory_mib = models.PositiveIntegerField(default=0, help_text=(
        "With HAMi: the GPU memory each pod may use, in MiB (nvidia.com/gpumem): 8192 is half a 16 GB T4."))
    gpu_cores_percent = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(100)], help_text=(
        "With HAMi: the share of the GPU's cores each pod may use, in percent (nvidia.com/gpucores); 0: no cap."))
    gpu_type = models.CharField(max_length=63, blank=True, help_text=(
        "The GPU model the pods need (a node label value, mapped through KUBERNETES_GPU_TYPES), e.g. tesla-t4."))
    gpu_load_fraction = models.DecimalField(max_digits=3, decimal_places=2, null=True, blank=True, validators=[
        MinValueValidator(Decimal("0.01")), MaxValueValidator(Decimal("1"))], help_text=(
        "What the pool's models may take of each GPU's memory when they load (Triton's --model-load-gpu-limit); "
        "empty: no limit."))
    min_replicas = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)], help_text=(
        "Pods of the pool's Triton (on a cluster); every model loaded in the pool is loaded in each."))
    max_replicas = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)], help_text=(
        "Above min_replicas: a HorizontalPodAutoscaler on CPU between the two."))
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def open_to_all(self) -> bool:
        return self.team_id is None

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.max_replicas < self.min_replicas:
            errors["max_replicas"] = "at least min_replicas"
        if self.gpu_share != GpuShare.NONE and self.runtime != self.Runtime.KUBERNETES:
            errors["gpu_share"] = "GPU share classes are for pools on the kubernetes runtime"
        if self.gpu_share == GpuShare.MIG and not self.mig_profile:
            errors["mig_profile"] = "a MIG pool needs its profile, e.g. 1g.10gb"
        if self.gpu_share != GpuShare.MIG and self.mig_profile:
            errors["mig_profile"] = "only for the MIG share class"
        if self.gpu_share == GpuShare.HAMI and not self.gpu_memory_mib:
            errors["gpu_memory_mib"] = "a HAMi pool needs its GPU memory per pod, e.g. 8192 for half a T4"
        if self.gpu_share != GpuShare.HAMI and (self.gpu_memory_mib or self.gpu_cores_percent):
            errors["gpu_memory_mib"] = "GPU memory and cores caps are for the HAMi share class"
        if self.gpu_share == GpuShare.NONE and (self.gpus or self.gpu_type or self.gpu_load_fraction):
            errors["gpu_share"] = "choose a GPU share class for a pool with GPUs"
        if errors:
            raise ValidationError(errors)

    @property
    def gpu_count(self) -> int:
        return 0 if self.gpu_share == GpuShare.NONE else max(1, self.gpus)

    def gpu_requests(self) -> dict[str, str]:
        """The extended resources each pod of the pool requests (and is limited to), as its share class says."""
        return gpu_requests(self.gpu_share, self.gpu_count, self.mig_profile, self.gpu_memory_mib,
                            self.gpu_cores_percent)

    @property
    def isolation(self) -> str:
        """What the share class isolates, said honestly (the pools API and the deploy form show it)."""
        return isolation_label(self.gpu_share, self.gpu_count, self.mig_profile, self.gpu_memory_mib,
                               self.gpu_cores_percent, self.gpu_type)


class PoolServer(models.Model):
    """A pool's Triton process (explicit model control), tracked so that a restarted worker adopts it."""

    class State(models.TextChoices):
        RUNNING = "running"
        STOPPED = "stopped"

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="servers")
    pid = models.IntegerField()
    http_port = models.IntegerField()
    grpc_port = models.IntegerField()
    metrics_port = models.IntegerField()
    log_path = models.CharField(max_length=500)
    admin_key = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    sandboxed = models.BooleanField(default=False)
    sandbox_id = models.CharField(max_length=64, blank=True)
    cgroups = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)
    # Since when no deployment has had models in it (set and cleared by the pool's periodic task): stopped once
    # that is POOL_EMPTY_SERVER_STOP_SECONDS ago.
    empty_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"pool {self.pool_id} pid {self.pid}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


class PoolPod(models.Model):
    """A pod of a cluster pool's Triton as the worker last saw it (deployments/runtimes/kubernetes/pool_restarts.py):
    the restart count of its `triton` container, so that each restart is told to the pool's deployments once, and
    the loads that were loaded when it restarted, told again once its agent has loaded them back."""

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="pods")
    name = models.CharField(max_length=253)
    restart_count = models.PositiveIntegerField(default=0)
    # The ids of the PoolLoad rows loaded when it restarted (or went away) and not yet loaded back.
    reloading = models.JSONField(default=list, blank=True)
    gone = models.BooleanField(default=False)  # Kubernetes stopped the pod (evicted, say): a new one replaces it
    seen_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pool", "name"], name="pool_pod_unique_per_pool")]

    def __str__(self) -> str:
        return f"pod {self.name} of pool {self.pool_id}"


class PoolLoad(models.Model):
    """One revision's models in a pool, under names unique to the deployment and revision."""

    class State(models.TextChoices):
        LOADING = "loading"  # asked for; loaded by the next look (the reconciler, or a request)
        LOADED = "loaded"
        UNLOADED = "unloaded"  # idle or evicted: the next request loads it again
        FAILED = "failed"

    pool = models.ForeignKey(Pool, on_delete=models.CASCADE, related_name="loads")
    deployment = models.ForeignKey("deployments.Deployment", on_delete=models.CASCADE, related_name="pool_loads")
    revision = models.ForeignKey("deployments.Revision", on_delete=models.CASCADE, related_name="pool_loads")
    server = models.ForeignKey(PoolServer, null=True, blank=True, on_delete=models.SET_NULL, related_name="loads")
    state = models.CharField(max_length=16, choices=State.choices, default=State.LOADING)
    message = models.TextField(blank=True)
    idle_unload_seconds = models.PositiveIntegerField(default=0)
    memory_bytes = models.BigIntegerField(default=0)  # measured at its last load
    # While a load of it is under way (Triton loading, no pool lock held): what it reserved, counted against the
    # pool's budget and its team's share beside the loaded ones, so that two teams' loads side by side never
    # together pass the budget. 0 otherwise.
    reserved_bytes = models.BigIntegerField(default=0)
    loaded_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    cold_start_seconds = models.FloatField(null=True, blank=True)  # the last load's time
    # When a request asked for it again after an idle unload, on a cluster: the worker loads it through the agents
    # and counts the cold start from here (what the held caller waited, the kubelet's sync of the Secret included).
    woken_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pool", "revision"], name="pool_load_unique_per_revision")]

    def __str__(self) -> str:
        return f"{self.revision} in {self.pool_id} ({self.state})"


class ModelMemory(models.Model):
    """What a model version took when it loaded in a pool, on a machine (its fingerprint)."""

    version = models.ForeignKey("models_registry.ModelVersion", on_delete=models.CASCADE, related_name="memory")
    fingerprint = models.CharField(max_length=64)
    memory_bytes = models.BigIntegerField()
    measured_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["version", "fingerprint"], name="model_memory_unique")]
        # Django's default plural of "model memory" is "model memorys" (it appends an s).
        verbose_name = "model memory measurement"

    def __str__(self) -> str:
        return f"{self.version}: {self.memory_bytes} bytes"
