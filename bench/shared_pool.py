"""Shared pool against dedicated servers (issue 24): N small ONNX models (tests/artifacts.tiny_onnx, each its own
model) deployed through the API and the real reconciler on the local runtime, once each on a Triton of its own and
once all in one pool's Triton, on this machine.

    .venv/bin/python bench/shared_pool.py [--models 30] [--dedicated 30] [--hot 5] [--duration 10] [--output PATH]

Measures, for each placement: the memory of every Triton and python-backend stub process (the sum of their PSS,
and of their RSS, from /proc), the time to deploy all N (POSTs, then reconciler ticks until every one is ready),
the throughput of a closed-loop load over the `--hot` models at once (tuning/loadgen.py's clients, two per model,
straight at Triton: the gateway is the same in both placements), and for the pool the cold start of an idle model
(its load and the first answer). In the pool every model but the hot ones is unloaded as idle before the memory is
read, as the beat would. `--dedicated` below `--models` starts fewer dedicated servers (a loaded machine) and scales
their memory to N from the measured mean: the output says so. Writes bench/results/shared_pool.json (--output: a
trial run's figures elsewhere).

The pool is the benchmark team's own, `bench`, its budget sized for the N models loaded at once: each model in a
local pool reserves at least POOL_MODEL_MEMORY_MIN (its cgroup's limit, what it is charged), so the built-in pool
`shared` at its default budget holds 16 loaded, 8 of one team (POOL_TEAM_SHARE). A budget is what loads are
admitted against, not memory held: the figures measured are the processes' own, which the budget does not change
(docs/benchmarks.md, "Shared pools").

A fresh SQLite database and var directory in a temporary directory (DATABASE_URL and S3_* from the environment are
ignored); everything is stopped and removed at the end. Needs the runtime env.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
STUB_NAMES = ("tritonserver", "triton_python_backend_stub")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=30)
    parser.add_argument("--dedicated", type=int, default=None, help="dedicated servers to start (default: --models)")
    parser.add_argument("--hot", type=int, default=5)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "shared_pool.json",
                        help="where the figures are written (a trial run's elsewhere than the committed ones)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shared-pool-", dir=args.work_dir))
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL", "S3_BUCKET", "S3_ENDPOINT_URL"):
        os.environ.pop(name, None)
    os.environ.update({"MODELPORT_VAR_DIR": str(work / "var"), "DJANGO_SETTINGS_MODULE": "portal.settings",
                       "GATEWAY_RATE_LIMIT_PER_SECOND": "0",
                       # The idle models go after their 1 s, not ten times their load (which a busy machine stretches).
                       "POOL_IDLE_UNLOAD_LOAD_FACTOR": "0",
                       "SECRET_KEY": secrets.token_urlsafe(32)})  # this run's own database only
    import django

    django.setup()
    try:
        result = run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = args.output
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from django.core.management import call_command

    from tests.artifacts import tiny_onnx
    from tests.support.people import make_person
    from tests.support.versions import make_ready_version

    call_command("migrate", verbosity=0)
    person = make_person("bench", "bench", role="admin")
    for index in range(args.models):
        make_ready_version(person, name=f"m{index}", data=tiny_onnx(out_features=3 + index % 5))
    dedicated_count = min(args.dedicated if args.dedicated is not None else args.models, args.models)
    load_before = os.getloadavg()
    result: dict[str, Any] = {"models": args.models, "hot": args.hot, "load_average_before": load_before}
    pool = bench_pool(person, args.models)
    result["pool"] = {"name": pool.name, "memory_budget_bytes": pool.memory_budget_bytes}
    result["shared"] = placement(person, "shared", args.models, args, work)
    result["dedicated"] = placement(person, "dedicated", dedicated_count, args, work)
    result["load_average_after"] = os.getloadavg()
    shared, dedicated = result["shared"], result["dedicated"]
    scale = args.models / dedicated_count
    result["dedicated_scaled_to_models"] = dedicated_count != args.models
    dedicated_pss = dedicated["memory"]["pss_bytes"] * scale
    result["memory_ratio_shared_to_dedicated"] = round(shared["memory"]["pss_bytes"] / dedicated_pss, 3)
    result["throughput_ratio_shared_to_dedicated"] = round(
        shared["load"]["throughput"] / dedicated["load"]["throughput"], 3)
    result["targets"] = {
        "memory_at_most_a_third": result["memory_ratio_shared_to_dedicated"] <= 1 / 3,
        "throughput_within_10_percent": result["throughput_ratio_shared_to_dedicated"] >= 0.9,
        "cold_start_at_most_2_s": shared["cold_start_s"] <= 2.0,
    }
    return result


POOL = "bench"


def bench_pool(person: Any, models: int) -> Any:
    """The team's own pool, sized for `models` tiny models loaded at once: each reserves POOL_MODEL_MEMORY_MIN (its
    peak, some 75 MB, times the headroom is less), and a pool of one team has no share rule. As an operator would
    size a pool for what it is to hold; the built-in pool keeps its default budget."""
    from deployments import pools
    from deployments.models import Pool

    return Pool.objects.create(name=POOL, runtime=Pool.Runtime.LOCAL, team=person.team, idle_unload_seconds=1,
                               memory_budget_bytes=models * pools.reservation(0))


def placement(person: Any, mode: str, count: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from deployments import actions, reconcile
    from deployments.models import Deployment, PoolLoad
    from deployments.runtimes.local import pool as local_pool

    client = person.client()
    names = [f"{mode[0]}{index}" for index in range(count)]
    started = time.monotonic()
    for index, name in enumerate(names):
        body: dict[str, Any] = {"name": name, "models": [{"model": f"m{index}"}], "placement": {"mode": mode}}
        if mode == "shared":
            body["placement"].update(pool=POOL, idle_unload_seconds=1)
        else:  # a tiny model's Triton: a cgroup of 512 MiB each, so that N fit the team's ceiling on the machine
            body["resources"] = {"memory": "512Mi"}
        response = client.post("/api/v1/deployments/", body, format="json")
        assert response.status_code == 201, response.json()
    pending = set(names)
    failures: list[str] = []
    while pending:
        for name in sorted(pending):
            deployment = Deployment.objects.get(name=name)
            reconcile.reconcile(deployment.pk)
            deployment.refresh_from_db()
            if deployment.status == "failed":
                # Counted and retried once, as a user would (a stub that did not start on a loaded machine).
                failures.append(f"{name}: {deployment.status_message[:300]}")
                assert sum(f.startswith(f"{name}:") for f in failures) < 2, failures
                actions.start_deployment(deployment, person.user)
            if deployment.status == "ready":
                pending.discard(name)
        if time.monotonic() - started > 60 + 20 * count:
            raise SystemExit(f"{mode}: not ready in time: {sorted(pending)}")
    deploy_seconds = time.monotonic() - started
    deployments = [Deployment.objects.get(name=name) for name in names]
    targets = [(d.upstream_url, _served_name(d, index)) for index, d in enumerate(deployments)]
    hot = targets[:args.hot]
    out: dict[str, Any] = {"deployments": count, "deploy_all_s": round(deploy_seconds, 2), "failed_loads": failures}
    out["load"] = asyncio.run(_load(hot, args.duration))
    if mode == "shared":
        # Every model but the hot ones goes idle and is unloaded, as the beat would do after idle_unload_seconds.
        hot_ids = {d.pk for d in deployments[:args.hot]}
        PoolLoad.objects.filter(deployment_id__in=hot_ids).update(idle_unload_seconds=0)
        time.sleep(1.5)
        out["unloaded_idle"] = len(local_pool.unload_idle())
    out["memory"] = settled_memory(work)
    if mode == "shared":
        idle = deployments[-1]
        load = PoolLoad.objects.get(deployment=idle)
        assert load.state == PoolLoad.State.UNLOADED, load.state
        began = time.monotonic()
        done = local_pool.load_revision(load.pk)
        asyncio.run(_one(targets[-1]))
        out["cold_start_s"] = round(time.monotonic() - began, 3)
        out["cold_start_load_s"] = done.cold_start_seconds
        out["pool_processes"] = out["memory"]["processes"]
    for deployment in deployments:
        actions.stop_deployment(deployment, person.user)
        for _ in range(10):
            if reconcile.reconcile(deployment.pk) is None:
                break
    if mode == "shared":
        # Stopping unloads the models; the pool's Triton stays up for the next load: not after a benchmark.
        from deployments.models import Pool

        local_pool.stop_servers(Pool.objects.get(name=POOL))
    return out


def _served_name(deployment: Any, index: int) -> str:
    from deployments.pool_names import name_prefix

    spec = deployment.serving_revision.spec
    return (name_prefix(deployment.pk, deployment.serving_revision.number)
            if spec.placement.shared else "") + f"m{index}"


def _body() -> bytes:
    return json.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.5] * 4}]}).encode()


async def _load(targets: list[tuple[str, str]], duration: float) -> dict[str, Any]:
    """Two closed-loop clients per hot model, all at once; their figures summed."""
    from tuning import loadgen

    runs = await asyncio.gather(*[loadgen.run(f"{url}/v2/models/{name}/infer", _body(),
                                              {"content-type": "application/json"}, 2, duration, 2.0)
                                  for url, name in targets])
    return {"throughput": round(sum(r["throughput"] for r in runs), 1), "errors": sum(r["errors"] for r in runs),
            "p50_ms_median": statistics.median(r["p50_ms"] for r in runs),
            "p99_ms_max": max(r["p99_ms"] for r in runs), "per_model": [r["throughput"] for r in runs]}


async def _one(target: tuple[str, str]) -> None:
    import aiohttp

    url, name = target
    async with aiohttp.ClientSession() as session, session.post(f"{url}/v2/models/{name}/infer",
                                                                data=_body()) as answer:
        assert answer.status == 200, await answer.text()


def settled_memory(work: Path, seconds: float = 30.0) -> dict[str, Any]:
    """memory() once the process count has not changed for 3 s: an unloaded model's stub exits a moment after
    Triton's unload answered. Says how long that took (`settled_after_s`)."""
    started = time.monotonic()
    last = memory(work)
    steady_since = started
    while time.monotonic() - started < seconds and time.monotonic() - steady_since < 3.0:
        time.sleep(0.5)
        now = memory(work)
        if now["processes"] != last["processes"]:
            steady_since = time.monotonic()
        last = now
    return {**last, "settled_after_s": round(steady_since - started, 1)}


def memory(work: Path) -> dict[str, Any]:
    """PSS and RSS summed over every Triton and stub process whose command line names this run's directory."""
    pss = rss = processes = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if str(work) not in cmdline or not any(name in cmdline.split(" ")[0] for name in STUB_NAMES):
                continue
            fields = dict(line.split(":", 1) for line in (entry / "smaps_rollup").read_text().splitlines()[1:])
        except OSError:
            continue
        pss += int(fields["Pss"].split()[0]) * 1024
        rss += int(fields["Rss"].split()[0]) * 1024
        processes += 1
    return {"pss_bytes": pss, "rss_bytes": rss, "processes": processes}


if __name__ == "__main__":
    raise SystemExit(main())
