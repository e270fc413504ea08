"""modelport: push models to a Modelport portal and deploy them on Triton, from a CI job.

Configuration: MODELPORT_URL and MODELPORT_TOKEN, or --url and --token. Every command takes --json and
--verbose. Results go to stdout. On failure one line `error: <reason>` goes to stderr, and it is the only line
there: progress and notes go to stderr only with --verbose, or when stderr is a terminal. The exit code says
what failed:
  1 the portal refused or could not be reached   2 wrong command line, name or input file
  3 the model is invalid                          4 the deployment failed
  5 timed out waiting
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote

from modelport_cli import __version__, tus
from modelport_cli.client import ApiError, Client
from modelport_cli.errors import CliError, ExitCode, one_line
from modelport_cli.output import Progress, human_size, info, print_json, set_verbose

DEFAULT_PUSH_TIMEOUT = 600.0
DEFAULT_DEPLOY_TIMEOUT = 600.0
# Polling starts fast (a small model validates in a second) and backs off to the maximum.
FIRST_POLL_INTERVAL = 0.2
MAX_POLL_INTERVAL = 2.0


# ---------------------------------------------------------------------------------------------------- helpers


def _segment(name: str) -> str:
    return quote(name, safe="")


# The portal's naming rule (accounts/names.py; a test keeps the two equal): models and deployments become Triton,
# Kubernetes and S3 names. Checked here so that a bad name is a usage error before anything is uploaded.
NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
NAME_RULE = ("use 1 to 63 characters: lowercase letters a-z, digits and hyphens, starting and ending with a letter "
             "or digit")


def check_name(name: str, what: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise CliError(f"{what} {name!r} is not a valid name: {NAME_RULE}", ExitCode.USAGE)
    return name


def make_client(args: argparse.Namespace) -> Client:
    url = getattr(args, "url", None) or os.environ.get("MODELPORT_URL", "")
    token = getattr(args, "token", None) or os.environ.get("MODELPORT_TOKEN", "")
    if not url:
        raise CliError("no portal URL: set MODELPORT_URL or pass --url", ExitCode.USAGE)
    if not url.startswith(("http://", "https://")):
        raise CliError(f"the portal URL must start with http:// or https://, got {url!r}", ExitCode.USAGE)
    if not token:
        raise CliError("no API token: set MODELPORT_TOKEN or pass --token", ExitCode.USAGE)
    return Client(url, token)


def read_json_file(name: str, option: str) -> Any:
    """A JSON file named on the command line ('-' is stdin); a missing or broken one is a usage error."""
    try:
        text = sys.stdin.read() if name == "-" else Path(name).read_text()
    except OSError as exc:
        raise CliError(f"{option} {name}: {exc.strerror or exc}", ExitCode.USAGE) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CliError(f"{option} {name} is not valid JSON: {exc}", ExitCode.USAGE) from None


def poll(fetch: Callable[[], dict[str, Any]], finished: Callable[[dict[str, Any]], bool], timeout: float,
         on_timeout: Callable[[dict[str, Any]], CliError]) -> dict[str, Any]:
    """fetch() until finished(body) (which may raise to fail), or raise on_timeout(last body) after `timeout` s."""
    deadline = time.monotonic() + timeout
    interval = FIRST_POLL_INTERVAL
    while True:
        body = fetch()
        if finished(body):
            return body
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise on_timeout(body)
        time.sleep(min(interval, remaining))
        interval = min(interval * 1.5, MAX_POLL_INTERVAL)


def create_version(client: Client, model: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST a version. A 400 here means the portal rejected the model itself (not an ONNX file, a signature that
    does not parse, ...): that is exit code 3, the same as a version that ends up invalid after inspection."""
    try:
        return dict(client.call("POST", f"/api/v1/models/{_segment(model)}/versions/", json=body).json())
    except ApiError as exc:
        if exc.status != 400:
            raise
        # "upload_id: The file is not ..." reads as jargon; the other field names tell the user what to fix.
        parts = [" ".join(msgs) if name in ("upload_id", "file") else f"{name}: {' '.join(msgs)}"
                 for name, msgs in exc.fields.items()]
        reason = "; ".join(parts) or exc.reason
        raise CliError(f"{model}: the portal rejected the model: {reason}", ExitCode.INVALID_MODEL) from None


def wait_for_version(client: Client, model: str, version: dict[str, Any], args: argparse.Namespace) -> int:
    number = int(version["number"])
    path = f"/api/v1/models/{_segment(model)}/versions/{number}/"

    def finished(body: dict[str, Any]) -> bool:
        if body.get("status") == "invalid":
            if args.json:
                print_json(body)
            raise CliError(f"{model} version {number} is invalid: {body.get('error') or 'no reason given'}",
                           ExitCode.INVALID_MODEL)
        return body.get("status") == "ready"

    def on_timeout(body: dict[str, Any]) -> CliError:
        if args.json:
            print_json(body)
        return CliError(f"timed out after {args.timeout:g} s waiting for {model} version {number} to be validated "
                        f"(status {body.get('status')})", ExitCode.TIMEOUT)

    if args.no_wait:
        body = version
    else:
        if not args.json:
            info(f"{model} version {number} uploaded; waiting for the portal to validate it")
        body = poll(lambda: dict(client.get(path)), finished, args.timeout, on_timeout)
    if args.json:
        print_json(body)
    else:
        if body.get("status") == "ready":
            info(f"{model} version {number} is ready ({body.get('format') or 'unknown format'}, "
                 f"{human_size(int(body.get('size') or 0))})")
        # The bare number on stdout: VERSION=$(modelport push ...) in a CI script.
        print(number)
    return ExitCode.OK


# --------------------------------------------------------------------------------------------------- commands


def cmd_push(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if path.is_dir():
        raise CliError(f"{path} is a directory: pack it as .zip or .tar.gz and push the archive", ExitCode.USAGE)
    if not path.is_file():
        raise CliError(f"{path}: no such file", ExitCode.USAGE)
    check_name(args.model, "model")
    signature = read_json_file(args.signature, "--signature") if args.signature else None
    client = make_client(args)

    progress = None if args.json or not args.verbose_stderr else Progress(path.stat().st_size, f"uploading {path.name}")
    state = tus.UploadState(tus.default_state_dir())
    result = tus.upload_file(client, path, state=state, progress=progress.update if progress else None,
                             notify=progress.note if progress else None)
    if progress:
        progress.finish()

    # The model is created with its first version (create_model), so a refused first version leaves no empty model.
    body: dict[str, Any] = {"upload_id": result.upload_id, "create_model": True}
    if args.format:
        body["format"] = args.format
    if signature is not None:
        body["signature"] = signature
    if args.max_batch_size is not None:
        body["max_batch_size"] = args.max_batch_size
    version = create_version(client, args.model, body)
    state.forget(result.state_key)  # the portal consumed the upload; a re-run must upload again
    return wait_for_version(client, args.model, version, args)


def cmd_pipeline_create(args: argparse.Namespace) -> int:
    check_name(args.model, "model")
    definition = read_json_file(args.definition, "--definition")
    client = make_client(args)
    version = create_version(client, args.model, {"format": "ensemble", "definition": definition, "create_model": True})
    return wait_for_version(client, args.model, version, args)


def _served_model(spec: str, args: argparse.Namespace) -> dict[str, Any]:
    model, _, version = spec.partition(":")
    if not model:
        raise CliError(f"--model {spec!r}: use MODEL:VERSION, or MODEL for its latest ready version", ExitCode.USAGE)
    check_name(model, "--model")
    entry: dict[str, Any] = {"model": model}
    if version and version != "latest":
        if not version.isdigit() or int(version) < 1:
            raise CliError(f"--model {spec!r}: the version must be a number of 1 or more", ExitCode.USAGE)
        entry["version"] = int(version)
    if args.max_batch_size is not None:
        entry["max_batch_size"] = args.max_batch_size
    batching_options = args.max_queue_delay_us is not None or args.preferred_batch_size
    if args.dynamic_batching is False:
        if batching_options:
            raise CliError("--no-dynamic-batching cannot be combined with --max-queue-delay-us or "
                           "--preferred-batch-size", ExitCode.USAGE)
        entry["dynamic_batching"] = None
    elif args.dynamic_batching or batching_options:
        # Naming a batching option means wanting dynamic batching; no need to also say --dynamic-batching.
        entry["dynamic_batching"] = {"max_queue_delay_microseconds": args.max_queue_delay_us or 0,
                                     "preferred_batch_size": list(args.preferred_batch_size or [])}
    # Without any of these the key is left out and the portal chooses (its default depends on the signature).
    if args.instances is not None or args.kind is not None:
        entry["instance_group"] = {"count": args.instances if args.instances is not None else 1,
                                   "kind": args.kind or "cpu"}
    return entry


def cmd_deploy(args: argparse.Namespace) -> int:
    check_name(args.name, "deployment")
    models = [_served_model(spec, args) for spec in args.model]
    client = make_client(args)
    body: dict[str, Any] = {"name": args.name, "models": models}
    if args.runtime:
        body["runtime"] = args.runtime
    if args.canary is not None:
        return _deploy_canary(client, args, {key: value for key, value in body.items() if key != "name"})
    try:
        deployment = dict(client.call("POST", "/api/v1/deployments/", json=body).json())
        action = "created"
    except ApiError as exc:
        if exc.status != 409:
            raise
        # It exists: a CI pipeline that runs again wants a new revision of it, not an error. The runtime is sent
        # only when given, so that the portal can refuse a change of runtime with its own message.
        patch = {key: value for key, value in body.items() if key != "name"}
        deployment = dict(client.call("PATCH", f"/api/v1/deployments/{_segment(args.name)}/", json=patch).json())
        action = "updated"
    revision = int(deployment.get("revision") or 0)
    if not args.json:
        info(f"{args.name}: revision {revision} {action}")
    if args.wait:
        deployment = _wait_until_serving(client, args, revision)
    if args.json:
        print_json(deployment)
    elif args.wait:
        print(f"{args.name} is ready: revision {deployment.get('revision')} at {_endpoint(client, deployment)}")
    else:
        print(f"{args.name}: revision {revision} {action} ({deployment.get('status')})")
    return ExitCode.OK


def _deploy_canary(client: Client, args: argparse.Namespace, patch: dict[str, Any]) -> int:
    """A new revision of an existing deployment, served beside the current one for --canary percent of the
    requests until `modelport promote` or `modelport rollback` (or its guardrails) end it."""
    patch["rollout"] = {"strategy": "canary", "percent": args.canary}
    path = f"/api/v1/deployments/{_segment(args.name)}/"
    try:
        deployment = dict(client.call("PATCH", path, json=patch).json())
    except ApiError as exc:
        if exc.status == 404:
            raise CliError(f"a canary needs a deployment that serves already: deploy {args.name} without --canary "
                           "first") from None
        raise
    canary = deployment.get("canary") or {}
    revision = int(canary.get("revision") or 0)
    if not args.json:
        info(f"{args.name}: revision {revision} created as a canary for {args.canary}% of the requests")
    if args.wait:
        deployment = _wait_for_canary(client, args, revision, path)
    if args.json:
        print_json(deployment)
    elif args.wait:
        print(f"{args.name}: canary revision {revision} serves {args.canary}% of the requests (revision "
              f"{deployment.get('serving_revision')} the rest); 'modelport promote {args.name}' or "
              f"'modelport rollback {args.name}' ends it")
    else:
        print(f"{args.name}: canary revision {revision} starting")
    return ExitCode.OK


def _wait_for_canary(client: Client, args: argparse.Namespace, revision: int, path: str) -> dict[str, Any]:
    def finished(body: dict[str, Any]) -> bool:
        canary = body.get("canary") or {}
        if canary.get("revision") != revision:
            if args.json:
                print_json(body)
            raise CliError(f"the canary of revision {revision} of {args.name} ended before it served (see "
                           f"'modelport status {args.name}' and the deployment's events)", ExitCode.DEPLOYMENT_FAILED)
        return bool(canary.get("state") == "serving")

    def on_timeout(body: dict[str, Any]) -> CliError:
        if args.json:
            print_json(body)
        return CliError(f"timed out after {args.timeout:g} s waiting for canary revision {revision} of {args.name} "
                        "to serve", ExitCode.TIMEOUT)

    return poll(lambda: dict(client.get(path)), finished, args.timeout, on_timeout)


def _wait_until_serving(client: Client, args: argparse.Namespace, revision: int) -> dict[str, Any]:
    path = f"/api/v1/deployments/{_segment(args.name)}/"

    def finished(body: dict[str, Any]) -> bool:
        if body.get("status") == "failed":
            if args.json:
                print_json(body)
            lines = str(body.get("status_message") or "").strip().splitlines()
            raise CliError(f"deployment {args.name} failed: {lines[0] if lines else 'no reason given'}",
                           ExitCode.DEPLOYMENT_FAILED)
        if body.get("desired_state") == "stopped":
            # PATCH keeps a stopped deployment stopped: it would never become ready; say so now, not at the timeout.
            if args.json:
                print_json(body)
            raise CliError(f"deployment {args.name} is stopped, so revision {body.get('revision')} is saved but not "
                           f"running: run 'modelport start {args.name}'", ExitCode.DEPLOYMENT_FAILED)
        current = body.get("revision") or 0
        return bool(body.get("status") == "ready" and body.get("serving_revision") == current and current >= revision)

    def on_timeout(body: dict[str, Any]) -> CliError:
        if args.json:
            print_json(body)
        return CliError(f"timed out after {args.timeout:g} s waiting for {args.name} to serve revision {revision} "
                        f"({_status_words(body)})", ExitCode.TIMEOUT)

    return poll(lambda: dict(client.get(path)), finished, args.timeout, on_timeout)


def _status_words(body: dict[str, Any]) -> str:
    """"status starting: Starting Triton for revision 2.", or "status pending" when the portal says no more."""
    message = one_line(str(body.get("status_message") or ""))
    return f"status {body.get('status') or 'unknown'}" + (f": {message}" if message else "")


def _endpoint(client: Client, deployment: dict[str, Any]) -> str:
    endpoint = str(deployment.get("endpoint") or "")
    return client.url(endpoint) if endpoint.startswith("/") else endpoint


def cmd_status(args: argparse.Namespace) -> int:
    check_name(args.name, "deployment")
    client = make_client(args)
    deployment = dict(client.get(f"/api/v1/deployments/{_segment(args.name)}/"))
    if args.json:
        print_json(deployment)
        return ExitCode.OK
    print(f"name:      {deployment.get('name')} ({deployment.get('runtime')})")
    message = one_line(str(deployment.get("status_message") or ""))
    print(f"status:    {deployment.get('status')}" + (f" - {message}" if message else ""))
    print(f"revision:  {deployment.get('revision')} (serving {deployment.get('serving_revision') or 'none'})")
    print(f"endpoint:  {_endpoint(client, deployment)}")
    canary = deployment.get("canary")
    if canary:
        print(f"canary:    revision {canary.get('revision')} for {canary.get('percent')}% ({canary.get('state')})")
    print("models:")
    for model in deployment.get("models") or []:
        print("  " + _describe_served_model(model))
    return ExitCode.OK


def _describe_served_model(model: dict[str, Any]) -> str:
    parts = [f"{model.get('model')}:{model.get('version')}", str(model.get("format") or "")]
    if model.get("max_batch_size") is not None:
        parts.append(f"max_batch_size={model['max_batch_size']}")
    batching = model.get("dynamic_batching")
    if batching:
        preferred = batching.get("preferred_batch_size") or []
        parts.append(f"dynamic_batching(delay={batching.get('max_queue_delay_microseconds', 0)}us"
                     + (f", preferred={preferred}" if preferred else "") + ")")
    else:
        parts.append("no dynamic batching")
    group = model.get("instance_group") or {}
    if group:
        parts.append(f"instances={group.get('count', 1)}x{group.get('kind', 'cpu')}")
    return "  ".join(part for part in parts if part)


def cmd_logs(args: argparse.Namespace) -> int:
    check_name(args.name, "deployment")
    client = make_client(args)
    params = {"lines": args.lines} if args.lines is not None else None
    body = dict(client.get(f"/api/v1/deployments/{_segment(args.name)}/logs/", params=params))
    if args.json:
        print_json(body)
    else:
        log = str(body.get("log") or "")
        sys.stdout.write(log if log.endswith("\n") or not log else log + "\n")
    return ExitCode.OK


def _lifecycle(args: argparse.Namespace, action: str) -> int:
    check_name(args.name, "deployment")
    client = make_client(args)
    path = f"/api/v1/deployments/{_segment(args.name)}/"
    try:
        body = dict(client.call("POST", f"{path}{action}", idempotency_key=False).json())
        message = f"{args.name}: {body.get('status')}"
        if one_line(str(body.get("status_message") or "")):
            message += f" ({one_line(str(body['status_message']))})"
    except ApiError as exc:
        # 409 is the portal's "stopped already" / "running already": the state the caller asked for holds, and
        # a pipeline step that runs twice must not fail for it.
        if exc.status != 409:
            raise
        body = dict(client.get(path))
        message = f"{args.name}: {exc.reason}"
    if args.json:
        print_json(body)
    else:
        print(message)
    return ExitCode.OK


def _canary_action(args: argparse.Namespace, action: str) -> int:
    check_name(args.name, "deployment")
    client = make_client(args)
    canary = dict(client.get(f"/api/v1/deployments/{_segment(args.name)}/")).get("canary") or {}
    body = dict(client.call("POST", f"/api/v1/deployments/{_segment(args.name)}/{action}",
                            idempotency_key=False).json())
    if args.json:
        print_json(body)
    elif action == "promote":
        print(f"{args.name}: revision {body.get('serving_revision')} promoted; it serves every request")
    else:
        print(f"{args.name}: canary revision {canary.get('revision')} rolled back; revision "
              f"{body.get('serving_revision')} serves every request")
    return ExitCode.OK


def cmd_promote(args: argparse.Namespace) -> int:
    return _canary_action(args, "promote")


def cmd_rollback(args: argparse.Namespace) -> int:
    return _canary_action(args, "rollback")


def cmd_stop(args: argparse.Namespace) -> int:
    return _lifecycle(args, "stop")


def cmd_start(args: argparse.Namespace) -> int:
    return _lifecycle(args, "start")


def cmd_delete(args: argparse.Namespace) -> int:
    check_name(args.name, "deployment")
    client = make_client(args)
    response = client.call("DELETE", f"/api/v1/deployments/{_segment(args.name)}/")
    gone = response.status_code == 204
    if args.json:
        print_json({"name": args.name, "deleted": gone, "status": "deleted" if gone else "deleting"})
    else:
        print(f"{args.name}: deleted" if gone else f"{args.name}: being deleted (the portal finishes it shortly)")
    return ExitCode.OK


def _duration(text: str) -> int:
    """"600", "600s", "10m", "1h" as whole seconds."""
    match = re.fullmatch(r"\s*(\d+)\s*([smh]?)\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: use seconds, or e.g. 90s, 10m, 1h")
    return int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def cmd_tune(args: argparse.Namespace) -> int:
    check_name(args.name, "deployment")
    if args.canary is not None and not args.apply:
        raise CliError("--canary says how --apply rolls the tuned settings out: add --apply", ExitCode.USAGE)
    client = make_client(args)
    base = f"/api/v1/deployments/{_segment(args.name)}"
    body: dict[str, Any] = {"p99_ms": args.p99_ms, "budget_seconds": args.budget,
                            "concurrency_min": args.concurrency[0], "concurrency_max": args.concurrency[1]}
    if args.model:
        body["model"] = args.model
    if args.request:
        body.update(sample="request", request=read_json_file(args.request, "--request"))
    tune = dict(client.call("POST", f"{base}/tune", json=body).json())
    info(f"{args.name}: tune {tune['id']} queued (budget {args.budget} s)")
    seen = [""]

    def finished(current: dict[str, Any]) -> bool:
        message = str(current.get("message") or "")
        if message != seen[0]:
            info(f"{current.get('status')}: {message}")
            seen[0] = message
        return current.get("status") not in ("queued", "running")

    def on_timeout(current: dict[str, Any]) -> CliError:
        return CliError(f"timed out waiting for tune {tune['id']} ({current.get('status')}: "
                        f"{one_line(str(current.get('message') or ''))})", ExitCode.TIMEOUT)

    # Waiting for another tune on the machine may come first: the timeout covers it, plus start and stop.
    timeout = args.timeout if args.timeout is not None else args.budget * 3 + 120
    tune = poll(lambda: dict(client.get(f"{base}/tunes/{tune['id']}/")), finished, timeout, on_timeout)
    if args.apply and tune.get("status") == "done" and tune.get("recommendation"):
        body = {"rollout": {"strategy": "canary", "percent": args.canary}} if args.canary is not None else {}
        tune = dict(client.call("POST", f"{base}/tunes/{tune['id']}/apply", json=body).json())
    if args.json:
        print_json(tune)
    else:
        _print_tune(tune)
    if tune.get("status") != "done":
        raise CliError(f"tune {tune['id']} {tune.get('status')}: {one_line(str(tune.get('message') or ''))}",
                       ExitCode.DEPLOYMENT_FAILED)
    if args.apply and not tune.get("recommendation"):
        raise CliError("nothing to apply: no setting met the target", ExitCode.DEPLOYMENT_FAILED)
    return ExitCode.OK


def _print_tune(tune: dict[str, Any]) -> None:
    machine = tune.get("machine") or {}
    print(f"tune {tune.get('id')} of {tune.get('deployment')} ({tune.get('model')}:{tune.get('version')}) on "
          f"{machine.get('hostname', '?')}, {machine.get('cores', '?')} cores: target p99 <= "
          f"{tune.get('p99_target_ms')} ms" + (" (partial: the budget ran out)" if tune.get("partial") else ""))
    print(f"{'setting':<40} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'clients':>7}")
    recommended = (tune.get("recommendation") or {}).get("settings")
    for row in tune.get("results") or []:
        mark = "*" if row.get("settings") == recommended else " "
        p50, p99 = row.get("p50_ms"), row.get("p99_ms")
        note = f" ({row['error']})" if row.get("error") else "" if row.get("meets_target") else " (missed)"
        print(f"{mark}{row.get('label', '')[:39]:<39} {row.get('throughput', 0):>9.1f} "
              f"{'-' if p50 is None else f'{p50:.1f}':>8} {'-' if p99 is None else f'{p99:.1f}':>8} "
              f"{row.get('concurrency') or '-':>7}{note}")
    print(one_line(str(tune.get("message") or "")))
    if tune.get("applied_revision"):
        print(f"applied: revision {tune['applied_revision']} rolls out")


def cmd_infer(args: argparse.Namespace) -> int:
    check_name(args.name, "deployment")
    check_name(args.model, "model")
    request = read_json_file(args.input, "--input")
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise CliError(f"--input {args.input}: expected KServe v2 JSON, "
                       '{"inputs": [{"name", "shape", "datatype", "data"}]}', ExitCode.USAGE)
    client = make_client(args)
    path = f"/serve/{_segment(args.name)}/v2/models/{_segment(args.model)}/infer"
    # An inference changes nothing, so it is retried like a GET; it creates nothing to deduplicate.
    response = client.call("POST", path, json=request, idempotency_key=False)
    body = dict(response.json())
    if args.json:
        print_json(body)
        return ExitCode.OK
    for output in body.get("outputs") or []:
        shape = "x".join(str(d) for d in output.get("shape") or [])
        print(f"{output.get('name')} ({output.get('datatype')} [{shape}]): {json.dumps(output.get('data'))}")
    return ExitCode.OK


# ----------------------------------------------------------------------------------------------------- parser


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, as for every other failure; argparse would print the usage block first.
        self.exit(ExitCode.USAGE, f"error: {one_line(message)} (see '{self.prog} --help')\n")


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be {minimum} or more")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _percent(text: str) -> int:
    value = _positive_int(text)
    if value > 99:
        raise argparse.ArgumentTypeError(f"{text!r} must be 99 or less (a canary takes part of the requests)")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0")
    return value


def _common_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument("--url", default=default, help="the portal, e.g. http://127.0.0.1:8000 (env MODELPORT_URL)")
    parser.add_argument("--token", default=default, help="an API token (env MODELPORT_TOKEN)")
    parser.add_argument("--json", action="store_true", default=default, help="machine-readable output on stdout")
    parser.add_argument("-v", "--verbose", action="store_true", default=default,
                        help="progress and notes on stderr even when it is not a terminal (a CI log)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="modelport", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"modelport {__version__}")
    _common_options(parser, None)
    parser.set_defaults(json=False, verbose=False)
    # The same options after the command too (`modelport status x --json`); SUPPRESS keeps a value given before
    # the command from being overwritten by the subcommand's default.
    common = _Parser(add_help=False)
    _common_options(common, argparse.SUPPRESS)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Callable[[argparse.Namespace], int], help_text: str,
            group: Any = commands) -> argparse.ArgumentParser:
        sub = group.add_parser(name, parents=[common], help=help_text, description=help_text)
        sub.set_defaults(handler=handler)
        return sub

    push = add("push", cmd_push, "upload a model file as a new version and wait until it is validated")
    push.add_argument("model", metavar="MODEL")
    push.add_argument("path", metavar="PATH")
    push.add_argument("--format", help="declare the format (onnx, torchscript, ...) instead of detecting it")
    push.add_argument("--signature", metavar="FILE.json",
                      help='inputs and outputs: {"inputs": [{"name", "datatype", "dims"}], "outputs": [...]}')
    push.add_argument("--max-batch-size", type=_non_negative_int, metavar="N")
    push.add_argument("--no-wait", action="store_true", help="return once uploaded, without waiting for validation")
    push.add_argument("--timeout", type=_seconds, default=DEFAULT_PUSH_TIMEOUT, metavar="S",
                      help=f"how long to wait for validation (default {DEFAULT_PUSH_TIMEOUT:g})")

    pipeline = commands.add_parser("pipeline", help="pipelines (Triton ensembles)")
    pipeline_commands = pipeline.add_subparsers(dest="pipeline_command", required=True, metavar="COMMAND")
    create = add("create", cmd_pipeline_create, "create a pipeline version from a definition", pipeline_commands)
    create.add_argument("model", metavar="MODEL")
    create.add_argument("--definition", required=True, metavar="FILE.json")
    create.add_argument("--no-wait", action="store_true")
    create.add_argument("--timeout", type=_seconds, default=DEFAULT_PUSH_TIMEOUT, metavar="S")

    deploy = add("deploy", cmd_deploy, "create a deployment, or roll an existing one to a new revision")
    deploy.add_argument("name", metavar="NAME")
    deploy.add_argument("--model", action="append", required=True, metavar="MODEL:VERSION",
                        help="a model to serve (repeat for several); MODEL alone means its latest ready version")
    batching = deploy.add_mutually_exclusive_group()
    batching.add_argument("--dynamic-batching", dest="dynamic_batching", action="store_true", default=None)
    batching.add_argument("--no-dynamic-batching", dest="dynamic_batching", action="store_false")
    deploy.add_argument("--max-queue-delay-us", type=_non_negative_int, metavar="N")
    deploy.add_argument("--preferred-batch-size", type=_positive_int, nargs="+", action="extend", metavar="N")
    deploy.add_argument("--max-batch-size", type=_non_negative_int, metavar="N")
    deploy.add_argument("--instances", type=_positive_int, metavar="N", help="model instances per Triton server")
    deploy.add_argument("--kind", choices=["cpu", "gpu"])
    deploy.add_argument("--runtime", choices=["local", "kubernetes"])
    deploy.add_argument("--canary", type=_percent, metavar="PERCENT", help=(
        "roll the new revision out as a canary: it takes PERCENT (1-99) of the requests beside the serving one "
        "until 'modelport promote' or 'modelport rollback'"))
    deploy.add_argument("--wait", action="store_true", help="wait until the new revision serves")
    deploy.add_argument("--timeout", type=_seconds, default=DEFAULT_DEPLOY_TIMEOUT, metavar="S",
                        help=f"how long --wait waits (default {DEFAULT_DEPLOY_TIMEOUT:g})")

    add("status", cmd_status, "show a deployment").add_argument("name", metavar="NAME")
    logs = add("logs", cmd_logs, "print the Triton log of a deployment")
    logs.add_argument("name", metavar="NAME")
    logs.add_argument("--lines", type=_positive_int, metavar="N")
    add("stop", cmd_stop, "stop a deployment").add_argument("name", metavar="NAME")
    add("start", cmd_start, "start a stopped (or retry a failed) deployment").add_argument("name", metavar="NAME")
    add("delete", cmd_delete, "delete a deployment").add_argument("name", metavar="NAME")
    add("promote", cmd_promote, "promote a deployment's canary: it serves every request").add_argument(
        "name", metavar="NAME")
    add("rollback", cmd_rollback, "roll a deployment's canary back: the serving revision takes every request"
        ).add_argument("name", metavar="NAME")

    tune = add("tune", cmd_tune, "find the batching and instance settings with the most throughput within a p99 "
                                 "target, measured on the portal's machine; print the table")
    tune.add_argument("name", metavar="NAME")
    tune.add_argument("--p99-ms", type=float, required=True, metavar="MS", help="the latency target")
    tune.add_argument("--budget", type=_duration, default=300, metavar="T",
                      help="how long it may measure: seconds, or 90s, 10m, 1h (default 5m; the portal takes 30s..1h)")
    tune.add_argument("--concurrency", type=_positive_int, nargs=2, default=[1, 16], metavar=("LOW", "HIGH"),
                      help="closed-loop clients, from LOW doubling up to HIGH (default 1 16)")
    tune.add_argument("--model", help="which served model (default: the deployment's first)")
    tune.add_argument("--request", metavar="FILE.json", help="the KServe v2 request to send (default: the Try-it "
                                                             "example from the signature)")
    tune.add_argument("--apply", action="store_true", help="roll out the recommendation as a new revision")
    tune.add_argument("--canary", type=_percent, metavar="PERCENT", help=(
        "with --apply: roll the tuned revision out as a canary taking PERCENT (1-99) of the requests beside the "
        "serving one (then `modelport promote` or `modelport rollback`)"))
    tune.add_argument("--timeout", type=_seconds, default=None, metavar="S",
                      help="how long to wait (default: three times the budget plus two minutes)")

    infer = add("infer", cmd_infer, "send one inference request (KServe v2 JSON) through the portal")
    infer.add_argument("name", metavar="NAME")
    infer.add_argument("model", metavar="MODEL")
    infer.add_argument("--input", required=True, metavar="FILE.json")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (2), --help and --version (0)
        return int(exc.code or 0)
    # Progress and notes: wanted on a terminal, or when asked for; a script reading stderr gets the error alone.
    args.verbose_stderr = bool(args.verbose or sys.stderr.isatty())
    set_verbose(args.verbose_stderr)
    try:
        return int(args.handler(args))
    except CliError as exc:
        print(f"error: {one_line(exc.message)}", file=sys.stderr)
        return int(exc.code)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
