"""REST API for shared servers: GET /api/v1/pools/ lists the pools a team may use with their capacity, and for a
model version (?model=NAME&version=N) whether, and how many more, copies of it fit (issue 24)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.context import current_team
from deployments import pools
from deployments.pool_models import GpuShare, Pool
from deployments.runtimes.registry import runtime_named
from infra.api_errors import not_found
from infra.api_schema import error
from models_registry.models import ModelVersion


class PoolQuerySerializer(serializers.Serializer[Any]):
    model = serializers.CharField(required=False, max_length=63, help_text=(
        "A model of your team: each pool then says whether one more copy of it fits, from its measured memory."))
    version = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1,
                                       help_text="With model: its version (default: the latest ready one).")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # A query string's empty value reaches no field (DRF leaves it out): `?model=` is a name left out.
        if "model" in self.initial_data and not attrs.get("model"):
            raise serializers.ValidationError({"model": ["give a model's name: ?model=NAME"]})
        if "version" in self.initial_data and "version" not in attrs:
            raise serializers.ValidationError({"version": ["give a version number: ?version=N"]})
        if "version" in attrs and "model" not in attrs:
            raise serializers.ValidationError({"version": ["give the model too: ?model=NAME&version=N"]})
        return attrs


class PoolFitSerializer(serializers.Serializer[Any]):
    model = serializers.CharField()
    version = serializers.IntegerField()
    memory_bytes = serializers.IntegerField(allow_null=True, help_text=(
        "What one more copy takes from the pool: on this machine its reservation (its peak measured under use with "
        "POOL_MODEL_MEMORY_HEADROOM, at least POOL_MODEL_MEMORY_MIN); null: never measured here yet."))
    fits = serializers.BooleanField(allow_null=True, help_text="One more copy fits now (null: not measured yet).")
    copies = serializers.IntegerField(allow_null=True, help_text="How many more copies fit now (null: not measured).")
    message = serializers.CharField()


class PoolGpuSerializer(serializers.Serializer[Any]):
    share = serializers.ChoiceField(choices=GpuShare.choices, help_text=(
        "none: CPU only; whole: whole GPUs; mig: MIG slices; time_sliced: the device plugin's time-sliced replicas "
        "(no memory isolation); mps: MPS shares; hami: memory-capped fractions through HAMi."))
    count = serializers.IntegerField(help_text="GPUs, slices or shares per pod (0: none).")
    resources = serializers.DictField(child=serializers.CharField(), help_text=(
        "The extended resources each pod requests, e.g. {\"nvidia.com/gpumem\": \"8192\"}."))
    isolation = serializers.CharField(help_text="What the share class isolates from the other pods on the GPU.")


class PoolSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    runtime = serializers.ChoiceField(choices=Pool.Runtime.choices)
    teams = serializers.ChoiceField(choices=["all", "yours"], help_text=(
        "all: every team's models share it (ONNX only); yours: your team's own pool (python, TorchScript and "
        "SavedModels too)."))
    memory_budget_bytes = serializers.IntegerField()
    memory_used_bytes = serializers.IntegerField(help_text=(
        "What your team's models loaded in it take: each model's reservation (its memory limit there: its peak "
        "measured under use with headroom), or more where a model holds more (other teams' use is not shown)."))
    models_loaded = serializers.IntegerField(help_text="Your team's models loaded in it.")
    memory_free_bytes = serializers.IntegerField(help_text=(
        "What your team may still load into it: its share of a pool open to every team (POOL_TEAM_SHARE), within "
        "what the pool has free."))
    idle_unload_seconds = serializers.IntegerField(help_text="Its default; 0: models stay loaded.")
    gpu = PoolGpuSerializer(help_text="What each of the pool's Triton pods gets of the GPUs (on a cluster).")
    fit = PoolFitSerializer(required=False, help_text="Only with ?model=NAME.")


@extend_schema(summary="The pools your team may deploy into, with their capacity", parameters=[PoolQuerySerializer],
               responses={200: PoolSerializer(many=True),
                          400: error("?version without ?model, or a value out of its bounds."),
                          404: error("?model names no model (or no such version) of your team.")})
@api_view(["GET"])
def pools_list(request: Request) -> Response:
    team = current_team(request)
    query = PoolQuerySerializer(data=request.query_params)
    query.is_valid(raise_exception=True)
    version = _version(request, query.validated_data)
    out = []
    for pool in pools.usable_pools(team):  # type: ignore[arg-type]
        runtime_named(pool.runtime).refresh_pool_figures(pool)  # what the models hold now, not what they took at load
        used, models = pools.memory_used(pool, team.pk)  # type: ignore[union-attr]
        row: dict[str, Any] = {
            "name": pool.name, "runtime": pool.runtime, "teams": "all" if pool.open_to_all else "yours",
            "memory_budget_bytes": pool.memory_budget_bytes, "memory_used_bytes": used, "models_loaded": models,
            "memory_free_bytes": pools.room_for(pool, team.pk),  # type: ignore[union-attr]
            "idle_unload_seconds": pool.idle_unload_seconds,
            "gpu": {"share": pool.gpu_share, "count": pool.gpu_count, "resources": pool.gpu_requests(),
                    "isolation": pool.isolation},
        }
        if version is not None:
            found = pools.fit(pool, version)
            row["fit"] = {"model": version.model.name, "version": version.number, "memory_bytes": found.memory_bytes,
                          "fits": found.fits, "copies": found.copies, "message": found.message}
        out.append(row)
    return Response(out)


def _version(request: Request, data: dict[str, Any]) -> ModelVersion | None:
    name = data.get("model")
    if name is None:
        return None
    team = current_team(request)
    versions = ModelVersion.objects.select_related("model").filter(model__team=team, model__name=name)
    number = data.get("version")
    version = (versions.filter(number=number) if number is not None
               else versions.filter(status=ModelVersion.Status.READY).order_by("-number")).first()
    if version is None:
        what = f"{name} version {number}" if number is not None else name
        raise not_found("ready model version" if number is None else "model version", what, team,
                        "GET /api/v1/models/ lists the team's models.")
    return version
