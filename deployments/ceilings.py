"""Resource ceilings: what a team may ask for, set by the operator (settings DEPLOYMENT_MAX_*, TEAM_MAX_*, and a
team's TeamQuota row in the admin over them).

Two kinds, checked by planning (deployments/planning.py) for every caller (the API, the web forms, the CLI, tune
applies) and again when a stopped deployment is started:
- per deployment: memory and CPU per server (a local Triton, a pod), model instances per server, replicas
  (autoscaling's maximum), GPUs per replica;
- per team, on each runtime: the sum over the team's deployments that are not stopped or deleted, the revision
  each one asks for, the one still serving where that differs, and its canary counted, of memory, CPU, GPUs and
  servers (replicas).

And across teams, on the local runtime: the sum over every team's running and starting deployments of their memory
limits stays within this machine's memory less LOCAL_MEMORY_RESERVE, times DEPLOYMENT_MEMORY_OVERCOMMIT
(machine_refusal), checked after the team's own totals, so that two teams each within their ceilings cannot together
promise the machine more memory than it has.

A refusal names the limit, the value asked and who can raise it. On the local runtime memory and CPU default to
what this machine has (its memory less LOCAL_MEMORY_RESERVE, its cores): a cgroup limit above the machine limits
nothing, and one team asking for all of it takes the machine from the others. On Kubernetes the team's totals are
also rendered as the namespace's ResourceQuota and LimitRange (runtimes/kubernetes/manifests.py), so the cluster
holds them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal

from django.conf import settings
from django.db.models import QuerySet

from accounts.models import Team, TeamQuota
from deployments.models import Deployment
from deployments.revision_spec import RevisionSpec
from modelport.core import quantity
from modelport.core.sandbox import MIN_MEMORY_BYTES

MAX_REPLICAS = 100  # the planner's own bounds, whatever an operator sets
MAX_GPUS = 16
RAISE_IT = "ask an operator to raise it (admin: Teams → {team} → quota)"


@dataclass(frozen=True)
class Limit:
    """One ceiling: its value (None: none), and where it comes from, for the refusal."""

    value: Decimal | None
    source: str  # "DEPLOYMENT_MAX_MEMORY", "the team's quota", "this machine's memory less LOCAL_MEMORY_RESERVE"


@dataclass(frozen=True)
class Ceilings:
    memory: Limit
    cpu: Limit
    instances: Limit
    replicas: Limit
    gpus: Limit
    total_memory: Limit
    total_cpu: Limit
    total_gpus: Limit
    total_replicas: Limit


@dataclass(frozen=True)
class Usage:
    """What one revision (or a sum of them) holds on its runtime: per-server figures times its servers."""

    memory: Decimal = Decimal(0)
    cpu: Decimal = Decimal(0)
    gpus: int = 0
    replicas: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.memory + other.memory, self.cpu + other.cpu, self.gpus + other.gpus,
                     self.replicas + other.replicas)


def _quantity(text: str) -> Decimal | None:
    return quantity.parse_quantity(text) if text else None


def _ceiling(text: str) -> Decimal | None:
    """A ceiling's value: "0" is none at all (where "" would take the machine's)."""
    return _quantity(text) or None


def _count(value: int) -> Decimal | None:
    return Decimal(value) if value else None


def _usable_memory() -> Decimal | None:
    """This machine's memory less the reserve (None where the machine's memory cannot be read)."""
    if not settings.MACHINE_MEMORY_BYTES:
        return None
    reserve = _quantity(settings.LOCAL_MEMORY_RESERVE) or Decimal(0)
    return max(Decimal(settings.MACHINE_MEMORY_BYTES) - reserve, Decimal(quantity.MEMORY.minimum))


def defaults(runtime: str) -> Ceilings:
    """The operator's settings, with what this machine has where they leave the local runtime's unset."""
    local = runtime == Deployment.Runtime.LOCAL
    machine_memory = Limit(_usable_memory(), "this machine's memory less LOCAL_MEMORY_RESERVE")

    def memory(name: str, text: str) -> Limit:
        return Limit(_ceiling(text), name) if text or not local else machine_memory

    cpu = Limit(_ceiling(settings.DEPLOYMENT_MAX_CPU), "DEPLOYMENT_MAX_CPU")
    if local and not settings.DEPLOYMENT_MAX_CPU:
        cpu = Limit(Decimal(settings.MACHINE_CPUS), "this machine's cores")
    return Ceilings(
        memory=memory("DEPLOYMENT_MAX_MEMORY", settings.DEPLOYMENT_MAX_MEMORY),
        cpu=cpu,
        instances=Limit(_count(settings.DEPLOYMENT_MAX_INSTANCES), "DEPLOYMENT_MAX_INSTANCES"),
        replicas=Limit(Decimal(min(settings.DEPLOYMENT_MAX_REPLICAS or MAX_REPLICAS, MAX_REPLICAS)),
                       "DEPLOYMENT_MAX_REPLICAS"),
        gpus=Limit(Decimal(min(settings.DEPLOYMENT_MAX_GPUS or MAX_GPUS, MAX_GPUS)), "DEPLOYMENT_MAX_GPUS"),
        total_memory=memory("TEAM_MAX_MEMORY", settings.TEAM_MAX_MEMORY),
        total_cpu=Limit(_ceiling(settings.TEAM_MAX_CPU), "TEAM_MAX_CPU"),
        total_gpus=Limit(_count(settings.TEAM_MAX_GPUS), "TEAM_MAX_GPUS"),
        total_replicas=Limit(_count(settings.TEAM_MAX_REPLICAS), "TEAM_MAX_REPLICAS"),
    )


def for_team(team: Team, runtime: str) -> Ceilings:
    """The team's ceilings on `runtime`: its TeamQuota's fields where an operator set them, else the defaults."""
    ceilings = defaults(runtime)
    quota = TeamQuota.objects.filter(team=team).first()
    if quota is None:
        return ceilings
    own = "the team's quota"

    def pick(given: Limit, text: str | int | None, *, bound: int | None = None) -> Limit:
        if text is None or text == "":
            return given
        value = _quantity(text) if isinstance(text, str) else Decimal(text)
        if bound is not None and value is not None:
            value = min(value, Decimal(bound))
        return Limit(value if value else None, own)

    return Ceilings(
        memory=pick(ceilings.memory, quota.deployment_memory),
        cpu=pick(ceilings.cpu, quota.deployment_cpu),
        instances=pick(ceilings.instances, quota.deployment_instances),
        replicas=pick(ceilings.replicas, quota.deployment_replicas, bound=MAX_REPLICAS),
        gpus=pick(ceilings.gpus, quota.deployment_gpus, bound=MAX_GPUS),
        total_memory=pick(ceilings.total_memory, quota.total_memory),
        total_cpu=pick(ceilings.total_cpu, quota.total_cpu),
        total_gpus=pick(ceilings.total_gpus, quota.total_gpus),
        total_replicas=pick(ceilings.total_replicas, quota.total_replicas),
    )


def default_memory(runtime: str) -> str:
    """What a server that sets no resources.memory is limited to on `runtime` ("" for nothing)."""
    if runtime == Deployment.Runtime.KUBERNETES:
        return str(settings.KUBERNETES_DEFAULT_MEMORY)
    return str(settings.SANDBOX_DEFAULT_MEMORY)


def default_cpu(runtime: str) -> str:
    """What a server that sets no resources.cpu asks for on `runtime` (the local runtime: no CPU limit)."""
    return str(settings.KUBERNETES_DEFAULT_CPU) if runtime == Deployment.Runtime.KUBERNETES else ""


def servers(spec: RevisionSpec) -> int:
    """How many servers (pods) the revision may run at once: autoscaling's maximum, else its replicas."""
    return spec.autoscaling.max_replicas if spec.autoscaling else spec.replicas


def instances(spec: RevisionSpec) -> int:
    """Model instances per server (a pipeline runs none of its own: its steps do)."""
    return sum(m.instance_group.count for m in spec.models if not m.is_pipeline)


def usage(spec: RevisionSpec) -> Usage:
    """What the revision holds on its runtime, defaults counted (stored quantities were checked when planned)."""
    if spec.placement.shared:
        # No server of its own: it is loaded in a pool's Triton, whose memory budget (the operator's) bounds it.
        return Usage()
    n = servers(spec)
    resources = spec.resources
    memory = _quantity(spec.memory_limit(default_memory(spec.runtime))) or Decimal(0)
    cpu = _quantity(resources.cpu or default_cpu(spec.runtime)) or Decimal(0)
    gpus = max(resources.gpu, 1) if resources.mig_profile else resources.gpu
    return Usage(memory=memory * n, cpu=cpu * n, gpus=gpus * n, replicas=n)


def _running_usage(deployments: QuerySet[Deployment]) -> Usage:
    """The sum over `deployments` of what each runs or starts: the revision it asks for, the one still serving where
    that differs, and its canary."""
    total = Usage()
    for deployment in deployments.select_related("revision", "serving_revision", "canary_revision"):
        # A revision that fails to load leaves the one before it serving: counting only the one asked for let a
        # PATCH to a tiny revision that never loads free the big one's share while its server kept holding it.
        running = {r.pk: r for r in (deployment.revision, deployment.serving_revision, deployment.canary_revision)
                   if r is not None}
        for revision in running.values():
            total += usage(revision.spec)
    return total


def team_usage(team: Team, runtime: str, *, leaving_out: int | None = None) -> Usage:
    """The sum over the team's deployments on `runtime` that are not stopped or deleted (but `leaving_out`)."""
    deployments = Deployment.objects.filter(team=team, runtime=runtime, desired_state=Deployment.Desired.RUNNING)
    if leaving_out is not None:
        deployments = deployments.exclude(pk=leaving_out)
    return _running_usage(deployments)


def machine_usage(runtime: str, *, leaving_out: int | None = None) -> Usage:
    """The same sum over every team's deployments on `runtime`."""
    deployments = Deployment.objects.filter(runtime=runtime, desired_state=Deployment.Desired.RUNNING)
    if leaving_out is not None:
        deployments = deployments.exclude(pk=leaving_out)
    return _running_usage(deployments)


def machine_memory(runtime: str) -> Limit:
    """What every team's deployments on `runtime` may hold in memory limits together: on the local runtime this
    machine's memory less LOCAL_MEMORY_RESERVE, times DEPLOYMENT_MEMORY_OVERCOMMIT; None (no admission across
    teams) on Kubernetes, whose cluster admits pods itself, and where the operator set the factor to 0."""
    usable = _usable_memory()
    factor = settings.DEPLOYMENT_MEMORY_OVERCOMMIT
    source = f"this machine's memory less LOCAL_MEMORY_RESERVE, times DEPLOYMENT_MEMORY_OVERCOMMIT = {factor:g}"
    if runtime != Deployment.Runtime.LOCAL or usable is None or not factor:
        return Limit(None, source)
    return Limit((usable * Decimal(str(factor))).to_integral_value(rounding=ROUND_FLOOR), source)


def machine_refusal(asked: Decimal, used: Decimal, limit: Limit, servers: int) -> str:
    """Why `asked` more memory in limits (over `servers` servers) does not fit beside the `used` that every team's
    deployments hold, under the machine's `limit` ("" when it fits)."""
    if not asked or limit.value is None or used + asked <= limit.value:
        return ""
    free = max(limit.value - used, Decimal(0))
    per_server = (free / max(servers, 1)).to_integral_value(rounding=ROUND_FLOOR)
    flag = f"modelport deploy NAME --memory {_flag_size(per_server)}" if per_server >= 2**20 else ""
    lower = (f"lower resources.memory to at most {_show('memory', per_server)} per server for its {servers} servers"
             if servers > 1 else f"lower resources.memory to at most {_show('memory', per_server)}")
    if flag:
        lower += f" ({flag})"
    return (f"{_show('memory', asked)} more would make {_show('memory', used + asked)} of memory limits on this "
            f"machine (every team's running and starting deployments hold {_show('memory', used)}), more than it "
            f"admits (at most {_show('memory', limit.value)}, {limit.source}); {_show('memory', free)} is free: "
            f"{lower}, stop or shrink another deployment, or ask an operator to raise DEPLOYMENT_MEMORY_OVERCOMMIT "
            "or free memory")


def _show(key: str, value: Decimal | int) -> str:
    """A figure as the refusal says it: memory in GiB or MiB, cores and counts as numbers."""
    value = Decimal(value)
    if key == "memory":
        if value >= 2**30:
            return f"{value / 2**30:.1f}Gi".replace(".0Gi", "Gi")
        return f"{value / 2**20:.0f}Mi"
    return f"{value.normalize():f}"


def _flag_size(value: Decimal) -> str:
    """A memory figure as --memory takes it, never above `value` (what _show rounds may be)."""
    mebibytes = int(value) // 2**20
    return f"{mebibytes // 1024}Gi" if mebibytes % 1024 == 0 else f"{mebibytes}Mi"


def _default_words(spec: RevisionSpec, field: str, text: str) -> str:
    """How a figure the revision did not give was chosen, for a refusal."""
    basis = spec.memory_basis
    if field == "memory" and basis is not None:
        if basis.fallback is None:
            return f"The memory limit of {text} derived from what its models were measured to take"
        return f"The default memory of {text} (SANDBOX_DEFAULT_MEMORY: {basis.fallback_reason})"
    return f"The default {field} of {text}"


def _lower_memory(team: Team, spec: RevisionSpec, deployment: Deployment | None, free: Decimal) -> str:
    """What to do when the team's memory is full: which deployment's memory to lower and how (the API's field, the
    CLI's flag, with what is `free` per server), and the team's largest holders."""
    name = deployment.name if deployment is not None else "NAME"
    held = []
    others = Deployment.objects.filter(team=team, runtime=spec.runtime, desired_state=Deployment.Desired.RUNNING)
    if deployment is not None:
        others = others.exclude(pk=deployment.pk)
    for other in others.select_related("revision"):
        if other.revision is not None:
            held.append((usage(other.revision.spec).memory, other.name))
    held.sort(key=lambda pair: (-pair[0], pair[1]))
    largest = ", ".join(f"{n} {_show('memory', m)}" for m, n in held[:3] if m)
    biggest = f" (the largest: {largest})" if largest else ""
    others_first = f"stop or give less memory to another deployment{biggest}"
    if free < MIN_MEMORY_BYTES:
        # Less is free than any server can be given (a smaller --memory would be refused too): room is made only by
        # the others, and "give this deployment less" would name a figure above what it asks.
        return f"the team has {_show('memory', max(free, Decimal(0)))} free, less than any server takes: {others_first}"
    size = _flag_size(free)
    return (f"give this deployment at most {size} (resources.memory in the API, modelport deploy {name} --memory "
            f"{size}), {others_first}")


def check(team: Team, spec: RevisionSpec, *, deployment: Deployment | None = None, canary: bool = False,
          starting: bool = False) -> dict[str, list[str]]:
    """Why `spec` asks for more than the team may have, keyed by the field to change (empty when it fits).

    `deployment`: the one this revision is for (what it holds now is not counted, but its stable revision is
    when the new one is a `canary` beside it); a stopped one's totals are checked when it is `starting`, not when
    it is edited, since a stopped deployment holds nothing."""
    errors: dict[str, list[str]] = {}
    ceilings = for_team(team, spec.runtime)
    raise_it = RAISE_IT.format(team=team.name)

    def over(key: str, field: str, asked: Decimal, limit: Limit, what: str, less: str = "ask for less",
             subject: str = "") -> None:
        if limit.value is not None and asked > limit.value:
            errors.setdefault(key, []).append(
                f"{subject or _show(field, asked)} is more than {what} (at most {_show(field, limit.value)}, "
                f"{limit.source}): {less}, or {raise_it}")

    resources = spec.resources
    per_server: list[tuple[str, str, str, Limit]] = [
        ("resources.memory", "memory", spec.memory_limit(default_memory(spec.runtime)), ceilings.memory),
        ("resources.cpu", "cpu", resources.cpu or default_cpu(spec.runtime), ceilings.cpu),
    ]
    for key, field, text, limit in per_server:
        asked = _quantity(text)
        if asked is not None:
            subject = "" if getattr(resources, field) else _default_words(spec, field, text)
            less = "ask for less"
            if field == "memory" and limit.value is not None and limit.value >= 2**20:
                less = (f"ask for less (resources.memory in the API, modelport deploy NAME --memory "
                        f"{_flag_size(limit.value)})")
            over(key, field, asked, limit, f"a deployment of team {team.name} may ask for per server", less, subject)
    over("resources.gpu", "gpus", Decimal(resources.gpu), ceilings.gpus,
         f"the GPUs per replica team {team.name} may ask for")
    over("autoscaling.max_replicas" if spec.autoscaling else "replicas", "replicas", Decimal(servers(spec)),
         ceilings.replicas, f"the replicas a deployment of team {team.name} may have")
    over("models", "instances", Decimal(instances(spec)), ceilings.instances,
         f"the model instances (instance_group counts, summed) a deployment of team {team.name} may run per server")
    if errors:
        return errors  # one deployment over its own ceiling: the team's totals would only repeat it

    if deployment is not None and deployment.desired_state != Deployment.Desired.RUNNING and not starting:
        return errors
    others = team_usage(team, spec.runtime, leaving_out=deployment.pk if deployment is not None else None)
    if canary and deployment is not None and deployment.revision is not None:
        others += usage(deployment.revision.spec)
    wanted = usage(spec)
    where = f"team {team.name}'s deployments on the {spec.runtime} runtime may hold together"
    totals = (("resources.memory", "memory", ceilings.total_memory), ("resources.cpu", "cpu", ceilings.total_cpu),
              ("resources.gpu", "gpus", ceilings.total_gpus), ("replicas", "replicas", ceilings.total_replicas))
    for key, field, limit in totals:
        used, asked = getattr(others, field), getattr(wanted, field)
        if asked and limit.value is not None and used + asked > limit.value:
            lower = (_lower_memory(team, spec, deployment, (limit.value - used) / servers(spec)) if field == "memory"
                     else "stop or shrink another deployment")
            errors.setdefault(key, []).append(
                f"{_show(field, asked)} more would make {_show(field, used + asked)} (the running and starting "
                f"deployments hold {_show(field, used)}), more than {where} (at most {_show(field, limit.value)}, "
                f"{limit.source}): {lower}, or {raise_it}")
    # Every team's deployments on this machine, after the team's own: each team within its ceiling must not add up
    # to more than the machine has.
    everyone = machine_usage(spec.runtime, leaving_out=deployment.pk if deployment is not None else None)
    if canary and deployment is not None and deployment.revision is not None:
        everyone += usage(deployment.revision.spec)
    refused = machine_refusal(wanted.memory, everyone.memory, machine_memory(spec.runtime), wanted.replicas)
    if refused:
        errors.setdefault("resources.memory", []).append(refused)
    return errors
