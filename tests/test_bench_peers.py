"""The serving benchmark's peers (bench/serving/peers.py, run.py, report.py): every peer is sent the same tensor in
its own request format and its answer is read back as the workload's outputs; the tables and the issue's targets
compare Modelport with the best peer. No server runs here: the requests and answers are checked as bytes, the tables
from a results document made up for the test (the benchmark itself runs the servers, `make bench`)."""

from __future__ import annotations

import json
import struct
import sys
from typing import Any

import numpy as np
import pytest

from bench.serving import batch_log, endpoints, peers, report, run
from bench.serving.batch_log import BatchLog
from bench.serving.kserve import HEADER_LENGTH, decode_request, encode_response
from bench.serving.workloads import MINILM_SENTENCE, WORKLOADS

RESNET, MINILM, DIGITS = WORKLOADS[2], WORKLOADS[3], WORKLOADS[1]


def _image() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((1, 3, 64, 64)).astype(np.float32)


def _text() -> np.ndarray:
    text = np.empty((1, 1), dtype=np.object_)
    text[0, 0] = MINILM_SENTENCE.encode()
    return text


def test_every_peer_is_sent_the_same_image() -> None:
    image = _image()
    for peer in peers.PEERS:
        body, headers = peers.request(peer, RESNET, {"input": image})
        assert headers["Content-Type"] == "application/json"
        assert HEADER_LENGTH not in headers  # no peer here speaks the binary tensor extension
        if peer == "mlserver":
            inputs, requested = decode_request(body, None)
            sent = inputs["input"]
            assert requested == [("logits", False)]
        else:
            sent = np.asarray(json.loads(body)["input"], dtype=np.float32)
        # BentoML's batchable API takes the batch dimension, LitServe one item.
        np.testing.assert_array_equal(sent, image if peer != "litserve" else image[0])


def test_every_peer_is_sent_the_same_sentence() -> None:
    for peer in peers.PEERS:
        body, _ = peers.request(peer, MINILM, {"text": _text()})
        if peer == "mlserver":
            assert decode_request(body, None)[0]["text"].tolist() == [[MINILM_SENTENCE.encode()]]
        else:
            sent = json.loads(body)["text"]
            assert sent == ([MINILM_SENTENCE] if peer == "bentoml" else MINILM_SENTENCE)


def test_each_peers_answer_reads_back_as_the_workloads_outputs() -> None:
    logits = np.arange(10, dtype=np.float32).reshape(1, 10) / 7
    bodies = {
        "mlserver": encode_response("resnet", {"logits": logits}, [("logits", False)]),
        "bentoml": (json.dumps(logits.tolist()).encode(), {}),
        "litserve": (json.dumps({"logits": logits[0].tolist()}).encode(), {}),
    }
    for peer, (body, headers) in bodies.items():
        outputs = peers.answer(peer, RESNET, body, headers)
        assert outputs["logits"].shape == (1, 10), peer
        np.testing.assert_allclose(outputs["logits"], logits, rtol=1e-6)


def test_a_peer_error_body_is_not_mistaken_for_an_answer() -> None:
    with pytest.raises(KeyError):
        peers.answer("litserve", RESNET, b'{"detail": "Request timed out"}', {})
    with pytest.raises(ValueError):
        peers.answer("mlserver", RESNET, b'{"error": "model not ready"}', {})


def test_the_peers_and_json_endpoints_skip_the_digits_workload() -> None:
    chosen = run.selected_servers(DIGITS, list(endpoints.SERVERS))
    assert not set(chosen) & {*peers.PEERS, "e-gateway-json"}
    assert run.selected_servers(RESNET, list(endpoints.SERVERS)) == list(endpoints.SERVERS)
    assert run.selected_servers(RESNET, ["e-gateway", "mlserver"]) == ["mlserver", "e-gateway"]


def _row(server: str, concurrency: int, throughput: float, p99: float) -> dict[str, Any]:
    spread = lambda v: {"median": v, "min": v, "max": v}  # noqa: E731
    return {"server": server, "concurrency": concurrency, "repeats": 1, "errors": 0,
            "throughput": spread(throughput), "p50_ms": spread(p99 / 2), "p95_ms": spread(p99 * 0.9),
            "p99_ms": spread(p99), "machine_cores_busy": spread(2.0),
            "cpu_ms_per_request": {"loadgen": 0.1, "server": 1.0, "machine": 1.2}}


def _document() -> dict[str, Any]:
    rows = [_row("mlserver", 32, 300, 120), _row("bentoml", 32, 400, 150), _row("litserve", 32, 200, 90),
            _row("e-gateway", 32, 1200, 40), _row("e-gateway-json", 32, 900, 60), _row("mlserver", 1, 80, 15)]
    rows[0]["peer_mean_batch"] = 5.5
    summary = {"rows": rows, "bound": {"median": 16000, "min": 16000, "max": 16000},
               "model_bound": {"median": 16000, "min": 16000, "max": 16000}, "bound_batches": [(32, 16)]}
    return {"settings": {"peer_batch_window_ms": 2.0},
            "versions": {"peers": {"mlserver": {"mlserver": "1.7.1", "onnxruntime": "1.32.0", "numpy": "2.4.6"}}},
            "workloads": [{"workload": "resnet", "number": 2, "title": RESNET.title, "item": RESNET.item,
                           "summary": summary, "idle_cores": {"litserve": 0.21, "mlserver": 0.01},
                           "request_bytes": {"mlserver": 253570, "e-gateway": 49341}}]}


def test_the_targets_compare_modelport_with_the_best_peer_by_throughput() -> None:
    checks = report.peer_targets(_document()["workloads"])
    values = {c["target"]: (c["value"], c["met"]) for c in checks}
    # The best peer is bentoml (400 req/s), not litserve, which has the lowest p99.
    assert values["throughput of e-gateway / best peer (bentoml) at concurrency 32 >= 2.5"] == (3.0, True)
    assert values["p99 of best peer (bentoml) / p99 of e-gateway at concurrency 32 >= 2.6"] == (3.75, True)
    assert values["throughput of e-gateway-json / best peer (bentoml) at concurrency 32 >= 2.5"] == (2.25, False)
    assert values["p99 of best peer (bentoml) / p99 of e-gateway-json at concurrency 32 >= 2.6"] == (2.5, False)


def test_the_gateway_targets_read_its_cpu_per_json_request_and_binary_against_direct() -> None:
    document = _document()
    rows = document["workloads"][0]["summary"]["rows"]
    rows[4]["cpu_ms_per_request"] = {"loadgen": 0.3, "gateway": 0.45, "triton": 2.0, "machine": 3.0}
    rows += [_row("e-gateway", 16, 900, 20), _row("e-direct", 16, 1000, 18)]  # p50s: 10 and 9 ms
    values = {c["target"]: (c["value"], c["met"]) for c in report.peer_targets(document["workloads"])}
    assert values["gateway CPU ms per e-gateway-json request at concurrency 32 <= 0.6"] == (0.45, True)
    assert values["throughput of e-gateway / e-direct at concurrency 16 >= 0.85"] == (0.9, True)
    assert values["p50 of e-gateway - p50 of e-direct at concurrency 16 <= 0.5 ms"] == (1.0, False)
    # Without those runs (no 16 clients, no gateway CPU recorded) the rows are left out, not made up.
    assert not [c for c in report.peer_targets(_document()["workloads"]) if "gateway CPU" in c["target"]
                or "e-direct" in c["target"]]


def test_the_tables_have_a_row_per_peer_and_the_comparison() -> None:
    for result in _document()["workloads"]:
        assert report.best_peer(result["summary"], 32)["server"] == "bentoml"
    table = report.markdown(_document())
    for peer in peers.PEERS:
        assert f"\n| {peer} | " in table
    assert "| mlserver: MLServer, custom MLModel runtime, adaptive batching | 1.7.1 | 1.32.0, 2.4.6 |" in table
    assert "max_batch_time 2.0 ms" in table
    assert "| 2 resnet | bentoml | 400 | 150.0 | e-gateway | 1200 | 40.0 | 3.00x | 3.75x |" in table
    assert "litserve 0.21" in table
    assert "| mlserver | 0.10 | 0.00 | 1.00 | 0.10 | 5.5, —, — |" in table  # its batches, from batch_log
    assert ("| resnet | throughput of e-gateway-json / best peer (bentoml) at concurrency 32 >= 2.5 | 2.25 | no |"
            in table)


def test_a_batch_window_of_zero_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["run.py", "--peers-only", "--peer-batch-window-ms", "0"])
    with pytest.raises(SystemExit) as exit_info:
        run.main()
    assert exit_info.value.code == 2
    assert "--peer-batch-window-ms must be above 0" in capsys.readouterr().err


def test_an_unknown_server_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["run.py", "--servers", "e-gateway,ray"])
    with pytest.raises(SystemExit):
        run.main()
    assert "unknown servers ['ray']" in capsys.readouterr().err


def test_the_batch_log_counts_calls_and_items_per_process(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCH_BATCH_LOG", str(tmp_path / "batches"))
    log = BatchLog()
    for items in (1, 4, 7):
        log.record(items)
    assert batch_log.read(tmp_path / "batches") == (3, 12)
    # A second inference process writes its own file; the reader sums them.
    (tmp_path / "batches" / "1.bin").write_bytes(struct.pack("<QQ", 2, 64))
    assert batch_log.read(tmp_path / "batches") == (5, 76)


def test_the_batch_log_does_nothing_outside_the_benchmark(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCH_BATCH_LOG", raising=False)
    BatchLog().record(3)
    assert batch_log.read(tmp_path / "nothing") == (0, 0)
