"""Issue 30's compressed JSON bomb against the real web process (uvicorn with portal/web_server.py's protocol, serving
portal.asgi, as bin/run-portal starts it) on a real socket, in front of a real Triton: while one team sends several
deflate bombs at once to its own deployment, another team's client keeps getting /healthz and its inferences
answered within a bounded latency, the bombs are refused early with a 413 that says how to send large tensors, and
the web process's memory stays bounded.

Before the fix each bomb was inflated whole on the event loop (about 0.3 s per 64 MB here, the loop held meanwhile)
and parsed by simdjson holding the GIL, at about 14 bytes of memory per byte of JSON: the attacker's 260 KB bodies
of 267 MB held the victim for 7-11 s and grew the process to 9.4 GB. These bombs inflate to 64 MB (so that the old
code's run of this test stays within the machine's memory); the bounds are generous for a loaded machine."""

from __future__ import annotations

import os
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from conftest import Person, make_person
from deployments.render import render_repository
from deployments.runtimes.local import backends, readiness, serverlog
from deployments.runtimes.local import triton as lt
from deployments.spec import RepositorySpec, ServedModel
from gateway.tests.conftest import make_deployment
from gateway.tests.infer_bodies import OK, j
from modelport.core.runtime_env import find_runtime_env
from tests import processes

pytestmark = [pytest.mark.triton, pytest.mark.worker, pytest.mark.django_db(transaction=True)]

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNTIME_ENV = Path(os.environ.get("MODELPORT_RUNTIME_ENV", str(REPO_ROOT / "var" / "runtime-env")))
BOMB_ELEMENTS = 32 * 1024**2  # INT8 zeros: `0,` each, 64 MB of JSON
ATTACKERS = 4
ATTACK_SECONDS = 10.0
# The victim's worst wait for one request while the bombs fly: generous for a machine shared with other work (a
# quiet one answers within 0.1 s); the old code held it for seconds.
VICTIM_BOUND_SECONDS = 1.5
# The web process's resident memory while the bombs fly (it starts near 150 MB); each bomb cost the old code ~1 GB.
MEMORY_BOUND_BYTES = 700 * 1024**2


def bomb() -> bytes:
    body = (b'{"inputs": [{"name": "input", "shape": [%d], "datatype": "INT8", "data": [' % BOMB_ELEMENTS
            + b"0," * (BOMB_ELEMENTS - 1) + b"0]}]}")
    return zlib.compress(body, 9)


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from models_registry.samples import make_digits_onnx

    if not RUNTIME_ENV.is_dir():
        pytest.skip(f"no runtime env at {RUNTIME_ENV}: create it from requirements-runtime.txt")
    env = find_runtime_env(RUNTIME_ENV)
    work = tmp_path_factory.mktemp("bombs")
    digits = make_digits_onnx(work / "digits.onnx")
    spec = RepositorySpec(models=(ServedModel(name="digits", version=1, format="onnx", signature=digits.signature,
                                              max_batch_size=64, artifact_path=work / "digits.onnx"),))
    render_repository(spec, "local", work / "repo")
    process = lt.start_server(work / "repo", work / "var" / "triton.log", env, backends.build_backend_dir(env,
                                                                                                      work / "var"))
    try:
        ready = readiness.wait_ready(process, ["digits"], timeout=120)
        assert ready.ready, f"{ready.message}\n{serverlog.tail_log(process.log_path, 60)}"
        yield f"http://127.0.0.1:{process.http_port}"
    finally:
        lt.stop_server(process.pid, grace_seconds=10)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def test_deflate_bombs_from_one_team_leave_the_others_answered_and_the_web_process_bounded(
        tmp_path: Path, triton: str) -> None:
    attacker: Person = make_person("mallory", "evil", role="admin")
    victim: Person = make_person("charlie", "globex", role="admin")
    make_deployment(attacker, "mine", "http://127.0.0.1:9")  # its own; the bombs never need to reach a Triton
    make_deployment(victim, "digits-prod", triton)
    port = processes.free_port()
    log = tmp_path / "web.log"
    web = processes.start_web(log, port)
    base = f"http://127.0.0.1:{port}"
    try:
        processes.wait_for(lambda: _healthz(base)[0] == 200, 60, what="the web server")
        infer = f"{base}/serve/digits-prod/v2/models/digits/infer"
        auth = {"Authorization": f"Bearer {victim.token}"}
        processes.wait_for(lambda: requests.post(infer, data=j(OK), headers=auth, timeout=30).status_code == 200, 60,
                           what="the victim's first inference")
        payload = bomb()
        assert len(payload) < 200_000
        stop = threading.Event()
        peak = [rss(web.pid)]

        def watch_memory() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss(web.pid))
                time.sleep(0.05)

        def attack() -> list[tuple[int, str]]:
            answers = []
            with requests.Session() as session:
                while not stop.is_set():
                    reply = session.post(f"{base}/serve/mine/v2/models/digits/infer", data=payload, timeout=120,
                                         headers={"Authorization": f"Bearer {attacker.token}",
                                                  "Content-Encoding": "deflate"})
                    answers.append((reply.status_code, reply.text[:400]))
            return answers

        waits: list[tuple[str, int, float]] = []
        with ThreadPoolExecutor(ATTACKERS + 1) as pool:
            memory = pool.submit(watch_memory)
            attacks = [pool.submit(attack) for _ in range(ATTACKERS)]
            time.sleep(1.0)  # the bombs under way
            ends = time.monotonic() + ATTACK_SECONDS
            try:
                while time.monotonic() < ends:
                    status, took = _healthz(base)
                    waits.append(("healthz", status, took))
                    started = time.monotonic()
                    answer = requests.post(infer, data=j(OK), headers=auth, timeout=60)
                    waits.append(("infer", answer.status_code, time.monotonic() - started))
            finally:
                stop.set()
            bombs = [answer for future in attacks for answer in future.result()]
            memory.result()
        worst = max(took for _, _, took in waits)
        summary = (f"victim: {len(waits)} requests, worst {worst:.2f} s, statuses {sorted({s for _, s, _ in waits})}; "
                   f"bombs: {len(bombs)}, statuses {sorted({s for s, _ in bombs})}; "
                   f"web process peak RSS {peak[0] / 1024**2:.0f} MB")
        print(summary)
        assert all(status == 200 for _, status, _ in waits), summary
        assert worst < VICTIM_BOUND_SECONDS, summary
        assert peak[0] < MEMORY_BOUND_BYTES, summary
        assert bombs and all(status == 413 for status, _ in bombs), summary
        assert "binary tensor extension" in bombs[0][1] and "inflates to over" in bombs[0][1], bombs[0][1]
        assert len(bombs) > 4 * ATTACKERS, summary  # refused early: each one cheap
    finally:
        processes.kill(web)
        print("--- web.log ---\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:]))


def _healthz(base: str) -> tuple[int, float]:
    started = time.monotonic()
    try:
        status = requests.get(f"{base}/healthz", timeout=60).status_code
    except requests.RequestException:
        status = 0
    return status, time.monotonic() - started
