"""The deployment page's context, built by plain functions: what each served model takes and answers with its
examples and snippets, the live panel (status, events, isolation, canary, placement, tune), and the settings in
effect with the revision history. The views (web/views.py) render it; the live panel's partial reuses it."""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

from django.utils import timezone

from deployments import canary
from deployments.models import Deployment
from deployments.revision_spec import ModelEntry
from deployments.runtimes.registry import runtime_for
from models_registry.models import ModelVersion
from models_registry.samples import sample_digit_png
from web import grpc_snippet, inference, placement, revisions, stream_panel
from web.sample_data import sample_inputs, takes_images
from web.traffic import WINDOW_MINUTES as TRAFFIC_WINDOW_MINUTES
from web.tune_panel import tune_context


def spec_models(deployment: Deployment) -> list[ModelEntry]:
    return list(deployment.revision.spec.models) if deployment.revision else []


def detail_context(deployment: Deployment, base_url: str) -> dict[str, Any]:
    """The whole page's context; `base_url`: the portal's address as the browser reached it (the snippets')."""
    served = served_models(deployment, base_url)
    # Try it sends /infer for the models that answer once, and streams the decoupled ones (templates/web/
    # _try_stream.html).
    infer_served = [s for s in served if not s["entry"].decoupled]
    return {
        **live_context(deployment), "served": served, "infer_served": infer_served,
        "stream_served": [s for s in served if s["entry"].decoupled and s["stream"] is not None],
        "examples": {s["entry"].name: {"path": s["path"], "request": s["example"]} for s in infer_served},
        "has_bytes_inputs": any(s["bytes_inputs"] for s in infer_served),
        "has_steps": any(s["step"] for s in served),
        "example_rows": example_rows(infer_served[0]["example"]) if infer_served else 10,
        "metrics_url": f"/api/v1/deployments/{deployment.name}/metrics/?minutes={TRAFFIC_WINDOW_MINUTES}",
        "traffic_minutes": TRAFFIC_WINDOW_MINUTES,
        **settings_context(deployment),
    }


def example_rows(example: str) -> int:
    """The Try it box as tall as the first example, wrapped (about 72 characters a row at its width), from 3 to 10
    rows: the pipeline's one line of an image took ten."""
    wrapped = sum(-(-len(line) // 72) or 1 for line in example.splitlines())
    return min(10, max(3, wrapped + 1))


def served_models(deployment: Deployment, base_url: str) -> list[dict[str, Any]]:
    """Per model of the revision asked for: the signature served, its URL, an example request and the snippets.
    A pipeline comes first, and its steps (`step`: True) after it: the page folds them away, since a caller
    calls the pipeline (four models' snippets in a row made a pipeline's page 8,600 px tall)."""
    entries = spec_models(deployment)
    steps = {step.model for entry in entries if entry.format == "ensemble" for step in entry.ensemble_steps}
    served: list[dict[str, Any]] = []
    for entry in sorted(entries, key=lambda e: e.name in steps):  # stable: the pipelines first, in their order
        # What Triton serves and answers (a [batch] output comes back as [batch, 1]): the signature shown, and the
        # shapes of the example and the snippets.
        signature = inference.served_signature(entry)
        # The sample's held-out example where there is one: Try it, curl and both Python snippets send it.
        # Else the example request the version was uploaded with, where its data fits the example's shapes.
        sample = sample_inputs(entry.signature.to_json()) or _uploaded_example(entry.version_id)
        example = inference.with_data(inference.example_request(signature), sample)
        images = takes_images(entry.signature.to_json())
        # A model that takes images gets the sample PNG in its snippets: an empty BYTES element answers 400.
        files = {signature["inputs"][0]["name"]: _sample_png()} if images else {}
        curl = (inference.curl_image_snippet(base_url, deployment.name, entry.name, *next(iter(files.items())))
                if files else inference.curl_snippet(base_url, deployment.name, entry.name, example))
        served.append({
            "entry": entry,
            "step": entry.name in steps,
            # A pipeline's page shows each model's curl and folds its other snippets away: four snippets of four
            # models made it 8,600 px tall.
            "fold_more": bool(steps),
            "signature": signature,
            "reshaped": any("declared" in t for t in signature["inputs"] + signature["outputs"]),
            "url": inference.infer_url(base_url, deployment.name, entry.name),
            "path": inference.infer_url("", deployment.name, entry.name),
            "example": inference.request_json(example),
            "example_note": inference.example_note(signature),
            "bytes_inputs": [t["name"] for t in signature.get("inputs", []) if t.get("datatype") == "BYTES"],
            "sample_image": images,
            "snippets": [
                ("curl", curl, "curl"),
                ("Python (tritonclient)", inference.python_snippet(base_url, deployment.name, entry.name, signature,
                                                                sample, files), "python"),
                ("modelport CLI", inference.cli_snippet(deployment.name, entry.name, base_url, files), "cli"),
            ],
        })
        grpc_address = grpc_snippet.public_address(base_url)
        if entry.decoupled:
            _streaming(served[-1], base_url, deployment.name, signature, sample, grpc_address)
            continue
        # gRPC (tritonclient.grpc): the Python snippet's twin, when the gRPC gateway runs.
        snippets = served[-1]["snippets"]
        keys = [key for _, _, key in snippets]
        if grpc_address is not None and "python" in keys:
            python = snippets[keys.index("python")][1]
            snippets.insert(keys.index("python") + 1, ("Python (tritonclient.grpc)", grpc_snippet.python_grpc_snippet(
                python, *grpc_address, deployment.name), "grpc"))
    return served


def _streaming(s: dict[str, Any], base_url: str, deployment: str, signature: dict[str, Any],
               example: dict[str, list[Any]], grpc_address: tuple[str, bool] | None) -> None:
    """A decoupled model has no /infer (a 400 naming generate_stream): its endpoint, the streaming Try it and every
    snippet use /generate_stream, the OpenAI-compatible API and gRPC's stream instead (web/stream_panel.py)."""
    model = s["entry"].name
    request = stream_panel.stream_request(signature, example)
    s["url"] = stream_panel.stream_url(base_url, deployment, model)
    s["stream"] = None
    s["snippets"] = []
    if request is None:
        return
    s["stream"] = {"path": stream_panel.stream_url("", deployment, model), "input": request.prompt_input,
                   "prompt": request.prompt, "max_tokens": request.max_tokens if request.max_tokens_input else None}
    s["snippets"].append(("curl (streamed)", stream_panel.curl_snippet(base_url, deployment, model, request),
                          "curl-stream"))
    if request.openai:
        s["snippets"].append(("Python (openai)", stream_panel.openai_snippet(base_url, deployment, model, request),
                              "openai"))
    if grpc_address is not None:
        s["snippets"].append(("Python (tritonclient.grpc, streamed)", stream_panel.grpc_snippet(
            *grpc_address, deployment, model, signature, request), "grpc"))


@functools.lru_cache(maxsize=1)
def _sample_png() -> bytes:
    return sample_digit_png()


def _uploaded_example(version_id: int | None) -> dict[str, list[Any]]:
    version = ModelVersion.objects.filter(pk=version_id).only("example_request").first() if version_id else None
    return version.example_data() if version is not None else {}


def settings_context(deployment: Deployment) -> dict[str, Any]:
    """The settings in effect (the revision serving, else the one asked for) and the revision history."""
    shown = deployment.serving_revision or deployment.revision
    spec = shown.spec if shown else None
    return {
        "settings_revision": shown,
        "settings": revisions.settings_in_effect(spec),
        "deployment_settings": revisions.deployment_words(spec, deployment.runtime,
                                                          shown.versions.all() if shown else None, deployment.name),
        "history": revisions.history(list(deployment.revisions.select_related("created_by"))[:50]),
    }


def live_context(deployment: Deployment) -> dict[str, Any]:
    isolation = runtime_for(deployment).isolation(deployment)
    return {"deployment": deployment, "events": deployment.events.all()[:30], "isolation": isolation,
            "canary": canary_context(deployment), "placement": placement.placement_view(deployment),
            "stream_figures": stream_figures_context(deployment), **tune_context(deployment)}


def stream_figures_context(deployment: Deployment) -> dict[str, Any] | None:
    """A streaming deployment's figures over the traffic panel's window (gateway/stream_figures.py), per revision
    that streamed; None for a deployment with no decoupled model (nothing of it streams)."""
    if not any(entry.decoupled for entry in spec_models(deployment)):
        return None
    window = timedelta(minutes=TRAFFIC_WINDOW_MINUTES)
    try:  # the gateway app is optional here, as for the dashboard's traffic (web/traffic.py)
        from gateway.models import RequestStats
    except ImportError:
        return None
    rows = list(RequestStats.objects.filter(deployment=deployment, bucket_start__gte=timezone.now() - window))
    grouped: dict[int, list[Any]] = {}
    for row in rows:
        if row.revision:
            grouped.setdefault(row.revision, []).append(row)
    streamed = [(f"r{number}", _stream_row(group, window)) for number, group in sorted(grouped.items())
                if any(r.streams or r.stream_pieces or r.stream_seconds for r in group)]
    return {"minutes": TRAFFIC_WINDOW_MINUTES, "rows": [("All", _stream_row(rows, window)), *streamed]}


def _stream_row(rows: list[Any], window: timedelta) -> dict[str, Any]:
    from gateway.stats import stream_summary

    figures = stream_summary(rows, window)
    figures["ended_words"] = ", ".join(f"{reason.replace('_', ' ')}: {count}"
                                       for reason, count in figures["ended_by"].items() if count) or "–"
    return figures


def canary_context(deployment: Deployment) -> dict[str, Any] | None:
    """The canary beside the stable revision, each one's traffic over the same interval: since the canary began
    serving (its first statistics bucket), or since it was asked for while it starts. Over the traffic panel's 5
    minutes instead, a canary 30 s old showed its 30 s of requests spread over 5 minutes: 14.42 against 0.51 req/s
    for an 80/20 split."""
    if deployment.canary_revision is None or deployment.serving_revision is None:
        return None
    began = deployment.canary_serving_since or deployment.canary_revision.created_at
    bucket_of_start = began - timedelta(seconds=began.timestamp() % canary.MIN_WINDOW_SECONDS)
    # The seconds the figures cover, from the first bucket's start to now (a bucket at least: rates stay finite).
    covered = max(timezone.now() - bucket_of_start, timedelta(seconds=canary.MIN_WINDOW_SECONDS))
    try:  # the gateway app is optional here, as for the dashboard's traffic (web/traffic.py)
        from gateway.models import RequestStats
        from gateway.stats import by_revision
    except ImportError:
        figures: dict[str, Any] = {}
    else:
        rows = list(RequestStats.objects.filter(deployment=deployment, bucket_start__gte=bucket_of_start,
                                                revision__in=[deployment.serving_revision.number,
                                                              deployment.canary_revision.number]))
        figures = by_revision(rows, covered)
    stable = figures.get(str(deployment.serving_revision.number))
    candidate = figures.get(str(deployment.canary_revision.number))
    total = sum(f["requests"] for f in (stable, candidate) if f)
    return {"since": began, "serving": bool(deployment.canary_upstream_url), "judged": _judged_now(deployment),
            "p99_needed": canary.p99_requests_needed(deployment),
            "stable": {"number": deployment.serving_revision.number, "percent": 100 - deployment.canary_percent,
                       "traffic": stable, "seen_percent": round(100 * stable["requests"] / total) if stable else None},
            "canary": {"number": deployment.canary_revision.number, "percent": deployment.canary_percent,
                       "traffic": candidate, "serving": bool(deployment.canary_upstream_url),
                       "seen_percent": round(100 * candidate["requests"] / total) if candidate else None}}


def _judged_now(deployment: Deployment) -> str:
    """What the guardrails judge on the figures the judge reads now (its window, since the canary serves), and what
    they cannot judge yet: the page says it rather than let a quiet canary look as if it passed every rule."""
    if deployment.canary_serving_since is None or deployment.canary_revision is None:
        return ""
    try:
        from gateway.canary import window_figures
    except ImportError:
        return ""
    canary_figures, stable_figures, serving_for = window_figures(deployment)
    return canary.judged(deployment, canary_figures, stable_figures, serving_for)
