"""The inspection's hard time limit (issue 21) in a real prefork worker of the inspection lane (infra/lanes.py): an
inspection the soft limit cannot stop is killed, the lane goes on inspecting, and the periodic sweep then marks the
version invalid with the reason.

What the soft limit cannot stop: Celery raises it from a signal handler, and Python runs signal handlers only between
bytecodes of the main thread, so a long call into C code defers it until the call returns. onnx.load (protobuf's C
parser) and onnx.checker.check_model (C++) are such calls: on this machine a 30 MB ONNX file of a million Identity
nodes holds each of them for seconds, and a handler due 0.2 s into the checker ran only when it returned 1.6 s later.
Uploads may be gigabytes, so the hard limit is what bounds such an inspection, not a mere backstop. The model here has
three million nodes (93 MB), built on the wire format directly (seconds, where onnx.helper would take a minute).

Small limits through the worker's environment: the soft one at INSPECTION_TIME_LIMIT_SECONDS (6 s), the kill one
second later (INSPECTION_KILL_GRACE_SECONDS), both well inside onnx.load of this file."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone
from google.protobuf.internal.encoder import _VarintBytes
from onnx import TensorProto, helper

from infra.lanes import lane
from models_registry import dispatch
from models_registry.models import ModelVersion
from models_registry.tasks import dispatch_inspections
from tests import processes
from tests.artifacts import tiny_onnx
from tests.support.people import Person, make_person

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

LIMIT_SECONDS = 6
GRACE_SECONDS = 1
NODES = 3_000_000  # so that onnx.load is still parsing at both limits (at two million the soft one once fell after it)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _VarintBytes(number << 3 | 2) + _VarintBytes(len(payload)) + payload


def long_chain_onnx(nodes: int) -> bytes:
    """A valid ONNX model: x through `nodes` Identity nodes. GraphProto.node is field 1 (NodeProto: input 1, output 2,
    op_type 4), ModelProto.graph field 7; serialized messages concatenate into one."""
    chain = b"".join(_field(1, _field(1, b"x" if i == 0 else b"t%d" % (i - 1)) + _field(2, b"t%d" % i)
                            + _field(4, b"Identity")) for i in range(nodes))
    ends = helper.make_graph([], "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 1])],
                             [helper.make_tensor_value_info(f"t{nodes - 1}", TensorProto.FLOAT, [-1, 1])])
    model = helper.make_model(helper.make_graph([], "chain", [], []), opset_imports=[helper.make_opsetid("", 13)])
    model.ClearField("graph")
    return model.SerializeToString() + _field(7, chain + ends.SerializeToString())


@pytest.fixture(scope="module")
def chain_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("chain") / "chain.onnx"
    path.write_bytes(long_chain_onnx(NODES))
    return path


@pytest.fixture
def inspection_lane(transactional_db: Any, tmp_path: Path) -> Iterator[Path]:
    processes.purge_broker()
    started = processes.start_lanes((lane("inspection"),), tmp_path, {
        "TRIAL_RUN_TIMEOUT_SECONDS": "5", "INSPECTION_TIME_LIMIT_SECONDS": str(LIMIT_SECONDS),
        "INSPECTION_KILL_GRACE_SECONDS": str(GRACE_SECONDS)})
    try:
        yield tmp_path / "worker-inspection.log"
    finally:
        for process in started:
            processes.kill(process)
        processes.print_logs(tmp_path)


def upload(person: Person, model: str, name: str, data: bytes) -> int:
    client = person.client()
    client.post("/api/v1/models/", {"name": model}, format="json")
    response = client.post(f"/api/v1/models/{model}/versions/", {"file": SimpleUploadedFile(name, data)},
                           format="multipart")
    assert response.status_code == 201, response.json()
    return ModelVersion.objects.get(model__name=model).pk


def test_an_inspection_stuck_in_c_code_is_killed_at_the_hard_limit_and_marked_invalid_by_the_sweep(
        inspection_lane: Path, chain_onnx: Path, settings: Any) -> None:
    # Celery puts the sending process' limits into the message, and the worker obeys the message: this process queues
    # the inspection (tasks.send_inspection reads the settings at each send), so it needs the small limits too.
    settings.INSPECTION_TIME_LIMIT_SECONDS, settings.INSPECTION_KILL_GRACE_SECONDS = LIMIT_SECONDS, GRACE_SECONDS
    alice, charlie = make_person("alice", "acme", role="admin"), make_person("charlie", "globex", role="admin")
    stuck = upload(alice, "chain", "chain.onnx", chain_onnx.read_bytes())
    hard = f"Hard time limit ({LIMIT_SECONDS + GRACE_SECONDS:g}s) exceeded for models_registry.tasks.inspect_version"
    # Which limit ends it depends on where onnx.load is when the soft limit falls due (a busy machine shifts it):
    # either way the inspection ends at its limit. Hard: the child is killed, the version left for the sweep.
    def ended() -> bool:
        return ("signal 9 (SIGKILL)" in inspection_lane.read_text(errors="replace")
                or ModelVersion.objects.get(pk=stuck).status == ModelVersion.Status.INVALID)

    processes.wait_for(ended, 240, what="the inspection to be ended at its limit")
    log = inspection_lane.read_text(errors="replace")
    version = ModelVersion.objects.get(pk=stuck)
    killed = "signal 9 (SIGKILL)" in log
    if killed:
        assert hard in log, log[-3000:]
        assert "Soft time limit" in log  # it was due, and could not run: onnx.load was still parsing
        assert version.status == ModelVersion.Status.VALIDATING, version.error  # nothing in the killed child ran on
    else:  # the soft limit got through between two C calls
        assert version.error == dispatch.time_limit_message()
    assert version.inspection_started_at is not None

    # The pool replaced its child: another team's upload is inspected meanwhile.
    other = upload(charlie, "tiny", "model.onnx", tiny_onnx())
    processes.wait_for(lambda: ModelVersion.objects.get(pk=other).status == ModelVersion.Status.READY, 60,
                       what="another team's inspection")

    # The sweep (beat's dispatch_inspections, on the reconcile lane) marks it invalid once past both limits.
    past = version.inspection_started_at + timedelta(seconds=LIMIT_SECONDS + GRACE_SECONDS + 31)
    time.sleep(max(0.0, (past - timezone.now()).total_seconds()))
    dispatch_inspections()  # as beat runs it, in this process
    version.refresh_from_db()
    assert version.status == ModelVersion.Status.INVALID
    assert version.error == dispatch.time_limit_message()
    assert "INSPECTION_TIME_LIMIT_SECONDS" in version.error and f"{LIMIT_SECONDS} s" in version.error
    print(json.dumps({"killed_after_s": LIMIT_SECONDS + GRACE_SECONDS, "error": version.error}))
