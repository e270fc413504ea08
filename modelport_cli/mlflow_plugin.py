"""MLflow's deployments plugin for Modelport: `mlflow deployments create -t modelport -m models:/fraud/3 --name
fraud-prod` imports the registered model into the portal (source kind "mlflow": the portal fetches it from the
same tracking server), waits until it is validated, deploys it on Triton and waits until it serves.

Registered under the entry point group "mlflow.deployments" as "modelport" (pyproject.toml), installed with
`pip install "modelport[mlflow]"`. Target URI: `modelport` (the portal at MODELPORT_URL) or
`modelport:/https://portal.example.com`; the token is MODELPORT_TOKEN, as for the CLI.

Config (`-C key=value`): model_name (the portal's model; default: the registered name made a portal name),
runtime (local or kubernetes; default: the portal's), timeout (seconds of each wait, default 600),
new_version (true: import again even if this source was imported already).
"""

from __future__ import annotations

import os
import re
import time
from typing import Any
from urllib.parse import quote

from mlflow.deployments import BaseDeploymentClient, PredictionsResponse
from mlflow.exceptions import MlflowException

from modelport_cli.client import ApiError, Client
from modelport_cli.errors import CliError
from modelport_cli.main import NAME_RE, NAME_RULE

TARGET = "modelport"
DEFAULT_TIMEOUT = 600.0
POLL_INTERVAL = 1.0
CONFIG_KEYS = frozenset({"model_name", "runtime", "timeout", "new_version"})

# numpy's dtype kinds and sizes as KServe v2 datatypes: what an input array becomes when the model's metadata is
# not the guide (it is whenever the gateway answers it).
_KSERVE_OF_NUMPY = {"b1": "BOOL", "i1": "INT8", "i2": "INT16", "i4": "INT32", "i8": "INT64", "u1": "UINT8",
                    "u2": "UINT16", "u4": "UINT32", "u8": "UINT64", "f2": "FP16", "f4": "FP32", "f8": "FP64"}
_NUMPY_OF_KSERVE = {v: k for k, v in _KSERVE_OF_NUMPY.items()}


def _segment(name: str) -> str:
    return quote(name, safe="")


def portal_model_name(model_uri: str) -> str:
    """The portal's name for a registered model: models:/Fraud_Detector/3 -> fraud-detector (the portal's
    names are lowercase letters, digits and hyphens)."""
    match = re.fullmatch(r"models:/([^/@\s]+)(?:/[^/@\s]+|@[^/@\s]+)", model_uri)
    if not match:
        raise MlflowException(f"{model_uri!r}: the modelport target deploys registered models, "
                              "models:/NAME/VERSION or models:/NAME@ALIAS")
    name = re.sub(r"[^a-z0-9-]+", "-", match.group(1).lower()).strip("-")[:63].strip("-")
    if not NAME_RE.fullmatch(name):
        raise MlflowException(f"{match.group(1)!r} makes no portal model name: pass -C model_name=NAME ({NAME_RULE})")
    return name


def _portal_url(target_uri: str) -> str:
    """`modelport` -> MODELPORT_URL; `modelport:/https://host` -> https://host."""
    rest = target_uri[len(TARGET):] if target_uri.startswith(TARGET) else target_uri
    url = rest.removeprefix(":/").removeprefix(":") if rest else os.environ.get("MODELPORT_URL", "")
    if not url:
        raise MlflowException("no portal URL: set MODELPORT_URL or use the target modelport:/https://PORTAL-HOST")
    if not url.startswith(("http://", "https://")):
        raise MlflowException(f"target {target_uri!r}: the portal URL must start with http:// or https://")
    return url


def _config(config: dict[str, Any] | None) -> dict[str, Any]:
    config = dict(config or {})
    unknown = set(config) - CONFIG_KEYS
    if unknown:
        raise MlflowException(f"unknown config {', '.join(sorted(unknown))}: the modelport target takes "
                              f"{', '.join(sorted(CONFIG_KEYS))}")
    if "timeout" in config:
        try:
            config["timeout"] = float(config["timeout"])
        except (TypeError, ValueError):
            raise MlflowException(f"config timeout={config['timeout']!r}: give a number of seconds") from None
    if "new_version" in config:
        config["new_version"] = str(config["new_version"]).lower() in ("1", "true", "yes")
    return config


class ModelportDeploymentClient(BaseDeploymentClient):  # type: ignore[misc]
    def __init__(self, target_uri: str) -> None:
        super().__init__(target_uri)
        token = os.environ.get("MODELPORT_TOKEN", "")
        if not token:
            raise MlflowException("no API token: set MODELPORT_TOKEN (a token of the portal, as for the CLI)")
        self.client = Client(_portal_url(target_uri), token)

    # ------------------------------------------------------------------------------------------------ the portal

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.client.call(method, path, **kwargs)
        except CliError as exc:  # ApiError and NetworkError: one line that says what failed
            raise MlflowException(str(exc)) from None
        return response.json() if response.content else None

    def _wait(self, path: str, done: Any, timeout: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            body = dict(self._call("GET", path))
            if done(body):
                return body
            if time.monotonic() >= deadline:
                raise MlflowException(f"timed out after {timeout:g} s waiting for {what} (status {body.get('status')})")
            time.sleep(POLL_INTERVAL)

    def _import(self, model_uri: str, config: dict[str, Any]) -> tuple[str, int]:
        """The registered model as a ready version of the portal: (model, version number)."""
        derived = portal_model_name(model_uri)  # also the check of the URI's form, before any request
        model = str(config.get("model_name") or derived)
        if not NAME_RE.fullmatch(model):
            raise MlflowException(f"config model_name={model!r}: {NAME_RULE}")
        body: dict[str, Any] = {"source": {"kind": "mlflow", "uri": model_uri}, "create_model": True}
        if config.get("new_version"):
            body["new_version"] = True
        version = dict(self._call("POST", f"/api/v1/models/{_segment(model)}/versions/", json=body))
        number = int(version["number"])

        def validated(current: dict[str, Any]) -> bool:
            if current.get("status") in ("invalid", "cancelled"):
                raise MlflowException(f"{model} version {number} is {current.get('status')}: "
                                      f"{current.get('error') or 'no reason given'}")
            return current.get("status") == "ready"

        self._wait(f"/api/v1/models/{_segment(model)}/versions/{number}/", validated,
                   config.get("timeout", DEFAULT_TIMEOUT), f"{model} version {number} to be imported and validated")
        return model, number

    def _wait_serving(self, name: str, revision: int, timeout: float) -> dict[str, Any]:
        def serving(body: dict[str, Any]) -> bool:
            if body.get("status") == "failed":
                lines = str(body.get("status_message") or "").strip().splitlines()
                raise MlflowException(f"deployment {name} failed: {lines[0] if lines else 'no reason given'}")
            current = int(body.get("revision") or 0)
            return bool(body.get("status") == "ready" and body.get("serving_revision") == current
                        and current >= revision)

        return self._wait(f"/api/v1/deployments/{_segment(name)}/", serving, timeout,
                          f"{name} to serve revision {revision}")

    @staticmethod
    def _described(deployment: dict[str, Any], flavor: str | None = None) -> dict[str, Any]:
        return {**deployment, "name": deployment.get("name"), "flavor": flavor or "triton"}

    # ------------------------------------------------------------------------------------------- MLflow's calls

    def create_deployment(self, name: str, model_uri: str, flavor: str | None = None,
                          config: dict[str, Any] | None = None, endpoint: str | None = None) -> dict[str, Any]:
        options = _config(config)
        if not NAME_RE.fullmatch(name):
            raise MlflowException(f"deployment name {name!r}: {NAME_RULE}")
        model, number = self._import(model_uri, options)
        body: dict[str, Any] = {"name": name, "models": [{"model": model, "version": number}]}
        if options.get("runtime"):
            body["runtime"] = options["runtime"]
        created = dict(self._call("POST", "/api/v1/deployments/", json=body))
        ready = self._wait_serving(name, int(created.get("revision") or 1), options.get("timeout", DEFAULT_TIMEOUT))
        return self._described(ready, flavor)

    def update_deployment(self, name: str, model_uri: str | None = None, flavor: str | None = None,
                          config: dict[str, Any] | None = None, endpoint: str | None = None) -> dict[str, Any]:
        options = _config(config)
        if options.get("runtime"):
            raise MlflowException("the runtime of a deployment cannot change: create another deployment for it")
        current = self.get_deployment(name)
        if model_uri is None:
            return self._described(current, flavor)
        model, number = self._import(model_uri, options)
        updated = dict(self._call("PATCH", f"/api/v1/deployments/{_segment(name)}/",
                                  json={"models": [{"model": model, "version": number}]}))
        revision = int(updated.get("revision") or 0)
        ready = self._wait_serving(name, revision, options.get("timeout", DEFAULT_TIMEOUT))
        return self._described(ready, flavor)

    def delete_deployment(self, name: str, config: dict[str, Any] | None = None,
                          endpoint: str | None = None) -> None:
        _config(config)
        try:
            self.client.call("DELETE", f"/api/v1/deployments/{_segment(name)}/")
        except ApiError as exc:
            if exc.status != 404:  # gone already: MLflow's delete is idempotent for its other targets too
                raise MlflowException(str(exc)) from None
        except CliError as exc:
            raise MlflowException(str(exc)) from None

    def list_deployments(self, endpoint: str | None = None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        path: str | None = "/api/v1/deployments/"
        while path:
            page = self._call("GET", path)
            if isinstance(page, list):
                rows.extend(page)
                break
            rows.extend(page.get("results") or [])
            path = page.get("next")
        return [self._described(row) for row in rows]

    def get_deployment(self, name: str, endpoint: str | None = None) -> dict[str, Any]:
        return self._described(dict(self._call("GET", f"/api/v1/deployments/{_segment(name)}/")))

    def predict(self, deployment_name: str | None = None, inputs: Any = None,
                endpoint: str | None = None) -> PredictionsResponse:
        if not deployment_name:
            raise MlflowException("predict needs the deployment's name")
        deployment = self.get_deployment(deployment_name)
        models = deployment.get("models") or []
        if len(models) != 1:
            raise MlflowException(f"{deployment_name} serves {len(models)} models: predict needs a deployment of one")
        model = str(models[0]["model"])
        base = f"/serve/{_segment(deployment_name)}/v2/models/{_segment(model)}"
        metadata = dict(self._call("GET", base))
        request = kserve_request(inputs, metadata.get("inputs") or [])
        answer = dict(self._call("POST", base + "/infer", json=request, idempotency_key=False))
        return PredictionsResponse({"predictions": predictions_of(answer)})

    def explain(self, deployment_name: str | None = None, df: Any = None, endpoint: str | None = None) -> Any:
        raise MlflowException("the modelport target does not explain predictions: Triton serves no explainer")


# ------------------------------------------------------------------------------------------------ request shapes


def _array(value: Any, datatype: str | None) -> Any:
    import numpy as np

    array = np.asarray(value)
    if datatype in _NUMPY_OF_KSERVE:
        return array.astype(_NUMPY_OF_KSERVE[datatype])
    if datatype == "BYTES" or array.dtype.kind in ("U", "S", "O"):
        return array.astype(str)
    return array


def _tensor(name: str, value: Any, datatype: str | None) -> dict[str, Any]:
    array = _array(value, datatype)
    kind = f"{array.dtype.kind}{array.dtype.itemsize}" if array.dtype.kind in "biuf" else ""
    return {"name": name, "shape": list(array.shape), "datatype": datatype or _KSERVE_OF_NUMPY.get(kind, "BYTES"),
            "data": array.flatten().tolist()}


def kserve_request(inputs: Any, declared: list[dict[str, Any]]) -> dict[str, Any]:
    """What MLflow's predict takes (a KServe v2 request as it is, a dict of named arrays, a pandas DataFrame, a
    numpy array or a list) as a KServe v2 request, cast to the datatypes the model declares.

    A DataFrame feeds a model of one input as one [rows, columns] tensor (the tabular case, a scikit-learn model
    made ONNX), and a model of several inputs one column each, by name."""
    if isinstance(inputs, dict) and isinstance(inputs.get("inputs"), list):
        return inputs
    types = {str(d.get("name")): d.get("datatype") for d in declared}
    names = [str(d.get("name")) for d in declared]
    if hasattr(inputs, "to_numpy") and hasattr(inputs, "columns"):  # a pandas DataFrame, without importing pandas
        if len(names) == 1:
            return {"inputs": [_tensor(names[0], inputs.to_numpy(), types[names[0]])]}
        inputs = {str(column): inputs[column].to_numpy() for column in inputs.columns}
    if isinstance(inputs, dict):
        missing = [n for n in names if n not in inputs]
        if missing:
            raise MlflowException(f"inputs lack {', '.join(missing)}: the model takes {', '.join(names)}")
        return {"inputs": [_tensor(str(k), v, types.get(str(k))) for k, v in inputs.items()]}
    if len(names) != 1:
        raise MlflowException(f"the model takes {len(names)} inputs ({', '.join(names)}): pass a dict of them by name")
    return {"inputs": [_tensor(names[0], inputs, types[names[0]])]}


def predictions_of(answer: dict[str, Any]) -> Any:
    """A KServe v2 answer as MLflow's predictions: the one output's values in its shape, or a dict of them."""
    import numpy as np

    def values(output: dict[str, Any]) -> Any:
        data = np.asarray(output.get("data") or [])
        shape = output.get("shape") or [len(data)]
        return data.reshape(shape).tolist() if data.size == int(np.prod(shape)) else data.tolist()

    outputs = answer.get("outputs") or []
    if len(outputs) == 1:
        return values(outputs[0])
    return {str(output.get("name")): values(output) for output in outputs}


def run_local(target: str, name: str, model_uri: str, flavor: str | None = None,
              config: dict[str, Any] | None = None) -> None:
    raise MlflowException("the modelport target has no local mode: run the portal (make dev) and deploy to it, or "
                          "use `mlflow models serve` to try a model on this machine")


def target_help() -> str:
    return __doc__ or ""
