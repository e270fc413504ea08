"""The MLflow deployments plugin's client class against the fake portal (fake_portal.py): what each of MLflow's
calls sends the portal, and how inputs become a KServe v2 request. The `mlflow deployments` commands through the
installed entry point run against the real portal in tests/test_mlflow_plugin_e2e.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
from mlflow.exceptions import MlflowException

from modelport_cli import mlflow_plugin
from modelport_cli.mlflow_plugin import ModelportDeploymentClient, kserve_request, portal_model_name
from modelport_cli.tests.fake_portal import FakePortal, Reply, api_error, deployment

VERSION = {"number": 3, "model": "fraud", "status": "importing", "source": {"kind": "mlflow", "uri": "models:/fraud/3"},
           "import": {"done_bytes": 0, "total_bytes": None}}
FRAUD = {"model": "fraud", "version": 3, "format": "onnx"}


@pytest.fixture
def plugin(portal: FakePortal, monkeypatch: pytest.MonkeyPatch) -> ModelportDeploymentClient:
    monkeypatch.setattr(mlflow_plugin, "POLL_INTERVAL", 0.01)
    portal.on("POST", "/api/v1/models/fraud/versions/", Reply(201, VERSION))
    portal.on("GET", "/api/v1/models/fraud/versions/3/",
              [Reply(200, VERSION), Reply(200, {**VERSION, "status": "validating"}),
               Reply(200, {**VERSION, "status": "ready", "import": None})])
    return ModelportDeploymentClient("modelport")


def serving(**fields: Any) -> dict[str, Any]:
    return deployment(name="fraud-prod", endpoint="/serve/fraud-prod", models=[FRAUD], **fields)


def test_create_imports_the_registered_model_then_deploys_it_and_waits_until_it_serves(
    portal: FakePortal, plugin: ModelportDeploymentClient
) -> None:
    portal.on("POST", "/api/v1/deployments/", Reply(201, serving()))
    portal.on("GET", "/api/v1/deployments/fraud-prod/",
              [Reply(200, serving(status="starting")), Reply(200, serving(status="ready", serving_revision=1))])

    result = plugin.create_deployment("fraud-prod", "models:/fraud/3", config={"runtime": "local"})

    assert (result["name"], result["flavor"], result["status"]) == ("fraud-prod", "triton", "ready")
    assert portal.seen("POST", "/api/v1/models/fraud/versions/")[0].json() == {
        "source": {"kind": "mlflow", "uri": "models:/fraud/3"}, "create_model": True}
    assert portal.seen("POST", "/api/v1/deployments/")[0].json() == {
        "name": "fraud-prod", "models": [{"model": "fraud", "version": 3}], "runtime": "local"}
    assert len(portal.seen("GET", "/api/v1/deployments/fraud-prod/")) == 2


def test_create_says_why_when_the_import_turns_out_invalid(portal: FakePortal,
                                                           plugin: ModelportDeploymentClient) -> None:
    portal.on("GET", "/api/v1/models/fraud/versions/3/",
              Reply(200, {**VERSION, "status": "invalid", "error": "no ONNX or TorchScript file in the model"}))

    with pytest.raises(MlflowException, match="fraud version 3 is invalid: no ONNX or TorchScript file"):
        plugin.create_deployment("fraud-prod", "models:/fraud/3")
    assert not portal.seen("POST", "/api/v1/deployments/")


def test_update_imports_the_new_version_and_patches_the_deployment_to_serve_it(
    portal: FakePortal, plugin: ModelportDeploymentClient
) -> None:
    portal.on("PATCH", "/api/v1/deployments/fraud-prod/", Reply(200, serving(revision=2, serving_revision=1)))
    portal.on("GET", "/api/v1/deployments/fraud-prod/",
              [Reply(200, serving(status="ready", serving_revision=1)),
               Reply(200, serving(status="ready", revision=2, serving_revision=2))])

    result = plugin.update_deployment("fraud-prod", model_uri="models:/fraud@champion",
                                      config={"model_name": "fraud", "new_version": "true"})

    assert result["revision"] == 2
    assert portal.seen("POST", "/api/v1/models/fraud/versions/")[0].json() == {
        "source": {"kind": "mlflow", "uri": "models:/fraud@champion"}, "create_model": True, "new_version": True}
    assert portal.seen("PATCH", "/api/v1/deployments/fraud-prod/")[0].json() == {
        "models": [{"model": "fraud", "version": 3}]}


def test_get_list_and_delete_are_the_portals_deployments(portal: FakePortal, plugin: ModelportDeploymentClient) -> None:
    portal.on("GET", "/api/v1/deployments/", Reply(200, {"count": 1, "next": None, "results": [serving()]}))
    portal.on("GET", "/api/v1/deployments/fraud-prod/", Reply(200, serving()))
    portal.on("DELETE", "/api/v1/deployments/fraud-prod/", Reply(204))

    assert [d["name"] for d in plugin.list_deployments()] == ["fraud-prod"]
    assert plugin.get_deployment("fraud-prod")["endpoint"] == "/serve/fraud-prod"
    plugin.delete_deployment("fraud-prod")
    assert portal.seen("DELETE", "/api/v1/deployments/fraud-prod/")


def test_a_missing_deployment_is_an_mlflow_error_with_the_portals_reason(portal: FakePortal,
                                                                        plugin: ModelportDeploymentClient) -> None:
    portal.on("GET", "/api/v1/deployments/nope/", api_error(404, "There is no deployment named 'nope'.", "not_found"))

    with pytest.raises(MlflowException, match="There is no deployment named 'nope'"):
        plugin.get_deployment("nope")


def test_predict_sends_a_dataframe_as_the_models_one_input_and_returns_the_predictions(
    portal: FakePortal, plugin: ModelportDeploymentClient
) -> None:
    portal.on("GET", "/api/v1/deployments/fraud-prod/", Reply(200, serving()))
    portal.on("GET", "/serve/fraud-prod/v2/models/fraud",
              Reply(200, {"name": "fraud", "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]}))
    portal.on("POST", "/serve/fraud-prod/v2/models/fraud/infer",
              Reply(200, {"outputs": [{"name": "p", "datatype": "FP32", "shape": [2, 1], "data": [0.1, 0.9]}]}))

    result = plugin.predict("fraud-prod", pd.DataFrame({"a": [1, 2], "b": [3, 4]}))

    assert portal.seen("POST", "/serve/fraud-prod/v2/models/fraud/infer")[0].json() == {
        "inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1.0, 3.0, 2.0, 4.0]}]}
    assert result["predictions"] == [[0.1], [0.9]]
    assert result.get_predictions(predictions_format="ndarray").shape == (2, 1)


def test_inputs_of_each_form_mlflow_takes_become_a_kserve_request() -> None:
    declared = [{"name": "a", "datatype": "INT64"}, {"name": "b", "datatype": "BYTES"}]
    frame = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    by_column = {"inputs": [{"name": "a", "shape": [2], "datatype": "INT64", "data": [1, 2]},
                            {"name": "b", "shape": [2], "datatype": "BYTES", "data": ["x", "y"]}]}
    assert kserve_request(frame, declared) == by_column
    assert kserve_request({"a": np.array([1, 2]), "b": ["x", "y"]}, declared) == by_column
    assert kserve_request(by_column, declared) is by_column
    assert kserve_request(np.zeros((1, 2), dtype=np.float64), [{"name": "x"}])["inputs"][0]["datatype"] == "FP64"
    with pytest.raises(MlflowException, match="inputs lack b: the model takes a, b"):
        kserve_request({"a": [1]}, declared)
    with pytest.raises(MlflowException, match="pass a dict of them by name"):
        kserve_request([1, 2], declared)


def test_explain_and_run_local_say_they_are_not_supported(plugin: ModelportDeploymentClient) -> None:
    with pytest.raises(MlflowException, match="does not explain"):
        plugin.explain("fraud-prod", pd.DataFrame())
    with pytest.raises(MlflowException, match="no local mode"):
        mlflow_plugin.run_local("modelport", "fraud-prod", "models:/fraud/3")
    assert "modelport:/https://" in mlflow_plugin.target_help()


@pytest.mark.parametrize(("uri", "name"), [("models:/Fraud_Detector/3", "fraud-detector"),
                                           ("models:/fraud@champion", "fraud")])
def test_the_portal_model_is_named_after_the_registered_model(uri: str, name: str) -> None:
    assert portal_model_name(uri) == name


def test_bad_targets_config_and_model_uris_are_mlflow_errors_before_any_request(
    portal: FakePortal, plugin: ModelportDeploymentClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ModelportDeploymentClient("modelport:/https://portal.example.com").client.base_url == \
        "https://portal.example.com"
    with pytest.raises(MlflowException, match="must start with http:// or https://"):
        ModelportDeploymentClient("modelport:/portal.example.com")
    with pytest.raises(MlflowException, match="unknown config colour"):
        plugin.create_deployment("fraud-prod", "models:/fraud/3", config={"colour": "red"})
    with pytest.raises(MlflowException, match="deploys registered models"):
        plugin.create_deployment("fraud-prod", "runs:/abc/model")
    with pytest.raises(MlflowException, match="deployment name 'Fraud Prod'"):
        plugin.create_deployment("Fraud Prod", "models:/fraud/3")
    assert not portal.requests
    monkeypatch.delenv("MODELPORT_TOKEN")
    with pytest.raises(MlflowException, match="set MODELPORT_TOKEN"):
        ModelportDeploymentClient("modelport")
