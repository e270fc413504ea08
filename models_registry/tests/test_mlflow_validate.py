"""An mlflow source at the API (issue 35): the URI's shape, MLflow imports being on, and the team's allowance, all
without a network call (models_registry/sources/mlflow.py, validate)."""

from __future__ import annotations

from typing import Any

import pytest

from models_registry.models import TeamSources
from models_registry.sources import fetcher_for
from models_registry.sources.base import SourceForbidden, SourceRefused
from models_registry.sources.mlflow import convert_signature
from tests.support.people import Person


@pytest.fixture
def tracking_on(settings: Any) -> None:
    settings.MLFLOW_TRACKING_URI = "http://127.0.0.1:9"  # never reached: validate makes no call
    settings.IMPORT_MLFLOW_MODELS = "*"


@pytest.mark.parametrize("uri", ["models:/fraud", "models:/fraud/", "models:/fraud/v3", "models:/fraud/3/extra",
                                 "models:/fraud@", "models:/fraud@a/b", "runs:/abc/model", "models:/a%2F..@x",
                                 "models:/fra\nud/1", "", None, 3])
def test_it_refuses_a_uri_that_is_not_a_registry_version_or_alias(alice: Person, tracking_on: None,
                                                                   uri: object) -> None:
    with pytest.raises(SourceRefused, match=r"models:/<registered model>/<version>"):
        fetcher_for("mlflow").validate({"kind": "mlflow", "uri": uri}, alice.team.id)


def test_it_accepts_a_version_and_an_alias(alice: Person, tracking_on: None) -> None:
    fetcher = fetcher_for("mlflow")
    for uri in ("models:/fraud/3", "models:/fraud detector@champion"):
        assert fetcher.validate({"kind": "mlflow", "uri": uri}, alice.team.id) == {"kind": "mlflow", "uri": uri}
    # A version is pinned; an alias moves, so it has no identity (each import of it is a version of its own).
    assert fetcher.identity({"kind": "mlflow", "uri": "models:/fraud/3"}) == "mlflow:models:/fraud/3"
    assert fetcher.identity({"kind": "mlflow", "uri": "models:/fraud detector@champion"}) is None


def test_it_refuses_unknown_fields(alice: Person, tracking_on: None) -> None:
    with pytest.raises(SourceRefused, match="only kind and uri"):
        fetcher_for("mlflow").validate({"kind": "mlflow", "uri": "models:/a/1", "token": "x"}, alice.team.id)


def test_mlflow_imports_are_off_without_a_tracking_server(alice: Person, settings: Any) -> None:
    settings.MLFLOW_TRACKING_URI = ""
    with pytest.raises(SourceForbidden, match="MLFLOW_TRACKING_URI"):
        fetcher_for("mlflow").validate({"kind": "mlflow", "uri": "models:/a/1"}, alice.team.id)


def test_a_model_outside_the_teams_patterns_is_forbidden_naming_the_setting(alice: Person, tracking_on: None) -> None:
    TeamSources.objects.create(team=alice.team, mlflow_models="fraud-*\n")
    fetcher = fetcher_for("mlflow")
    assert fetcher.validate({"kind": "mlflow", "uri": "models:/fraud-eu/1"}, alice.team.id)
    with pytest.raises(SourceForbidden, match="Team sources.*IMPORT_MLFLOW_MODELS"):
        fetcher.validate({"kind": "mlflow", "uri": "models:/payroll/1"}, alice.team.id)


def _mlmodel(inputs: str, outputs: str) -> dict[str, Any]:
    return {"flavors": {"python_function": {}}, "signature": {"inputs": inputs, "outputs": outputs}}


def test_signatures_of_tensors_and_columns_map_to_triton_tensors() -> None:
    tensors = convert_signature(_mlmodel(
        '[{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1, 3]}}]',
        '[{"type": "tensor", "tensor-spec": {"dtype": "int64", "shape": [-1]}}]'))
    assert tensors.signature.to_json() == {"inputs": [{"name": "input", "datatype": "FP32", "dims": [-1, 3]}],
                                           "outputs": [{"name": "output", "datatype": "INT64", "dims": [-1]}]}
    columns = convert_signature(_mlmodel('[{"type": "double", "name": "age"}, {"type": "string", "name": "city"}]',
                                         '[{"type": "long"}]'))
    assert columns.input_kind == "columns" and columns.named_inputs
    assert [(t.name, t.datatype, t.dims) for t in columns.signature.inputs] == [("age", "FP64", (-1, 1)),
                                                                               ("city", "BYTES", (-1, 1))]


@pytest.mark.parametrize(("inputs", "message"), [
    ('[{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1]}}, '
     '{"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": [-1]}}]', "several and unnamed"),
    ('[{"type": "tensor", "tensor-spec": {"dtype": "complex64", "shape": [-1]}}]', "no type for"),
    ('[{"type": "array", "items": {"type": "double"}, "name": "a"}]', "cannot be mapped"),
    ('[{"type": "double", "name": "bad\\nname"}]', "printable"),
])
def test_signatures_that_cannot_be_mapped_are_refused_saying_why(inputs: str, message: str) -> None:
    with pytest.raises(SourceRefused, match=message):
        convert_signature(_mlmodel(inputs, '[{"type": "double"}]'))


def test_a_model_without_a_signature_is_refused_saying_how_to_log_one() -> None:
    with pytest.raises(SourceRefused, match="infer_signature"):
        convert_signature({"flavors": {"python_function": {}}})
