"""The front-end comparison (bench/gateway_options.py): each front end is read against the direct run of the same
repeat, a front end whose every request failed is reported rather than crashing the summary, and the nginx
configuration it writes is one nginx accepts (`nginx -t`, where nginx is installed). No portal or Triton runs here."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bench.gateway_options import markdown, nginx_config, summarize


def _run(route: str, repeat: int, throughput: float, p50: float | None, errors: int = 0,
         cpu: float | None = None) -> dict[str, Any]:
    return {"workload": "cnn", "protocol": "http", "concurrency": 16, "route": route, "repeat": repeat,
            "throughput": throughput, "p50_ms": p50, "p99_ms": p50, "errors": errors, "requests": 100,
            "cpu_ms_per_request": cpu}


def test_it_reads_each_front_end_against_the_direct_run_of_the_same_repeat() -> None:
    runs = [_run("direct", 0, 1000, 4.0), _run("uvicorn", 0, 750, 5.5, cpu=0.13),
            _run("direct", 1, 500, 8.0), _run("uvicorn", 1, 450, 8.5, cpu=0.15)]
    [row] = summarize(runs)
    assert row["route"] == "uvicorn"
    assert row["ratio"] == pytest.approx((0.75 + 0.9) / 2)  # per repeat, not total over total (0.80)
    assert row["added_p50_ms"] == pytest.approx((1.5 + 0.5) / 2)
    assert row["cpu_ms_per_request"] == {"median": pytest.approx(0.14), "min": 0.13, "max": 0.15}


def test_a_front_end_whose_every_request_failed_is_reported_not_a_crash() -> None:
    runs = [_run("direct", 0, 1000, 4.0), _run("nginx", 0, 0.0, None, errors=500)]
    [row] = summarize(runs)
    assert row["ratio"] == 0 and row["errors"] == 500
    assert math.isnan(row["p50_ms"]["median"]) and math.isnan(row["added_p50_ms"])
    assert "| cnn | http | 16 | nginx |" in markdown([row])


def test_nginx_accepts_the_configuration_it_writes(tmp_path: Path) -> None:
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if nginx is None:
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    config = nginx_config(tmp_path, 18080, 18081, "127.0.0.1:8000", {"cnn": 9000}, {"cnn": "127.0.0.1:9001"})
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi", "cache"):
        (tmp_path / sub).mkdir()
    (tmp_path / "nginx.conf").write_text(config)
    done = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "auth_request /_access;" in config and 'proxy_cache_key "$http_authorization|$deployment";' in config
