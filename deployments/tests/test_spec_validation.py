"""validate_served_model(), validate_repository() and defaults_for(): plain dataclasses, no database."""

from __future__ import annotations

import dataclasses

import pytest

from deployments.spec import (
    DEFAULT_MAX_BATCH_SIZE,
    MAX_INSTANCE_COUNT,
    MAX_QUEUE_DELAY_MICROSECONDS,
    DynamicBatching,
    EnsembleStep,
    InstanceGroup,
    RepositorySpec,
    Warmup,
    defaults_for,
    validate_repository,
    validate_served_model,
)
from deployments.tests.values import BATCHED, model, steps
from modelport.core.signature import Signature, Tensor

FIXED = Signature(inputs=(Tensor("x", "FP32", (2, 4)),), outputs=(Tensor("y", "FP32", (2, 3)),))


def test_a_sensible_onnx_model_is_valid_on_both_targets() -> None:
    assert validate_served_model(model(), "local") == {}
    assert validate_served_model(model(), "kubernetes") == {}


def test_it_refuses_an_unknown_target() -> None:
    with pytest.raises(ValueError, match="unknown target"):
        validate_served_model(model(), "docker")


def test_it_refuses_preferred_batch_sizes_above_max_batch_size() -> None:
    errors = validate_served_model(model(dynamic_batching=DynamicBatching(preferred_batch_size=(4, 16))), "local")
    assert errors == {
        "dynamic_batching.preferred_batch_size": ["preferred batch size 16 is larger than max_batch_size 8"]
    }


def test_it_refuses_preferred_batch_sizes_of_zero_or_less() -> None:
    errors = validate_served_model(model(dynamic_batching=DynamicBatching(preferred_batch_size=(0, -2))), "local")
    assert len(errors["dynamic_batching.preferred_batch_size"]) == 2


def test_it_refuses_max_batch_size_without_a_batch_dimension() -> None:
    errors = validate_served_model(model(signature=FIXED, dynamic_batching=None), "local")
    assert list(errors) == ["max_batch_size"]
    assert "dynamic first dimension" in errors["max_batch_size"][0]


def test_it_accepts_a_model_without_batch_dimension_at_max_batch_size_zero() -> None:
    assert validate_served_model(model(signature=FIXED, max_batch_size=0, dynamic_batching=None), "local") == {}


def test_it_refuses_dynamic_batching_at_max_batch_size_zero() -> None:
    errors = validate_served_model(model(max_batch_size=0, dynamic_batching=DynamicBatching()), "local")
    assert errors == {"dynamic_batching": ["dynamic batching needs max_batch_size greater than 0"]}


@pytest.mark.parametrize("delay", [-1, MAX_QUEUE_DELAY_MICROSECONDS + 1])
def test_it_refuses_a_queue_delay_out_of_bounds_and_says_the_bound(delay: int) -> None:
    errors = validate_served_model(model(dynamic_batching=DynamicBatching(max_queue_delay_microseconds=delay)), "local")
    (message,) = errors["dynamic_batching.max_queue_delay_microseconds"]
    assert "between 0 and 10,000,000 µs" in message


def test_it_accepts_the_largest_queue_delay() -> None:
    db = DynamicBatching(max_queue_delay_microseconds=MAX_QUEUE_DELAY_MICROSECONDS)
    assert validate_served_model(model(dynamic_batching=db), "local") == {}


@pytest.mark.parametrize("count", [0, MAX_INSTANCE_COUNT + 1])
def test_it_refuses_an_instance_count_out_of_bounds(count: int) -> None:
    errors = validate_served_model(model(instance_group=InstanceGroup(count=count)), "kubernetes")
    assert errors == {"instance_group.count": [f"the instance count must be between 1 and 16, got {count}"]}


def test_it_refuses_gpu_instances_on_the_local_runtime() -> None:
    errors = validate_served_model(model(instance_group=InstanceGroup(kind="gpu")), "local")
    assert errors == {"instance_group.kind": ["the local runtime has no GPU: use kind 'cpu'"]}


def test_it_accepts_gpu_instances_with_gpu_ids_on_kubernetes() -> None:
    assert validate_served_model(model(instance_group=InstanceGroup(kind="gpu", gpus=(0, 1))), "kubernetes") == {}


def test_it_refuses_gpu_ids_on_cpu_instances() -> None:
    errors = validate_served_model(model(instance_group=InstanceGroup(kind="cpu", gpus=(0,))), "kubernetes")
    assert errors == {"instance_group.gpus": ["GPU ids can only be given with kind 'gpu'"]}


@pytest.mark.parametrize("fmt", ["tensorrt_plan", "tnn"])
def test_it_refuses_formats_the_local_runtime_cannot_serve_and_says_why(fmt: str) -> None:
    errors = validate_served_model(model(format=fmt), "local", local_frameworks={"torch", "tensorflow"})
    (message,) = errors["format"]
    assert "only the python backend" in message
    assert "Kubernetes" in message


@pytest.mark.parametrize("fmt", ["onnx", "torchscript", "tensorflow_savedmodel", "tensorrt_plan", "python", "tnn"])
def test_kubernetes_serves_every_format_natively(fmt: str) -> None:
    assert validate_served_model(model(format=fmt), "kubernetes") == {}


@pytest.mark.parametrize(("fmt", "framework", "label"), [("torchscript", "torch", "PyTorch"),
                                                           ("tensorflow_savedmodel", "tensorflow", "TensorFlow")])
def test_it_refuses_a_framework_format_locally_without_the_framework_and_says_how_to_add_it(
    fmt: str, framework: str, label: str
) -> None:
    other = {"torch", "tensorflow"} - {framework}
    errors = validate_served_model(model(format=fmt), "local", local_frameworks=other)
    (message,) = errors["format"]
    assert f"the local runtime env has no {label}" in message
    assert f"`make runtime-env RUNTIME_EXTRAS={framework}`" in message
    assert "MB download" in message and "Kubernetes" in message


@pytest.mark.parametrize(("fmt", "framework"), [("torchscript", "torch"), ("tensorflow_savedmodel", "tensorflow")])
def test_it_serves_a_framework_format_locally_when_the_runtime_env_has_the_framework(fmt: str, framework: str) -> None:
    assert validate_served_model(model(format=fmt), "local", local_frameworks={framework}) == {}


def test_it_refuses_torchscript_with_string_or_bfloat16_tensors_locally_but_not_on_kubernetes() -> None:
    text = Signature(inputs=(Tensor("ids", "BYTES", (-1, 1)),), outputs=(Tensor("emb", "BF16", (-1, 8)),))
    m = model(format="torchscript", signature=text)
    errors = validate_served_model(m, "local", local_frameworks={"torch"})
    assert errors == {"signature": ["the local runtime serves TorchScript with numeric tensors only, and ids, emb is "
                                    "BYTES or BF16; deploy to Kubernetes"]}
    assert validate_served_model(m, "kubernetes") == {}


def test_it_refuses_an_unknown_format() -> None:
    assert "unknown format" in validate_served_model(model(format="pickle"), "kubernetes")["format"][0]


def test_it_refuses_a_model_name_triton_cannot_use_as_a_directory() -> None:
    assert "name" in validate_served_model(model(name="../etc"), "local")
    assert "name" in validate_served_model(model(name=""), "local")
    assert "name" in validate_served_model(model(name="a.b"), "local")  # "." separates name and field in keys


def test_it_refuses_a_model_without_artifact_unless_it_is_an_ensemble() -> None:
    assert validate_served_model(model(artifact_path=None), "local") == {
        "artifact_path": ["the model has no stored artifact"]
    }


def test_it_checks_the_warmup_settings() -> None:
    errors = validate_served_model(model(warmup=Warmup(batch_size=9, count=0, data="noise")), "local")
    assert set(errors) == {"warmup.batch_size", "warmup.count", "warmup.data"}
    assert validate_served_model(model(warmup=Warmup(batch_size=8, data="random")), "local") == {}


def test_an_ensemble_needs_steps_and_has_no_dynamic_batching_of_its_own() -> None:
    ensemble = model(format="ensemble", artifact_path=None, dynamic_batching=DynamicBatching(), definition=steps(()),
                     instance_group=InstanceGroup())
    errors = validate_served_model(ensemble, "local")
    assert set(errors) == {"ensemble_steps", "dynamic_batching"}


def test_an_ensemble_refuses_instances_it_would_not_apply() -> None:
    """The renderer writes no instance group for an ensemble: "instances 3" was accepted and silently dropped."""
    step = EnsembleStep(model="classifier", version=1, input_map={"x": "x"}, output_map={"y": "y"})
    ensemble = model(name="pipeline", format="ensemble", artifact_path=None, dynamic_batching=None,
                     definition=steps((step,)),
                     instance_group=InstanceGroup(count=3, kind="gpu", gpus=(0,)))
    errors = validate_served_model(ensemble, "kubernetes")
    assert set(errors) == {"instance_group.count", "instance_group.kind"}
    assert "set instances on its step models" in errors["instance_group.count"][0]
    assert validate_served_model(dataclasses.replace(ensemble, instance_group=InstanceGroup()), "kubernetes") == {}


def test_repository_validation_finds_missing_step_models_and_repeated_names() -> None:
    step = EnsembleStep(model="missing", version=1, input_map={"x": "x"}, output_map={"y": "y"})
    ensemble = model(
        name="pipeline", format="ensemble", artifact_path=None, dynamic_batching=None, definition=steps((step,))
    )
    errors = validate_repository(RepositorySpec(models=(model(), model(), ensemble)), "local")
    assert errors["models"] == ["model name 'classifier' is used more than once"]
    assert errors["pipeline.ensemble_steps[0].model"] == ["step model 'missing' is not part of this repository"]


def test_defaults_for_a_batchable_signature_use_the_detected_max_batch_size() -> None:
    defaults = defaults_for(BATCHED, detected_max_batch_size=32)
    assert defaults.max_batch_size == 32
    assert defaults.dynamic_batching == DynamicBatching(max_queue_delay_microseconds=0)
    assert defaults.instance_group == InstanceGroup(count=1, kind="cpu")


def test_defaults_for_a_batchable_signature_fall_back_to_the_default_max_batch_size() -> None:
    assert defaults_for(BATCHED, detected_max_batch_size=None).max_batch_size == DEFAULT_MAX_BATCH_SIZE


def test_defaults_for_a_signature_without_batch_dimension_disable_batching() -> None:
    defaults = defaults_for(FIXED, detected_max_batch_size=16)
    assert defaults.max_batch_size == 0
    assert defaults.dynamic_batching is None


def test_defaults_pass_validation() -> None:
    for signature in (BATCHED, FIXED):
        d = defaults_for(signature, detected_max_batch_size=None)
        m = model(
            signature=signature,
            max_batch_size=d.max_batch_size,
            dynamic_batching=d.dynamic_batching,
            instance_group=d.instance_group,
        )
        assert validate_served_model(m, "local") == {}


def test_an_ensemble_cannot_batch_more_than_its_step_models() -> None:
    step = EnsembleStep(model="classifier", version=1, input_map={"x": "x"}, output_map={"y": "y"})
    ensemble = model(
        name="pipeline",
        format="ensemble",
        artifact_path=None,
        dynamic_batching=None,
        max_batch_size=16,
        definition=steps((step,)),
        instance_group=InstanceGroup(),
    )
    errors = validate_repository(RepositorySpec(models=(model(), ensemble)), "local")
    assert errors == {
        "pipeline.max_batch_size": [
            "an ensemble's max_batch_size (16) cannot exceed that of its step model 'classifier' (8)"
        ]
    }
