#!/usr/bin/env python
"""Upload benchmark: a large file through the tus endpoint (/api/v1/uploads/) to filesystem storage.

Everything runs in a temporary directory outside the repository: a fresh SQLite database, the artifact root, the web
process's temp files and the generated source file, all removed at the end. The web process is uvicorn serving
portal.asgi with one worker, as `make run` starts it; a fresh one is started for every run, so that one run's memory
does not hide in the next one's baseline.

Paths (both by default, runs interleaved, so that one run compares them on the same machine state):
  thin      portal.asgi:application, as `make run` serves it: PATCH bodies stream into storage (tus_asgi)
  django    bench.upload_baseline:application: the same stack without the thin path, PATCH bodies spooled by
            Django's ASGI handler before the view (what the portal did before)

Modes:
  chunked   PATCH requests of --chunk-mb (default 256 MiB)
  single    the whole file in one streamed PATCH
  checksum  as chunked, each PATCH with an Upload-Checksum (sha256) header, so the server hashes what it receives

    .venv/bin/python bench/upload_bench.py                  # 2 GiB, every mode and path, 3 runs each
    .venv/bin/python bench/upload_bench.py --size-mb 256 --repeat 1    # a quick run
    .venv/bin/python bench/upload_bench.py --profile        # also sample the web process with py-spy

While a file uploads, a probe sends a request answered by the gateway on the same event loop every 20 ms
(`GET /serve/none/v2/health/ready`, a 401 that needs no database) and records its latency: what the upload costs
everyone else served by that web process.

Targets: a median >= 200 MiB/s and web-process peak RSS growth < 100 MiB per mode and path, and the thin path at
least as fast as the django path (the ratio of medians >= 1) with no more RSS growth. Results:
bench/results/upload-<time>.json.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import http.client
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MiB = 1024 * 1024
PIECE = 64 * MiB  # random data is generated and hashed in pieces of this size
SEND_BLOCK = 1 * MiB  # the client's socket writes
MODES = ("chunked", "single", "checksum")
PATHS = {"thin": "portal.asgi:application", "django": "bench.upload_baseline:application"}
TARGET_MIB_S = 200.0
TARGET_RSS_GROWTH_MIB = 100.0
# RSS growth of a few MiB moves by a few MiB between runs (allocator arenas, page-cache accounting): the thin path
# must not grow more than the django path by more than this.
RSS_GROWTH_SLACK_MIB = 4.0
PROBE_INTERVAL = 0.02
PROBE_PATH = "/serve/none/v2/health/ready"


@dataclass
class Run:
    mode: str
    path: str
    run: int
    chunk_mib: float
    size_mib: float
    patches: int
    seconds: float
    mib_per_s: float
    rss_baseline_mib: float
    rss_peak_mib: float
    rss_growth_mib: float
    server_cpu_seconds: float
    sha256_ok: bool
    probe_requests: int
    probe_p50_ms: float
    probe_p99_ms: float
    probe_max_ms: float


# --- the web process -------------------------------------------------------------------------------------------------

def bench_env(work: Path) -> dict[str, str]:
    """The portal's embedded defaults (SQLite, filesystem storage), pointed into the work directory. Anything in the
    caller's environment that would send storage or the database elsewhere is dropped."""
    dropped = ("DATABASE_URL", "CELERY_BROKER_URL", "DJANGO_SETTINGS_MODULE", "MODELPORT_TEST_DB", "MODELPORT_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith("S3_") and k not in dropped}
    env.update(
        DJANGO_SETTINGS_MODULE="portal.settings",
        MODELPORT_VAR_DIR=str(work / "var"),
        ARTIFACT_ROOT=str(work / "artifacts"),
        DEBUG="0",
        # Django's ASGI handler spools every request body to a temp file: keep those in the work directory too.
        TMPDIR=str(work / "tmp"),
    )
    return env


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_web(env: dict[str, str], port: int, log: Path, app: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
               "--no-access-log", "--workers", "1"]
    with open(log, "ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the web process exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return process
        except OSError:
            time.sleep(0.1)
    stop_web(process)
    raise SystemExit(f"the web process did not listen on port {port} within 30 s:\n{log.read_text()[-3000:]}")


def stop_web(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


class RssSampler(threading.Thread):
    """VmRSS of one process every `interval` seconds, keeping the peak."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.interval = interval
        self.baseline = rss_mib(pid)
        self.peak = self.baseline
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                self.peak = max(self.peak, rss_mib(self.pid))
            except (OSError, RuntimeError):
                return

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.peak = max(self.peak, rss_mib(self.pid))


class LoopProbe(threading.Thread):
    """A small request answered by the web process's event loop every PROBE_INTERVAL, on one keep-alive connection:
    its latency during the upload shows how long the loop is kept from other requests."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.latencies: list[float] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(PROBE_INTERVAL):
            started = time.perf_counter()
            try:
                self.conn.request("GET", PROBE_PATH)
                self.conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                continue
            self.latencies.append(time.perf_counter() - started)

    def stop(self) -> dict[str, float]:
        self._stop_event.set()
        self.join()
        self.conn.close()
        found = sorted(self.latencies) or [0.0]
        return {"probe_requests": len(self.latencies),
                "probe_p50_ms": round(1000 * found[len(found) // 2], 2),
                "probe_p99_ms": round(1000 * found[min(len(found) - 1, int(len(found) * 0.99))], 2),
                "probe_max_ms": round(1000 * found[-1], 2)}


class Profiler:
    """py-spy sampling the web process (Python and native frames) into a folded-stacks file."""

    def __init__(self, py_spy: str, pid: int, out: Path) -> None:
        self.out = out
        self.process = subprocess.Popen(
            [py_spy, "record", "--pid", str(pid), "--rate", "200", "--native", "--format", "raw", "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # attaching takes a moment

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# Frames worth naming in the inclusive view: our code and the layers a request body passes through.
PROFILE_FRAMES = re.compile(r"models_registry/|django/core/handlers/asgi\.py|tempfile\.py|uvicorn/protocols/|hashlib")


def profile_summary(folded: Path, top: int = 12) -> dict[str, list[tuple[str, float]]]:
    """Where the web process's samples went: by leaf frame (native code grouped by library), and by the frames of
    PROFILE_FRAMES anywhere on the stack."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [re.sub(r"^0x[0-9a-f]+ ", "", frame) for frame in stack.split(";")]
        total += int(count)
        own[frames[-1]] = own.get(frames[-1], 0) + int(count)
        for frame in {f for f in frames if PROFILE_FRAMES.search(f)}:
            inclusive[frame] = inclusive.get(frame, 0) + int(count)

    def ranked(counts: dict[str, int]) -> list[tuple[str, float]]:
        return [(frame, round(100 * n / total, 1)) for frame, n in sorted(counts.items(), key=lambda kv: -kv[1])[:top]]

    return {"self_percent": ranked(own), "inclusive_percent": ranked(inclusive)} if total else {}


# --- the client ------------------------------------------------------------------------------------------------------

class FileSlice:
    """`length` bytes of an open file from its current position, read in blocks by http.client: the body streams
    from the page cache to the socket, never whole in memory."""

    def __init__(self, stream: Any, length: int) -> None:
        self.stream = stream
        self.left = length

    def read(self, size: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        size = self.left if size < 0 else min(size, self.left)
        data = self.stream.read(size)
        self.left -= len(data)
        return data  # type: ignore[no-any-return]


class TusClient:
    def __init__(self, port: int, token: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900, blocksize=SEND_BLOCK)
        self.headers = {"Authorization": f"Bearer {token}", "Tus-Resumable": "1.0.0"}

    def request(self, method: str, path: str, body: Any = None, **headers: str) -> http.client.HTTPResponse:
        self.conn.request(method, path, body=body, headers={**self.headers, **headers})
        response = self.conn.getresponse()
        response.read()
        return response

    def create(self, length: int, filename: str) -> str:
        metadata = "filename " + base64.b64encode(filename.encode()).decode()
        response = self.request("POST", "/api/v1/uploads/",
                                **{"Upload-Length": str(length), "Upload-Metadata": metadata})
        if response.status != 201:
            raise SystemExit(f"creating the upload answered {response.status}")
        return urlsplit(response.getheader("Location", "")).path

    def upload(self, path: str, source: Path, size: int, chunk: int, checksums: list[str] | None = None) -> int:
        """PATCH the file in `chunk`-byte requests; returns the number of requests."""
        offset = patches = 0
        with open(source, "rb") as stream:
            while offset < size:
                length = min(chunk, size - offset)
                stream.seek(offset)
                headers = {"Content-Type": "application/offset+octet-stream", "Content-Length": str(length),
                           "Upload-Offset": str(offset)}
                if checksums:
                    headers["Upload-Checksum"] = f"sha256 {checksums[patches]}"
                response = self.request("PATCH", path, body=FileSlice(stream, length), **headers)
                patches += 1
                if response.status != 204:
                    raise SystemExit(f"PATCH at offset {offset} answered {response.status}")
                offset = int(response.getheader("Upload-Offset", "0"))
        return patches

    def close(self) -> None:
        self.conn.close()


# --- the runs --------------------------------------------------------------------------------------------------------

def generate(path: Path, size: int) -> str:
    """Random bytes (incompressible: nothing for any layer to shortcut), written and hashed in 64 MiB pieces."""
    digest = hashlib.sha256()
    with open(path, "wb") as out:
        left = size
        while left:
            piece = os.urandom(min(PIECE, left))
            digest.update(piece)
            out.write(piece)
            left -= len(piece)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while piece := stream.read(PIECE):
            digest.update(piece)
    return digest.hexdigest()


def chunk_checksums(path: Path, chunk: int) -> list[str]:
    """The Upload-Checksum value of every chunk, computed before the clock starts (the client's cost, not ours)."""
    found: list[str] = []
    with open(path, "rb") as stream:
        while True:
            digest, left = hashlib.sha256(), chunk
            while left and (piece := stream.read(min(PIECE, left))):
                digest.update(piece)
                left -= len(piece)
            if left == chunk:
                return found
            found.append(base64.b64encode(digest.digest()).decode())


def run_once(mode: str, path_name: str, number: int, chunk: int, env: dict[str, str], work: Path, token: str,
             source: Path, size: int, expected_sha256: str, checksums: list[str] | None,
             py_spy: str | None) -> tuple[Run, Path | None]:
    # Start from clean page cache writeback, so that one run's dirty pages do not slow the next one down.
    os.sync()
    port = free_port()
    web = start_web(env, port, work / f"web-{mode}-{path_name}-{number}.log", PATHS[path_name])
    profiler = None
    try:
        client = TusClient(port, token)
        # Warm up: the first request imports the views, the serializers and the storage code.
        warm = client.create(1024, "warm-up.bin")
        client.request("PATCH", warm, body=b"\0" * 1024,
                       **{"Content-Type": "application/offset+octet-stream", "Upload-Offset": "0"})
        client.request("DELETE", warm)
        time.sleep(0.3)

        if py_spy:
            profiler = Profiler(py_spy, web.pid, work / f"profile-{mode}-{path_name}.folded")
        sampler = RssSampler(web.pid)
        probe = LoopProbe(port)
        cpu_before = cpu_seconds(web.pid)
        sampler.start()
        probe.start()
        started = time.perf_counter()
        path = client.create(size, "bench.bin")
        patches = client.upload(path, source, size, chunk, checksums)
        seconds = time.perf_counter() - started
        probed = probe.stop()
        sampler.stop()
        cpu = cpu_seconds(web.pid) - cpu_before
        client.close()
        if profiler:
            profiler.stop()
    finally:
        stop_web(web)

    stored = work / "artifacts" / "uploads" / path.rstrip("/").rsplit("/", 1)[-1]
    ok = stored.stat().st_size == size and file_sha256(stored) == expected_sha256
    stored.unlink()
    run = Run(
        mode=mode, path=path_name, run=number, chunk_mib=round(chunk / MiB, 1), size_mib=round(size / MiB, 1),
        patches=patches, seconds=round(seconds, 3), mib_per_s=round(size / MiB / seconds, 1),
        rss_baseline_mib=round(sampler.baseline, 1), rss_peak_mib=round(sampler.peak, 1),
        rss_growth_mib=round(sampler.peak - sampler.baseline, 1), server_cpu_seconds=round(cpu, 2), sha256_ok=ok,
        probe_requests=int(probed["probe_requests"]), probe_p50_ms=probed["probe_p50_ms"],
        probe_p99_ms=probed["probe_p99_ms"], probe_max_ms=probed["probe_max_ms"],
    )
    return run, (profiler.out if profiler else None)


def summarize(runs: list[Run]) -> dict[str, dict[str, Any]]:
    """Per mode and path ("chunked/thin"): the median throughput, the worst RSS growth and probe latency, and whether
    the targets are met; per mode with both paths ("chunked"): the thin path's ratios to the django path."""
    summary: dict[str, dict[str, Any]] = {}
    for mode, path_name in dict.fromkeys((r.mode, r.path) for r in runs):
        mine = [r for r in runs if r.mode == mode and r.path == path_name]
        median = round(statistics.median(r.mib_per_s for r in mine), 1)
        growth = max(r.rss_growth_mib for r in mine)
        summary[f"{mode}/{path_name}"] = {
            "chunk_mib": mine[0].chunk_mib, "runs": len(mine), "median_mib_per_s": median,
            "min_mib_per_s": min(r.mib_per_s for r in mine), "max_mib_per_s": max(r.mib_per_s for r in mine),
            "max_rss_growth_mib": growth, "sha256_ok": all(r.sha256_ok for r in mine),
            "median_server_cpu_s": round(statistics.median(r.server_cpu_seconds for r in mine), 2),
            "worst_probe_p99_ms": max(r.probe_p99_ms for r in mine),
            "worst_probe_max_ms": max(r.probe_max_ms for r in mine),
            "meets_targets": (all(r.sha256_ok for r in mine) and median >= TARGET_MIB_S
                              and growth < TARGET_RSS_GROWTH_MIB),
        }
    for mode in dict.fromkeys(r.mode for r in runs):
        thin, django = summary.get(f"{mode}/thin"), summary.get(f"{mode}/django")
        if thin is None or django is None:
            continue
        speed = round(thin["median_mib_per_s"] / django["median_mib_per_s"], 2)
        summary[mode] = {
            "mib_per_s_ratio": speed,
            "server_cpu_ratio": round(thin["median_server_cpu_s"] / max(django["median_server_cpu_s"], 0.01), 2),
            "rss_growth_ratio": round(thin["max_rss_growth_mib"] / max(django["max_rss_growth_mib"], 0.1), 2),
            "rss_growth_difference_mib": round(thin["max_rss_growth_mib"] - django["max_rss_growth_mib"], 1),
            "meets_targets": speed >= 1.0 and (thin["max_rss_growth_mib"]
                                               <= django["max_rss_growth_mib"] + RSS_GROWTH_SLACK_MIB),
        }
    return summary


def table(runs: list[Run], summary: dict[str, dict[str, Any]]) -> str:
    header = (f"{'mode':<9} {'path':<6} {'run':>3} {'chunk MiB':>9} {'PATCHes':>7} {'seconds':>8} {'MiB/s':>7} "
              f"{'RSS base':>8} {'RSS peak':>8} {'growth':>7} {'srv CPU s':>9} {'probes, p99/max ms':>18} "
              f"{'sha256':>6}")
    lines = [header, "-" * len(header)]
    for r in runs:
        probe = f"{r.probe_requests}, {r.probe_p99_ms:.1f}/{r.probe_max_ms:.1f}"
        lines.append(f"{r.mode:<9} {r.path:<6} {r.run:>3} {r.chunk_mib:>9.0f} {r.patches:>7} {r.seconds:>8.2f} "
                     f"{r.mib_per_s:>7.1f} {r.rss_baseline_mib:>8.1f} {r.rss_peak_mib:>8.1f} {r.rss_growth_mib:>7.1f} "
                     f"{r.server_cpu_seconds:>9.2f} {probe:>18} {'ok' if r.sha256_ok else 'BAD':>6}")
    lines.append("")
    for key, s in summary.items():
        if "/" in key:
            lines.append(f"{key:<16} median {s['median_mib_per_s']:.1f} MiB/s (min {s['min_mib_per_s']:.1f}, "
                         f"max {s['max_mib_per_s']:.1f}), peak RSS growth {s['max_rss_growth_mib']:.1f} MiB, "
                         f"probe p99 {s['worst_probe_p99_ms']:.1f} ms: "
                         f"{'targets met' if s['meets_targets'] else 'TARGETS MISSED'}")
        else:
            lines.append(f"{key:<16} thin/django: {s['mib_per_s_ratio']:.2f}x MiB/s, {s['server_cpu_ratio']:.2f}x "
                         f"server CPU, RSS growth {s['rss_growth_difference_mib']:+.1f} MiB: "
                         f"{'targets met' if s['meets_targets'] else 'TARGETS MISSED'}")
    return "\n".join(lines)


def machine(work: Path) -> dict[str, Any]:
    meminfo = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()
    usage = shutil.disk_usage(work)
    mount = subprocess.run(["df", "--output=source,fstype", str(work)], capture_output=True, text=True, check=False)
    device, fstype = (mount.stdout.strip().splitlines()[-1].split()
                      + ["?", "?"])[:2] if mount.returncode == 0 else ("?", "?")
    model = ""
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "ram_gib": round(int(meminfo[1]) / 1024**2, 1),
        "disk": {"device": device, "fstype": fstype, "free_gib": round(usage.free / 1024**3, 1)},
        "kernel": platform.release(),
    }


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for name in ("django", "djangorestframework", "uvicorn", "httptools", "uvloop"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "not installed"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=False)
    found["modelport_commit"] = commit.stdout.strip() or "?"
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Upload a large file through the tus endpoint and measure it.")
    parser.add_argument("--size-mb", type=int, default=2048, help="file size in MiB (default 2048)")
    parser.add_argument("--chunk-mb", type=int, default=256, help="PATCH size in MiB of chunked/checksum (default 256)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default all)")
    parser.add_argument("--paths", default=",".join(PATHS),
                        help=f"comma-separated, of {', '.join(PATHS)} (default both)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode and path (default 3; the median counts)")
    parser.add_argument("--work-dir", type=Path, default=None,
                        help="where the temporary files go (default: system tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (database, logs; not the data)")
    parser.add_argument("--no-save", action="store_true", help="do not write a results JSON file")
    parser.add_argument("--profile", action="store_true",
                        help="sample the web process with py-spy in each mode's first run "
                             "(pip install --target /tmp/pyspy py-spy)")
    parser.add_argument("--py-spy", default=None, help="the py-spy executable (default: PATH, then /tmp/pyspy/bin)")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes takes {', '.join(MODES)}")
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or any(p not in PATHS for p in paths):
        parser.error(f"--paths takes {', '.join(PATHS)}")
    if args.size_mb < 1 or args.chunk_mb < 1 or args.repeat < 1:
        parser.error("--size-mb, --chunk-mb and --repeat must be positive")
    py_spy = None
    if args.profile:
        py_spy = args.py_spy or shutil.which("py-spy") or shutil.which("py-spy", path="/tmp/pyspy/bin")
        if not py_spy:
            parser.error("--profile needs py-spy: pip install --target /tmp/pyspy py-spy")
    size = args.size_mb * MiB

    work = Path(tempfile.mkdtemp(prefix="modelport-upload-bench-", dir=args.work_dir)).resolve()
    try:
        if work.is_relative_to(ROOT):
            raise SystemExit("the work directory must be outside the repository")
        (work / "tmp").mkdir()
        env = bench_env(work)
        print(f"work directory: {work}")
        manage(env, "ensure_dirs")  # the var/ layout and a development secret key, as `make run` makes them
        manage(env, "migrate", "--noinput")
        token = manage(env, "create_api_token", "--user", "bench", "--team", "bench", "--create", "--admin",
                       "--name", "upload-bench").strip()
        source = work / "source.bin"
        load_before = os.getloadavg()
        started = time.perf_counter()
        expected = generate(source, size)
        print(f"generated {args.size_mb} MiB of random data in {time.perf_counter() - started:.1f} s")

        runs: list[Run] = []
        profiles: dict[str, Any] = {}
        for mode in modes:
            chunk = size if mode == "single" else min(args.chunk_mb * MiB, size)
            checksums = chunk_checksums(source, chunk) if mode == "checksum" else None
            for number in range(1, args.repeat + 1):
                for path_name in paths:  # interleaved: both paths see the same drift of the machine's load
                    print(f"uploading: {mode}, {path_name} path, PATCH {chunk // MiB} MiB, run {number}/{args.repeat}",
                          flush=True)
                    run, folded = run_once(mode, path_name, number, chunk, env, work, token, source, size, expected,
                                           checksums, py_spy if number == 1 else None)
                    runs.append(run)
                    if folded is not None and folded.exists():
                        profiles[f"{mode}/{path_name}"] = profile_summary(folded)
                        if not args.no_save:
                            RESULTS.mkdir(parents=True, exist_ok=True)
                            shutil.copy(folded, RESULTS / f"upload-profile-{mode}-{path_name}.folded")
        summary = summarize(runs)
        print()
        print(table(runs, summary))
        for mode, found in profiles.items():
            print(f"\nweb process, {mode}: share of samples by leaf frame, then by frame anywhere on the stack")
            for frame, percent in found.get("self_percent", []):
                print(f"  {percent:5.1f}%  {frame}")
            print("  --")
            for frame, percent in found.get("inclusive_percent", []):
                print(f"  {percent:5.1f}%  {frame}")
        print(f"\nload average (1 min): {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after "
              f"on {os.cpu_count()} CPUs")
        print(f"targets: median >= {TARGET_MIB_S:.0f} MiB/s, "
              f"web-process peak RSS growth < {TARGET_RSS_GROWTH_MIB:.0f} MiB; "
              f"thin path: >= 1.0x the django path's MiB/s, RSS growth at most {RSS_GROWTH_SLACK_MIB:.0f} MiB more")

        if not args.no_save:
            report = {
                "benchmark": "upload through tus to filesystem storage",
                "time": datetime.now(UTC).isoformat(timespec="seconds"),
                "command": " ".join([".venv/bin/python", "bench/upload_bench.py",
                                     *(sys.argv[1:] if argv is None else argv)]),
                "machine": machine(work),
                # Other processes on the machine skew the figures: the 1-minute load before and after the runs.
                "load_average_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
                "versions": versions(),
                "targets": {"median_mib_per_s": TARGET_MIB_S, "rss_growth_mib": TARGET_RSS_GROWTH_MIB,
                            "thin_to_django_mib_per_s_ratio": 1.0, "rss_growth_slack_mib": RSS_GROWTH_SLACK_MIB},
                "summary": summary,
                "runs": [asdict(r) for r in runs],
                **({"profiles": profiles} if profiles else {}),
            }
            RESULTS.mkdir(parents=True, exist_ok=True)
            out = RESULTS / f"upload-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
            out.write_text(json.dumps(report, indent=2) + "\n")
            print(f"results: {out.relative_to(ROOT)}")
        return 0 if all(s["meets_targets"] for s in summary.values()) else 1
    finally:
        if args.keep:
            (work / "source.bin").unlink(missing_ok=True)
            shutil.rmtree(work / "artifacts", ignore_errors=True)
            shutil.rmtree(work / "tmp", ignore_errors=True)
            print(f"kept {work} (the data files are removed)")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
