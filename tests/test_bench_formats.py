"""The serving benchmark's CNN in three formats (bench/serving/run.py, endpoints.py, report.py, workloads.py): the
TorchScript and SavedModel endpoints are deployed with configuration e's settings, named for what they serve, left
out (with the command that adds the framework) when the runtime env lacks it, and reported side by side with ONNX.
No server runs here: the tables come from a results document made up for the test (the benchmark itself runs the
servers, `make bench`)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from bench.serving import endpoints, report, run
from bench.serving.workloads import FORMATS, WORKLOADS

DIGITS, RESNET, MINILM = WORKLOADS[1], WORKLOADS[2], WORKLOADS[3]


def test_endpoint_names_say_which_deployment_and_format_they_measure() -> None:
    assert endpoints.modelport_endpoint("e-torchscript-gateway") == ("e-torchscript", "torchscript")
    assert endpoints.modelport_endpoint("e-savedmodel-direct") == ("e-savedmodel", "savedmodel")
    assert endpoints.modelport_endpoint("e-gateway-json") == ("e", None)
    assert endpoints.modelport_endpoint("d-direct") == ("d", None)
    assert endpoints.modelport_endpoint("a") is None
    assert endpoints.modelport_endpoint("mlserver") is None
    # Written out, not derived: SERVERS is built from FORMAT_SERVERS, so "each is in SERVERS" could never fail.
    assert endpoints.FORMAT_SERVERS == ("e-torchscript-gateway", "e-torchscript-direct", "e-savedmodel-gateway",
                                  "e-savedmodel-direct")
    for server in endpoints.FORMAT_SERVERS:
        deployment, fmt = endpoints.modelport_endpoint(server) or ("", None)
        assert fmt in FORMATS and deployment == f"e-{fmt}", server


def test_the_other_formats_deploy_with_the_onnx_cnns_batching_settings() -> None:
    onnx = RESNET.deploy_models("e", 0)
    for key, fmt in FORMATS.items():
        models = RESNET.deploy_models("e", 0, key)
        assert [m["model"] for m in models] == [fmt.model]
        # Everything but the model is configuration e's: the same queue delay, 2 CPU instances.
        assert [{k: v for k, v in m.items() if k != "model"} for m in models] == \
               [{k: v for k, v in m.items() if k != "model"} for m in onnx]
        assert models[0]["dynamic_batching"] == {"max_queue_delay_microseconds": 0}
        assert models[0]["instance_group"] == {"count": 2, "kind": "cpu"}
        assert RESNET.request_model(key) == fmt.model
    assert RESNET.request_model(None) == "resnet"


def test_only_the_cnn_is_measured_in_other_formats() -> None:
    assert not set(run.selected_servers(DIGITS, list(endpoints.SERVERS))) & set(endpoints.FORMAT_SERVERS)
    assert not set(run.selected_servers(MINILM, list(endpoints.SERVERS))) & set(endpoints.FORMAT_SERVERS)
    assert set(endpoints.FORMAT_SERVERS) <= set(run.selected_servers(RESNET, list(endpoints.SERVERS)))
    with pytest.raises(ValueError, match="served as ONNX only"):
        DIGITS.deploy_models("e", 0, "torchscript")


def test_a_format_the_runtime_env_cannot_serve_is_left_out_with_the_command_that_adds_it() -> None:
    servers = ["a", "e-gateway", "e-torchscript-gateway", "e-torchscript-direct", "e-savedmodel-gateway"]
    kept, notes = run.servable(servers, {"torch": "2.13.0"})
    assert kept == ["a", "e-gateway", "e-torchscript-gateway", "e-torchscript-direct"]
    assert notes == ["TensorFlow SavedModel left out (e-savedmodel-gateway): the runtime env has no tensorflow; add "
                     "it with `make bench RUNTIME_EXTRAS=torch,tensorflow`"]
    assert run.servable(servers, {}) == (["a", "e-gateway"], [notes[0].replace(
        "TensorFlow SavedModel left out (e-savedmodel-gateway): the runtime env has no tensorflow",
        "TorchScript left out (e-torchscript-gateway, e-torchscript-direct): the runtime env has no torch"), notes[0]])
    assert run.servable(servers, {"torch": "2.13.0", "tensorflow": "2.21.0"}) == (servers, [])
    # Nothing to leave out when no other format was asked for.
    assert run.servable(["e-gateway"], {}) == (["e-gateway"], [])


def _row(server: str, concurrency: int, throughput: float, model: str | None = None) -> dict[str, Any]:
    spread = lambda v: {"median": v, "min": v * 0.9, "max": v * 1.1}  # noqa: E731
    row: dict[str, Any] = {
        "server": server, "concurrency": concurrency, "repeats": 1, "errors": 0, "throughput": spread(throughput),
        "p50_ms": spread(10.0), "p95_ms": spread(15.0), "p99_ms": spread(20.0), "machine_cores_busy": spread(1.9),
        "cpu_ms_per_request": {"loadgen": 0.1, "triton": 0.4, "machine": 0.7,
                               **({"gateway": 0.12} if "gateway" in server else {})}}
    if model:
        row["triton"] = {model: {"requests": 100, "mean_batch": 3.5, "queue_ms": 0.5, "compute_infer_ms": 2.0}}
    return row


def _document() -> dict[str, Any]:
    rows = []
    for server, model, rate in (("e-gateway", "resnet", 3000), ("e-direct", "resnet", 4500),
                                ("e-torchscript-gateway", "resnet-torchscript", 1500),
                                ("e-torchscript-direct", "resnet-torchscript", 1800),
                                ("e-savedmodel-gateway", "resnet-savedmodel", 1200)):
        rows += [_row(server, 1, rate / 3, model), _row(server, 32, rate, model)]
    summary = {"rows": rows, "bound": {"median": 16000, "min": 16000, "max": 16000},
               "model_bound": {"median": 16000, "min": 16000, "max": 16000}, "bound_batches": [(32, 16)]}
    check = {"endpoints": 5, "max_abs_difference": 3e-6,
             "max_abs_difference_by_endpoint": {"e-gateway": 0.0, "e-direct": 0.0, "e-torchscript-gateway": 2e-6,
                                                "e-torchscript-direct": 2e-6, "e-savedmodel-gateway": 3e-6}}
    return {"settings": {"queue_delay_us": 0},
            "workloads": [{"workload": "resnet", "number": 2, "title": RESNET.title, "item": RESNET.item,
                           "summary": summary, "check": check}]}


def test_the_report_puts_the_three_formats_side_by_side() -> None:
    table = report.markdown(_document())
    assert "#### The CNN in three formats" in table
    assert "queue delay 0 µs, 2 instances" in table
    assert ("| ONNX | e-gateway | 1000 (900–1100) | 3000 (2700–3300) | 10.0 | 20.0 | 0.40 | 0.12 | 0.62 | 3.5 | 0 |"
            in table)
    assert ("| TorchScript | e-torchscript-direct | 600 (540–660) | 1800 (1620–1980) | 10.0 | 20.0 | 0.40 | 0.00 | "
            "0.50 | 3.5 | 2e-06 |" in table)
    assert "| TensorFlow SavedModel | e-savedmodel-gateway | 400 (360–440) | 1200 (1080–1320) |" in table
    assert ("TorchScript gateway 0.50x, TorchScript direct 0.40x, TensorFlow SavedModel gateway 0.40x." in table)
    # The per-workload table shows each format's Triton statistics under the CNN's step, not a dash.
    assert "| e-savedmodel-gateway | 0.10 | 0.12 | 0.40 | 0.08 | 3.5, 0.50, 2.00 |" in table


def test_a_run_without_other_formats_has_no_format_table() -> None:
    document = _document()
    summary = document["workloads"][0]["summary"]
    summary["rows"] = [r for r in summary["rows"] if r["server"] not in endpoints.FORMAT_SERVERS]
    assert "three formats" not in report.markdown(document)


def test_every_endpoint_has_a_style_in_the_plots() -> None:
    # plots.py runs in the bench env (matplotlib), not in the portal's: read its two tables without importing it.
    tree = ast.parse((Path(run.SERVING_DIR) / "plots.py").read_text())
    tables = {node.targets[0].id: ast.literal_eval(node.value) for node in tree.body
              if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
              and node.targets[0].id in ("STYLE", "LABELS")}
    assert set(endpoints.SERVERS) <= set(tables["STYLE"])
    assert set(endpoints.SERVERS) <= set(tables["LABELS"])
