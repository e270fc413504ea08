"""modelport: push models to a Modelport portal and deploy them on Triton, from a CI job.

Configuration: MODELPORT_URL and MODELPORT_TOKEN, or --url and --token. Every command takes --json and
--verbose. Results go to stdout. On failure one line `error: <reason>` goes to stderr, and it is the only line
there: progress and notes go to stderr only with --verbose, or when stderr is a terminal. The exit code says
what failed:
  1 the portal refused or could not be reached   2 wrong command line, input file or name (an --example-request
  3 the model is invalid                            that does not fit; nothing of that name in the token's
  4 the deployment failed                          team: the portal answered 404)
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

from modelport_cli import __version__, quantities, tus
from modelport_cli.client import ApiError, Client, read_at_most
from modelport_cli.errors import CliError, ExitCode, one_line
from modelport_cli.output import Progress, human_size, info, print_json, set_verbose

DEFAULT_PUSH_TIMEOUT = 600.0
DEFAULT_DEPLOY_TIMEOUT = 600.0
# Polling starts fast (a small model validates in a second) and backs off to the maximum.
FIRST_POLL_INTERVAL = 0.2
MAX_POLL_INTERVAL = 2.0
# The portal answers at most LOG_TAIL_MAX_BYTES (1 MiB) of log, which JSON may at most double (quotes, backslashes);
# an answer past this is refused rather than held in memory.
MAX_LOG_ANSWER_BYTES = 16 * 1024**2
# Control characters but tab and newline (C0, DEL, C1): escape sequences a model printed to its log.
_TERMINAL_CONTROL_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


# ---------------------------------------------------------------------------------------------------- helpers


def _segment(name: str) -> str:
    return quote(name, safe="")


# The portal's naming rule (infra/names.py; a test keeps the two equal): models and deployments become Triton,
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


# The portal's limit (modelport/core/chat_template.py MAX_TEMPLATE_BYTES): refused here before the upload starts.
MAX_CHAT_TEMPLATE_BYTES = 64 * 1024


def read_chat_template(name: str) -> str:
    """A chat template file named on the command line, read before anything is uploaded: a missing, non-UTF-8 or
    too large one is a usage error (its syntax is the portal's to check, which names the line)."""
    try:
        data = Path(name).read_bytes()
    except OSError as exc:
        raise CliError(f"--chat-template {name}: {exc.strerror or exc}", ExitCode.USAGE) from None
    if len(data) > MAX_CHAT_TEMPLATE_BYTES:
        raise CliError(f"--chat-template {name} is {len(data)} bytes; the limit is {MAX_CHAT_TEMPLATE_BYTES}.",
                       ExitCode.USAGE)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CliError(f"--chat-template {name} is not UTF-8 text.", ExitCode.USAGE) from None


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


# The version field that holds --example-request, and the prefix of a version's error that is about it: the
# example is the user's input file, not the model, so a refusal naming it is exit 2, as the README's table says.
_EXAMPLE_FIELD = "example_request"


def _is_about_the_example(error: str) -> bool:
    return error.startswith(f"{_EXAMPLE_FIELD}:")


def create_version(client: Client, model: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST a version. A 400 here means the portal rejected the model itself (not an ONNX file, a signature that
    does not parse, ...): that is exit code 3, the same as a version that ends up invalid after inspection; a 400
    naming only the example request is the input file's fault, exit 2."""
    return post_version(client, model, body)[0]


def post_version(client: Client, model: str, body: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """create_version, and the HTTP status: an import of a source the model already has answers 200 with that
    version instead of 201 with a new one."""
    try:
        response = client.call("POST", f"/api/v1/models/{_segment(model)}/versions/", json=body)
        return dict(response.json()), response.status_code
    except ApiError as exc:
        if exc.status != 400:
            raise
        if exc.fields and set(exc.fields) == {_EXAMPLE_FIELD}:
            reason = " ".join(exc.fields[_EXAMPLE_FIELD])
            raise CliError(f"--example-request: the portal refused it: {reason}", ExitCode.USAGE) from None
        # "upload_id: The file is not ..." reads as jargon; the other field names tell the user what to fix.
        parts = [" ".join(msgs) if name in ("upload_id", "file") else f"{name}: {' '.join(msgs)}"
                 for name, msgs in exc.fields.items()]
        reason = "; ".join(parts) or exc.reason
        raise CliError(f"{model}: the portal rejected the model: {reason}", ExitCode.INVALID_MODEL) from None


def wait_for_version(client: Client, model: str, version: dict[str, Any], args: argparse.Namespace) -> int:
    number = int(version["number"])
    path = f"/api/v1/models/{_segment(model)}/versions/{number}/"

    import_progress = _ImportProgress(model, number) if not args.json else None

    def finished(body: dict[str, Any]) -> bool:
        if body.get("status") == "importing" and import_progress is not None:
            import_progress.update(body.get("import") or {})
        if body.get("status") == "cancelled":
            raise CliError(f"{model} version {number}: its import was cancelled", ExitCode.ERROR)
        if body.get("status") == "invalid":
            if args.json:
                print_json(body)
            error = str(body.get("error") or "")
            if _is_about_the_example(error):
                # Checked at inspection against the signature the model itself declares (an upload without one).
                raise CliError(f"--example-request: {model} version {number} refused it: "
                               f"{error.removeprefix(f'{_EXAMPLE_FIELD}:').strip()}", ExitCode.USAGE)
            raise CliError(f"{model} version {number} is invalid: {error or 'no reason given'}",
                           ExitCode.INVALID_MODEL)
        return body.get("status") == "ready"

    def on_timeout(body: dict[str, Any]) -> CliError:
        if args.json:
            print_json(body)
        doing = "imported and validated" if body.get("status") == "importing" else "validated"
        return CliError(f"timed out after {args.timeout:g} s waiting for {model} version {number} to be {doing} "
                        f"(status {body.get('status')})", ExitCode.TIMEOUT)

    if args.no_wait:
        body = version
    else:
        if not args.json:
            if version.get("status") == "importing":
                info(f"{model} version {number} created; the portal is importing it from {_describe_source(version)}")
            else:
                info(f"{model} version {number} uploaded; waiting for the portal to validate it")
        body = poll(lambda: dict(client.get(path)), finished, args.timeout, on_timeout)
    if args.json:
        print_json(body)
    else:
        if body.get("status") == "ready":
            info(f"{model} version {number} is ready ({body.get('format') or 'unknown format'}, "
                 f"{human_size(int(body.get('size') or 0))})")
            if body.get("identical_to"):
                # A note like the others (stderr stays the error line alone unless --verbose); --json has the field.
                info(f"note: {model} version {number} is identical to version {body['identical_to']} (the same "
                     "bytes): nothing changed since")
            for note in body.get("notes") or []:
                info(f"note: {model} version {number}: {note}")
        # The bare number on stdout: VERSION=$(modelport push ...) in a CI script.
        print(number)
    return ExitCode.OK


class _ImportProgress:
    """The portal's import counter, `{"done_bytes", "total_bytes"}`, as notes: at every tenth when the total is
    known, and every 10 s otherwise (a source that gives no size), so a CI log shows movement without a flood."""

    QUIET_SECONDS = 10.0

    def __init__(self, model: str, number: int) -> None:
        self.label = f"{model} version {number}: importing"
        self.last_tenth = -1
        self.last_at = 0.0

    def update(self, counter: dict[str, Any]) -> None:
        done = int(counter.get("done_bytes") or 0)
        total = counter.get("total_bytes")
        if total:
            tenth = min(10, 10 * done // int(total))
            if tenth != self.last_tenth:
                self.last_tenth = tenth
                info(f"{self.label}: {human_size(done)} of {human_size(int(total))} ({100 * done // int(total)}%)")
            return
        now = time.monotonic()
        if now - self.last_at >= self.QUIET_SECONDS:
            self.last_at = now
            info(f"{self.label}: {human_size(done)} so far")


def _describe_source(version: dict[str, Any]) -> str:
    source = version.get("source") or {}
    if source.get("kind") == "huggingface":
        return f"hf://{source.get('repo')}@{source.get('revision') or 'main'}"
    return str(source.get("uri") or source.get("kind") or "its source")


# What --from takes. MLflow's registry URIs: a version number or an alias (a stage, models:/fraud/Production, is
# deprecated by MLflow and left to it: the portal's fetcher resolves what MLflow resolves).
_MLFLOW_RE = re.compile(r"models:/([^/@\s]+)(/[^/@\s]+|@[^/@\s]+)")
_HF_RE = re.compile(r"hf://([A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*)(?:@([^@\s]+))?")
FROM_FORMS = ("models:/NAME/VERSION, models:/NAME@ALIAS, hf://ORG/REPO[@REVISION], s3://BUCKET/KEY or "
              "https://HOST/PATH")


def parse_source(spec: str, files: list[str]) -> dict[str, Any]:
    """--from (and --file) as the API's `source`; anything malformed is a usage error before any request."""
    if files and not spec.startswith("hf://"):
        raise CliError("--file picks files of a Hugging Face repository: use it with --from hf://ORG/REPO",
                       ExitCode.USAGE)
    if spec.startswith("models:"):
        if not _MLFLOW_RE.fullmatch(spec):
            raise CliError(f"--from {spec!r}: an MLflow model is models:/NAME/VERSION or models:/NAME@ALIAS",
                           ExitCode.USAGE)
        return {"kind": "mlflow", "uri": spec}
    if spec.startswith("hf://"):
        match = _HF_RE.fullmatch(spec)
        if not match:
            raise CliError(f"--from {spec!r}: a Hugging Face model is hf://ORG/REPO or hf://ORG/REPO@REVISION",
                           ExitCode.USAGE)
        for name in files:
            if not name or name.startswith("/") or ".." in name.split("/"):
                raise CliError(f"--file {name!r}: name a file inside the repository, as a relative path",
                               ExitCode.USAGE)
        source: dict[str, Any] = {"kind": "huggingface", "repo": match.group(1),
                                  "revision": match.group(2) or "main"}
        if files:
            source["files"] = list(files)
        return source
    if spec.startswith("s3://"):
        bucket, _, key = spec.removeprefix("s3://").partition("/")
        if not bucket or not key:
            raise CliError(f"--from {spec!r}: an S3 object is s3://BUCKET/KEY", ExitCode.USAGE)
        return {"kind": "uri", "uri": spec}
    if spec.startswith(("https://", "http://")):
        if not spec.split("://", 1)[1].split("/", 1)[0]:
            raise CliError(f"--from {spec!r}: the URL has no host", ExitCode.USAGE)
        return {"kind": "uri", "uri": spec}
    raise CliError(f"--from {spec!r}: use {FROM_FORMS}", ExitCode.USAGE)


# --------------------------------------------------------------------------------------------------- commands


def cmd_push_from(args: argparse.Namespace) -> int:
    """push --from: the portal fetches the model itself; the CLI sends no bytes, only waits (through "importing")."""
    check_name(args.model, "model")
    source = parse_source(args.source, args.files or [])
    signature = read_json_file(args.signature, "--signature") if args.signature else None
    example = read_json_file(args.example_request, "--example-request") if args.example_request else None
    template = read_chat_template(args.chat_template) if args.chat_template is not None else None
    client = make_client(args)
    body: dict[str, Any] = {"source": source, "create_model": True}
    if args.new_version:
        body["new_version"] = True
    if args.format:
        body["format"] = args.format
    if signature is not None:
        body["signature"] = signature
    if args.max_batch_size is not None:
        body["max_batch_size"] = args.max_batch_size
    if example is not None:
        body["example_request"] = example
    if args.decoupled:
        body["decoupled"] = True
    if template is not None:
        body["chat_template"] = template
    version, status = post_version(client, args.model, body)
    if status == 200 and not args.json:
        info(f"note: {args.model} version {version.get('number')} was imported from this source already "
             "(--new-version imports it again)")
    return wait_for_version(client, args.model, version, args)


def cmd_push(args: argparse.Namespace) -> int:
    if args.source is not None:
        if args.path is not None:
            raise CliError("give either a file to upload or --from, not both", ExitCode.USAGE)
        return cmd_push_from(args)
    if args.path is None:
        raise CliError(f"push needs a file to upload, or --from {FROM_FORMS}", ExitCode.USAGE)
    if args.files or args.new_version:
        raise CliError("--file and --new-version go with --from", ExitCode.USAGE)
    path = Path(args.path)
    if path.is_dir():
        raise CliError(f"{path} is a directory: pack it as .zip or .tar.gz and push the archive", ExitCode.USAGE)
    if not path.is_file():
        raise CliError(f"{path}: no such file", ExitCode.USAGE)
    check_name(args.model, "model")
    signature = read_json_file(args.signature, "--signature") if args.signature else None
    example = read_json_file(args.example_request, "--example-request") if args.example_request else None
    template = read_chat_template(args.chat_template) if args.chat_template is not None else None
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
    if example is not None:
        body["example_request"] = example
    if args.decoupled:
        body["decoupled"] = True
    if template is not None:
        body["chat_template"] = template
    version = create_version(client, args.model, body)
    state.forget(result.state_key)  # the portal consumed the upload; a re-run must upload again
    return wait_for_version(client, args.model, version, args)


def cmd_pipeline_create(args: argparse.Namespace) -> int:
    check_name(args.model, "model")
    definition = read_json_file(args.definition, "--definition")
    client = make_client(args)
    version = create_version(client, args.model, {"format": "ensemble", "definition": definition, "create_model": True})
    return wait_for_version(client, args.model, version, args)


# The settings of a served model the CLI can set, as the API's output names them; the rest (the version's format,
# a warm-up, the response cache) is carried over from the current revision untouched.
_SETTINGS = ("max_batch_size", "dynamic_batching", "instance_group", "response_cache", "warmup")


def _split_model(spec: str) -> tuple[str, int | None]:
    model, _, version = spec.partition(":")
    if not model:
        raise CliError(f"--model {spec!r}: use MODEL:VERSION, or MODEL for its latest ready version", ExitCode.USAGE)
    check_name(model, "--model")
    if version and version != "latest":
        if not version.isdigit() or int(version) < 1:
            raise CliError(f"--model {spec!r}: the version must be a number of 1 or more", ExitCode.USAGE)
        return model, int(version)
    return model, None


def _check_batching_options(args: argparse.Namespace) -> None:
    if args.dynamic_batching is False and (args.max_queue_delay_us is not None or args.preferred_batch_size):
        raise CliError("--no-dynamic-batching cannot be combined with --max-queue-delay-us or "
                       "--preferred-batch-size", ExitCode.USAGE)


def _served_model(spec: str, args: argparse.Namespace, current: dict[str, Any] | None = None) -> dict[str, Any]:
    """One entry of "models". With `current` (the entry the deployment serves now) every setting not given on the
    command line keeps its current value, down to one field of batching or of the instance group; without it what
    is not given is left out, and the portal chooses (its defaults depend on the model)."""
    model, version = _split_model(spec)
    entry: dict[str, Any] = {key: current[key] for key in _SETTINGS if current is not None and key in current}
    entry["model"] = model
    if version is not None:
        entry["version"] = version
    if args.max_batch_size is not None:
        entry["max_batch_size"] = args.max_batch_size
    batching_options = args.max_queue_delay_us is not None or args.preferred_batch_size
    if args.dynamic_batching is False:
        entry["dynamic_batching"] = None
    elif args.dynamic_batching or batching_options:
        # Naming a batching option means wanting dynamic batching; no need to also say --dynamic-batching.
        batching = dict(entry.get("dynamic_batching") or {"max_queue_delay_microseconds": 0,
                                                          "preferred_batch_size": []})
        if args.max_queue_delay_us is not None:
            batching["max_queue_delay_microseconds"] = args.max_queue_delay_us
        if args.preferred_batch_size:
            batching["preferred_batch_size"] = list(args.preferred_batch_size)
        entry["dynamic_batching"] = batching
    if args.instances is not None or args.kind is not None:
        group = dict(entry.get("instance_group") or {"count": 1, "kind": "cpu"})
        if args.kind is not None and args.kind != group.get("kind"):
            group.pop("gpus", None)  # GPU ids belong to the kind they were chosen for
            group["kind"] = args.kind
        if args.instances is not None:
            group["count"] = args.instances
        entry["instance_group"] = group
    return entry


def _current_settings(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The served models of a deployment (the API's output) by model name."""
    return {str(m.get("model")): m for m in deployment.get("models") or [] if isinstance(m, dict)}


def _model_options_given(args: argparse.Namespace) -> bool:
    """Whether the command line sets any serving setting of a model (batching, batch size, instances)."""
    return any(value is not None for value in (args.max_batch_size, args.dynamic_batching, args.max_queue_delay_us,
                                               args.instances, args.kind)) or bool(args.preferred_batch_size)


def _changed_models(args: argparse.Namespace, found: dict[str, Any]) -> list[dict[str, Any]] | None:
    """"models" for a PATCH of the deployment `found` (the API's output): each --model keeps its current settings
    but what the command line gives, unless --reset asks for the portal's defaults. Without --model the models
    served now stay, at their versions, with the options given applied to each; None: nothing of them changes."""
    current = _current_settings(found)
    if args.model:
        return [_served_model(spec, args, None if args.reset else current.get(_split_model(spec)[0]))
                for spec in args.model]
    if not args.reset and not _model_options_given(args):
        return None
    served = []
    for name, entry in current.items():
        version = entry.get("version")
        spec = f"{name}:{version}" if isinstance(version, int) else name
        served.append(_served_model(spec, args, None if args.reset else entry))
    return served


def _placement(args: argparse.Namespace) -> dict[str, Any] | None:
    """"placement" as given: only the options named (a PATCH keeps the rest, as the API does); None: none given."""
    if args.placement == "dedicated" and (args.pool is not None or args.idle_unload is not None):
        raise CliError("--pool and --idle-unload are for a shared deployment: use them with --shared, not "
                       "--dedicated", ExitCode.USAGE)
    placement: dict[str, Any] = {}
    if args.placement:
        placement["mode"] = args.placement
    if args.pool is not None:
        placement["pool"] = check_name(args.pool, "--pool")
    if args.idle_unload is not None:
        placement["idle_unload_seconds"] = args.idle_unload
    return placement or None


def _resources(args: argparse.Namespace, found: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """"resources" with --memory and --cpu; None: neither given. The API's PATCH replaces the whole object, so on
    an update the rest (the other of the two, GPUs) is the deployment's current value."""
    given = {key: value for key, value in (("memory", args.memory), ("cpu", args.cpu)) if value is not None}
    if not given:
        return None
    current = (found or {}).get("resources")
    return {**(current if isinstance(current, dict) else {}), **given}


def _find_deployment(client: Client, name: str) -> tuple[dict[str, Any] | None, str]:
    """The deployment of that name in the token's team, or None and the portal's 404 (which names the team)."""
    try:
        return dict(client.get(f"/api/v1/deployments/{_segment(name)}/")), ""
    except ApiError as exc:
        if exc.status != 404:
            raise
        return None, exc.reason


def _send_deployment(client: Client, args: argparse.Namespace, method: str, path: str,
                     body: dict[str, Any]) -> dict[str, Any]:
    """POST or PATCH a deployment. A refused entry of "models" whose model the token's team lacks is a wrong name
    on the command line (exit 2, as the portal's 404 is everywhere else), not a refusal (1): the 400 names the
    entry, the model's 404 says it is the name (a version or a setting refused stays a refusal)."""
    try:
        return dict(client.call(method, path, json=body).json())
    except ApiError as exc:
        if exc.status == 400 and any(key.startswith("models") for key in exc.fields):
            _refuse_unknown_models(client, args)
        raise


def _refuse_unknown_models(client: Client, args: argparse.Namespace) -> None:
    for spec in args.model or []:
        model, _ = _split_model(spec)
        try:
            client.get(f"/api/v1/models/{_segment(model)}/")
        except ApiError as exc:
            if exc.status == 404:
                raise CliError(f"--model {spec}: {exc.reason}", ExitCode.USAGE) from None
            return  # the portal's first answer (the 400) says more than this one


def _update_body(args: argparse.Namespace, found: dict[str, Any]) -> dict[str, Any]:
    """A PATCH of only what the command line gives: the API keeps every field left out, and a placement option
    alone keeps the mode and the pool."""
    if args.runtime and args.runtime != found.get("runtime"):
        raise CliError(f"{args.name} runs on the {found.get('runtime')} runtime, which cannot change: deploy under "
                       f"another name for --runtime {args.runtime}", ExitCode.USAGE)
    body: dict[str, Any] = {}
    models = _changed_models(args, found)
    if models is not None:
        body["models"] = models
    resources = _resources(args, found)
    if resources is not None:
        body["resources"] = resources
    placement = _placement(args)
    if placement is not None:
        body["placement"] = placement
    return body


def _create_body(args: argparse.Namespace, missing: str) -> dict[str, Any]:
    """A POST of a new deployment; `missing`: the portal's word that it has none of the name."""
    if not args.model:
        raise CliError(f"{args.name} is a new deployment, so it needs a model: add --model MODEL[:VERSION] ({missing})",
                       ExitCode.USAGE)
    body: dict[str, Any] = {"name": args.name, "models": [_served_model(spec, args) for spec in args.model]}
    if args.runtime:
        body["runtime"] = args.runtime
    resources = _resources(args)
    if resources is not None:
        body["resources"] = resources
    placement = _placement(args)
    if placement is not None:
        body["placement"] = placement
    return body


def cmd_deploy(args: argparse.Namespace) -> int:
    check_name(args.name, "deployment")
    _check_batching_options(args)
    for spec in args.model or []:
        _split_model(spec)
    _placement(args)  # its usage errors before anything is sent
    client = make_client(args)
    path = f"/api/v1/deployments/{_segment(args.name)}/"
    # An existing name takes the update path: a create's body is checked before its name, so anything a create
    # would refuse (a placement option alone, a team at its memory ceiling) failed a CI re-run that only changes
    # what it is given.
    found, missing = _find_deployment(client, args.name)
    if args.canary is not None:
        if found is None:
            raise CliError(f"a canary needs a deployment that serves already, so deploy {args.name} without --canary "
                           f"first ({missing})", ExitCode.USAGE)
        return _deploy_canary(client, args, found, path)
    if found is None:
        created = _create(client, args, missing)
        if created is not None:
            return _report_deploy(client, args, created, "created")
        found = dict(client.get(path))  # created in between (another job of the same pipeline): update it
    deployment = _send_deployment(client, args, "PATCH", path, _update_body(args, found))
    # The portal makes no revision of the settings in effect already: nothing rolls out, and a script can tell. Nor
    # of a new idle time alone, which it sets in place.
    unchanged = deployment.get("revision") == found.get("revision")
    idle = [(d.get("placement") or {}).get("idle_unload_seconds") for d in (found, deployment)]
    action = ("updated in place (the idle time: nothing reloads)" if unchanged and idle[0] != idle[1] else
              "unchanged (these are the settings in effect already)" if unchanged else "updated")
    return _report_deploy(client, args, deployment, action)


def _create(client: Client, args: argparse.Namespace, missing: str) -> dict[str, Any] | None:
    """POST the deployment; None where the portal answers 409, that one of the name exists (made since the GET)."""
    try:
        return _send_deployment(client, args, "POST", "/api/v1/deployments/", _create_body(args, missing))
    except ApiError as exc:
        if exc.status != 409:
            raise
        return None


def _report_deploy(client: Client, args: argparse.Namespace, deployment: dict[str, Any], action: str) -> int:
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


def _deploy_canary(client: Client, args: argparse.Namespace, found: dict[str, Any], path: str) -> int:
    """A new revision of an existing deployment, served beside the current one for --canary percent of the
    requests until `modelport promote` or `modelport rollback` (or its guardrails) end it."""
    patch = _update_body(args, found)
    patch["rollout"] = {"strategy": "canary", "percent": args.canary}
    deployment = _send_deployment(client, args, "PATCH", path, patch)
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
    print(f"placement: {_describe_placement(deployment.get('placement') or {})}")
    memory = deployment.get("memory")
    if isinstance(memory, dict):
        # How the limit was chosen (a derived one names its figures): what --memory would change.
        print(f"memory:    {memory.get('limit') or 'no limit'} ({memory.get('source')}"
              + (f": {memory.get('basis')}" if memory.get("basis") else "") + ")")
    print("models:")
    for model in deployment.get("models") or []:
        print("  " + _describe_served_model(model))
    return ExitCode.OK


def _describe_placement(placement: dict[str, Any]) -> str:
    """"shared in pool shared: loaded, cold start 0.84 s, unloaded after 10m unused", or "dedicated"."""
    if placement.get("mode") != "shared":
        return str(placement.get("mode") or "dedicated")
    parts = [str(placement.get("state") or "not loaded yet")]
    cold = placement.get("cold_start_seconds")
    if isinstance(cold, (int, float)):
        parts.append(f"cold start {cold:.2f} s")
    if placement.get("memory_bytes"):
        parts.append(f"memory {human_size(int(placement['memory_bytes']))}")
    idle = int(placement.get("idle_unload_seconds") or 0)
    parts.append(f"unloaded after {_duration_words(idle)} unused" if idle else "never unloaded")
    return f"shared in pool {placement.get('pool')}: " + ", ".join(parts)


def _duration_words(seconds: int) -> str:
    """The inverse of _duration: 600 -> "10m", 90 -> "90s", 3600 -> "1h"."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def cmd_pools(args: argparse.Namespace) -> int:
    """The pools the token's team may deploy into, and with --model what fits of it."""
    params: dict[str, Any] = {}
    if args.model:
        model, version = _split_model(args.model)
        params["model"] = model
        if version is not None:
            params["version"] = version
    found = list(make_client(args).get("/api/v1/pools/", params=params or None))
    if args.json:
        print_json(found)
        return ExitCode.OK
    if not found:
        print("no pools: deploy with --dedicated")
        return ExitCode.OK
    for pool in found:
        who = "every team, ONNX only" if pool.get("teams") == "all" else "your team"
        idle = int(pool.get("idle_unload_seconds") or 0)
        line = (f"{pool.get('name')}  ({pool.get('runtime')}, {who})  "
                f"{human_size(int(pool.get('memory_used_bytes') or 0))} of "
                f"{human_size(int(pool.get('memory_budget_bytes') or 0))} used, {pool.get('models_loaded')} "
                f"model(s) loaded, idle unload {_duration_words(idle) if idle else 'never'}")
        fit = pool.get("fit")
        if isinstance(fit, dict):
            what = f"{fit.get('model')}:{fit.get('version')}"
            if fit.get("fits") is None:
                line += f"; {what} not measured yet (measured at its first load in a pool)"
            else:
                line += f"; {what} fits {fit.get('copies')} more ({human_size(int(fit.get('memory_bytes') or 0))} each)"
        print(line)
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
    params = {key: value for key, value in (("lines", args.lines), ("revision", args.revision)) if value is not None}
    response = client.call("GET", f"/api/v1/deployments/{_segment(args.name)}/logs/", params=params or None,
                           stream=True)
    try:
        body = dict(json.loads(read_at_most(response, MAX_LOG_ANSWER_BYTES)))
    except ValueError:
        raise CliError("the portal's answer is not the JSON of a log", ExitCode.ERROR) from None
    if args.json:
        print_json(body)
    else:
        # What a model wrote, printed to a terminal: no escape sequence of it reaches the terminal.
        log = _TERMINAL_CONTROL_RE.sub("\ufffd", str(body.get("log") or ""))
        _say_whose_log(args.name, body)
        if not args.all:
            log, folded = fold_gpu_noise(log)
            if folded:
                info(f"{folded} line(s) about CUDA, NVML or DCGM that Triton prints on every machine without a GPU "
                     "are left out; --all shows them")
        sys.stdout.write(log if log.endswith("\n") or not log else log + "\n")
    return ExitCode.OK


_LOG_ROLES = {"serving": "serving", "canary": "canary", "starting": "not serving yet", "retired": "no longer serving"}


def _say_whose_log(name: str, body: dict[str, Any]) -> None:
    """On stderr (stdout is the log alone): whose log this is, and how to get the canary's while there is one."""
    number, canary = body.get("revision"), body.get("canary_revision")
    if isinstance(number, int):
        info(f"the log of revision {number} ({_LOG_ROLES.get(str(body.get('revision_role')), 'its role unknown')})")
    if isinstance(canary, int) and canary != number:
        info(f"the canary, revision {canary}, writes its own: modelport logs {name} --revision {canary}")


# The deployment page's fold (web/logs.py; a test keeps the two equal): lines a Triton on a machine without a GPU
# always prints read like failures and say nothing about the models. A line naming a model stays.
GPU_NOISE = re.compile(r"cuda|nvml|dcgm|pinned (system )?memory|gpu metrics", re.IGNORECASE)
_MODEL_LINE = re.compile(r"\bmodel|failed to load|loading:", re.IGNORECASE)


def fold_gpu_noise(log: str) -> tuple[str, int]:
    """The log without the GPU noise, and how many lines were left out."""
    lines = log.splitlines(keepends=True)
    kept = [line for line in lines if not GPU_NOISE.search(line) or _MODEL_LINE.search(line)]
    return "".join(kept), len(lines) - len(kept)


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
    try:
        body = dict(client.call("POST", f"/api/v1/deployments/{_segment(args.name)}/{action}",
                                idempotency_key=False).json())
    except ApiError as exc:
        # The portal's "no canary" speaks of a PATCH's rollout; a CLI user starts one with deploy --canary.
        if (exc.status == 409 and not canary) or "no canary" in exc.reason:
            verb = "promote" if action == "promote" else "roll back"
            raise CliError(f"{args.name} has no canary to {verb}: start one with 'modelport deploy {args.name} "
                           "--model MODEL[:VERSION] --canary PERCENT'") from None
        raise
    if args.json:
        print_json(body)
    elif action == "promote":
        print(f"{args.name}: revision {body.get('serving_revision')} promoted; it serves every request")
    else:
        print(f"{args.name}: canary revision {canary.get('revision')} rolled back; revision "
              f"{body.get('serving_revision')} serves every request")
    return ExitCode.OK


# The windows the portal offers (performance/windows.py; a test keeps the two equal).
PERF_WINDOWS = ("5m", "15m", "1h", "6h", "24h")


def cmd_perf(args: argparse.Namespace) -> int:
    """Where a deployment's time goes over a window: the gateway's percentiles, and per model the gateway's share
    (requests, errors, p99, its own time) beside Triton's queue and compute means and the batch sizes it formed,
    with advice when the queue dominates."""
    check_name(args.name, "deployment")
    body = dict(make_client(args).get(f"/api/v1/deployments/{_segment(args.name)}/performance/",
                                      params={"window": args.window}))
    if args.json:
        print_json(body)
        return ExitCode.OK
    revisions = body.get("revisions") or []
    if not revisions:
        print(f"{args.name}: no revision served in the last {body.get('window') or args.window}")
        return ExitCode.OK
    for revision in revisions:
        _print_revision_performance(revision, str(body.get("window") or args.window))
    return ExitCode.OK


def _ms(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "-"


def _print_revision_performance(revision: dict[str, Any], window: str) -> None:
    snapshots = int(revision.get("snapshots") or 0)
    span = (f"{revision.get('from')} .. {revision.get('to')}" if revision.get("from")
            else f"last {window}, Triton's statistics not read twice yet")
    print(f"revision {revision.get('revision')} ({revision.get('role')}): {span}, {snapshots} snapshot(s)")
    gateway = revision.get("gateway") or {}
    print(f"  gateway: {gateway.get('requests', 0)} requests, {gateway.get('errors', 0)} errors; "
          f"p50 {_ms(gateway.get('p50_ms'))} ms, p95 {_ms(gateway.get('p95_ms'))} ms, "
          f"p99 {_ms(gateway.get('p99_ms'))} ms; its own time {_ms(gateway.get('own_mean_ms'))} ms (mean)")
    models = revision.get("models") or []
    if not models:
        return
    # Per model, the gateway's share (what it answered for that model: requests, errors, p99, its own mean time)
    # beside Triton's (requests, errors, queue and compute means, batch sizes).
    print(f"  {'':<24} {'[gateway: requests, errors, ms]':^33}  [Triton: requests, errors, ms (means)]")
    print(f"  {'model':<24} {'requests':>8} {'errors':>6} {'p99':>8} {'own':>8}  {'requests':>8} {'errors':>6} "
          f"{'queue':>8} {'input':>8} {'infer':>8} {'output':>8} {'queue%':>6}  batch sizes (size x executions)")
    for model in models:
        share = model.get("queue_share")
        batches = " ".join(f"{b.get('batch_size')}x{b.get('executions')}" for b in model.get("batch_sizes") or [])
        name = str(model.get("model"))
        if model.get("step_of"):
            name += " (step)"
        own = model.get("gateway") or {}
        print(f"  {name:<24} {own.get('requests', 0):>8} {own.get('errors', 0):>6} {_ms(own.get('p99_ms')):>8} "
              f"{_ms(own.get('own_mean_ms')):>8}  {model.get('requests', 0):>8} {model.get('errors', 0):>6} "
              f"{_ms(model.get('queue_ms')):>8} {_ms(model.get('compute_input_ms')):>8} "
              f"{_ms(model.get('compute_infer_ms')):>8} {_ms(model.get('compute_output_ms')):>8} "
              f"{(f'{share:.0%}' if isinstance(share, (int, float)) else '-'):>6}  {batches or '-'}"
              + ("  (its Triton restarted in the window)" if model.get("restarted") else ""))
    for model in models:
        for words in model.get("advice") or []:
            print(f"  advice: {one_line(str(words))}")


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


def _idle_duration(text: str) -> int:
    """--idle-unload: a duration, or 0 / "never" for never."""
    return 0 if text.strip().lower() == "never" else _duration(text)


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
        tune = _apply_tune(client, f"{base}/tunes/{tune['id']}/apply", args)
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


def _apply_tune(client: Any, path: str, args: argparse.Namespace) -> dict[str, Any]:
    """POST the apply; where it would narrow what clients may send and --narrow was not given, show the changes and
    ask (on a terminal) before applying with narrowing chosen, else stop with the portal's list of changes."""
    body: dict[str, Any] = ({"rollout": {"strategy": "canary", "percent": args.canary}}
                            if args.canary is not None else {})
    try:
        return dict(client.call("POST", path, json={**body, "narrow": bool(args.narrow)}).json())
    except ApiError as exc:
        if exc.status != 400 or "narrow" not in exc.fields:
            raise
        reason = " ".join(exc.fields["narrow"])
    if args.json or not sys.stdin.isatty():
        raise CliError(f"not applied: {reason} (add --narrow to apply anyway)", ExitCode.USAGE)
    print(reason, file=sys.stderr)
    if input("Narrow what clients may send and apply? [y/N] ").strip().lower() not in ("y", "yes"):
        raise CliError("not applied: the tuned settings would narrow what clients may send", ExitCode.USAGE)
    return dict(client.call("POST", path, json={**body, "narrow": True}).json())


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
        # A miss says why (p99 over the target at each concurrency, errors, a server that did not start).
        why = row.get("missed") or row.get("error") or ""
        note = "" if row.get("meets_target") else f" (missed: {one_line(str(why))})" if why else " (missed)"
        runs = row.get("samples") or []
        if len(runs) > 1:  # re-measured: the throughput is the median of its runs
            note = f" (median of {len(runs)} runs, spread {row.get('spread_pct')}%)" + note
        if row.get("current"):
            note = " (current)" + note
        print(f"{mark}{row.get('label', '')[:39]:<39} {row.get('throughput', 0):>9.1f} "
              f"{'-' if p50 is None else f'{p50:.1f}':>8} {'-' if p99 is None else f'{p99:.1f}':>8} "
              f"{row.get('concurrency') or '-':>7}{note}")
    print(one_line(str(tune.get("message") or "")))
    if tune.get("applied_revision") and "changes" in tune and not tune["changes"]:
        print(f"applied: nothing changes, revision {tune['applied_revision']} serves these settings already")
    elif tune.get("applied_revision"):
        print(f"applied: revision {tune['applied_revision']} rolls out")
    for change in tune.get("changes") or []:
        before, after = change.get("before"), change.get("after")
        why = f" ({change['why']})" if change.get("why") else ""
        print(f"  changed {change.get('model')}: {change.get('setting')} {before} -> {after}{why}")


def cmd_infer(args: argparse.Namespace) -> int:
    check_name(args.name, "deployment")
    check_name(args.model, "model")
    if args.input is None and not args.file:
        raise CliError("give --input FILE.json, or --file INPUT=PATH for a BYTES input (or both)", ExitCode.USAGE)
    request: Any = read_json_file(args.input, "--input") if args.input is not None else {"inputs": []}
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise CliError(f"--input {args.input}: expected KServe v2 JSON, "
                       '{"inputs": [{"name", "shape", "datatype", "data"}]}', ExitCode.USAGE)
    files = [_file_input(value) for value in args.file or []]
    client = make_client(args)
    path = f"/serve/{_segment(args.name)}/v2/models/{_segment(args.model)}/infer"
    # An inference changes nothing, so it is retried like a GET; it creates nothing to deduplicate.
    if files:
        payload, header_length = binary_request(request, files)
        response = client.call("POST", path, data=payload, idempotency_key=False, headers={
            "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_length)})
    else:
        response = client.call("POST", path, json=request, idempotency_key=False)
    body = dict(response.json())
    if args.json:
        print_json(body)
        return ExitCode.OK
    for output in body.get("outputs") or []:
        shape = "x".join(str(d) for d in output.get("shape") or [])
        print(f"{output.get('name')} ({output.get('datatype')} [{shape}]): {json.dumps(output.get('data'))}")
    return ExitCode.OK


def _file_input(value: str) -> tuple[str, bytes]:
    """--file INPUT=PATH: the input's name and the file's bytes."""
    name, sep, filename = value.partition("=")
    if not sep or not name or not filename:
        raise CliError(f"--file {value!r}: expected INPUT=PATH, e.g. --file image=digit.png", ExitCode.USAGE)
    try:
        return name, Path(filename).read_bytes()
    except OSError as exc:
        raise CliError(f"--file {value}: {exc.strerror or exc}", ExitCode.USAGE) from None


def binary_request(request: dict[str, Any], files: list[tuple[str, bytes]]) -> tuple[bytes, int]:
    """The request with each file as a BYTES input whose every element is the file's bytes, and the length of its
    JSON header. JSON cannot carry a file's raw bytes (Triton reads a JSON string's UTF-8 as the element, and a
    PNG is not UTF-8), so the body is Triton's binary tensor extension, as the page's Try it sends a file: the JSON
    header, then each such input's elements as a 4-byte little-endian length and the bytes. The input's shape is
    the one --input gives it, else [1, 1]: one element, in a batch of one."""
    given = {t.get("name"): t for t in request["inputs"] if isinstance(t, dict)}
    by_name = dict(files)
    if len(by_name) < len(files):
        raise CliError("--file names an input twice", ExitCode.USAGE)
    for name, tensor in given.items():
        if name in by_name and tensor.get("datatype", "BYTES") != "BYTES":
            raise CliError(f"--file {name}=...: --input gives {name} as {tensor.get('datatype')}; a file is sent "
                           "to a BYTES input", ExitCode.USAGE)
    header: list[dict[str, Any]] = []
    blobs: list[bytes] = []

    def attach(name: str, shape: Any) -> None:
        if not isinstance(shape, list) or not all(type(n) is int and n >= 1 for n in shape):
            raise CliError(f"--input gives {name} the shape {shape!r}: positive sizes are needed", ExitCode.USAGE)
        count = 1
        for size in shape:
            count *= size
        element = len(by_name[name]).to_bytes(4, "little") + by_name[name]
        blobs.append(element * count)
        header.append({"name": name, "shape": shape, "datatype": "BYTES",
                       "parameters": {"binary_data_size": len(blobs[-1])}})

    for tensor in request["inputs"]:
        name = tensor.get("name") if isinstance(tensor, dict) else None
        if name in by_name:
            attach(name, tensor.get("shape", [1, 1]))
        else:
            header.append(tensor)
    for name, _ in files:
        if name not in given:
            attach(name, [1, 1])
    head = json.dumps({**request, "inputs": header}, separators=(",", ":")).encode()
    return head + b"".join(blobs), len(head)


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

    push = add("push", cmd_push, "upload a model file (or import one --from a registry or URL) as a new version and "
                                 "wait until it is validated")
    push.add_argument("model", metavar="MODEL")
    push.add_argument("path", metavar="PATH", nargs="?", help="the file to upload (or --from)")
    push.add_argument("--from", dest="source", metavar="SOURCE", help=(
        "import instead of uploading: models:/NAME/VERSION or models:/NAME@ALIAS (MLflow's registry), "
        "hf://ORG/REPO[@REVISION] (Hugging Face, revision main by default), s3://BUCKET/KEY or https://..."))
    push.add_argument("--file", dest="files", action="append", metavar="NAME",
                      help="with --from hf://: a file of the repository to import (repeat it)")
    push.add_argument("--new-version", action="store_true",
                      help="with --from: import again even if a version of this model came from the same source")
    push.add_argument("--format", help="declare the format (onnx, torchscript, ...) instead of detecting it")
    push.add_argument("--signature", metavar="FILE.json",
                      help='inputs and outputs: {"inputs": [{"name", "datatype", "dims"}], "outputs": [...]}')
    push.add_argument("--max-batch-size", type=_non_negative_int, metavar="N")
    push.add_argument("--example-request", metavar="FILE.json", help=(
        'a KServe v2 request for the model, {"inputs": [{"name", "datatype", "shape", "data"}]} (BYTES: a string '
        'or {"b64": ...}): the trial call of a python model sends it instead of zeros'))
    push.add_argument("--decoupled", action="store_true", help=(
        "a python model that streams its answer in pieces (Triton's decoupled mode): served by /generate_stream "
        "and gRPC's stream, not /infer"))
    push.add_argument("--chat-template", metavar="FILE", help=(
        "a Jinja chat template (at most 64 KiB of UTF-8) for the OpenAI-compatible chat endpoint: how messages become "
        "the model's text_input"))
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
    deploy.description = (
        "Create a deployment, or roll an existing one to a new revision. An existing name (in the token's team) "
        "takes the update path, whatever a create of the same options would say: only what is given changes (as "
        "the API's PATCH), and --model may be left out. Each --model keeps its current batching, instances and "
        "batch size but the options given, down to one field (--instances 2 keeps the queue delay); the models "
        "served are the --model options, or without any the current ones at their versions (--instances 2 alone "
        "applies to each); --shared, --pool or --idle-unload change only the placement given (--idle-unload 10m "
        "alone keeps the pool), --memory or --cpu only that resource. --reset starts each model from the portal's "
        "defaults instead. A new deployment needs --model.")
    deploy.add_argument("name", metavar="NAME")
    deploy.add_argument("--model", action="append", metavar="MODEL:VERSION", help=(
        "a model to serve (repeat for several); MODEL alone means its latest ready version; required for a new "
        "deployment"))
    deploy.add_argument("--reset", action="store_true", help=(
        "on an existing deployment: settings not given go back to the portal's defaults instead of keeping their "
        "current values"))
    batching = deploy.add_mutually_exclusive_group()
    batching.add_argument("--dynamic-batching", dest="dynamic_batching", action="store_true", default=None)
    batching.add_argument("--no-dynamic-batching", dest="dynamic_batching", action="store_false")
    deploy.add_argument("--max-queue-delay-us", type=_non_negative_int, metavar="N")
    deploy.add_argument("--preferred-batch-size", type=_positive_int, nargs="+", action="extend", metavar="N")
    deploy.add_argument("--max-batch-size", type=_non_negative_int, metavar="N")
    deploy.add_argument("--instances", type=_positive_int, metavar="N", help="model instances per Triton server")
    deploy.add_argument("--kind", choices=["cpu", "gpu"])
    deploy.add_argument("--runtime", choices=["local", "kubernetes"])
    deploy.add_argument("--memory", type=quantities.memory, metavar="SIZE", help=(
        "the memory limit per server (a local Triton, a pod), e.g. 512Mi, 2Gi (default: the portal's)"))
    deploy.add_argument("--cpu", type=quantities.cpu, metavar="CORES", help=(
        "the cores per server, e.g. 1.5, 2 or 500m (default: the portal's)"))
    placement = deploy.add_mutually_exclusive_group()
    placement.add_argument("--shared", dest="placement", action="store_const", const="shared", default=None, help=(
        "load its models on demand into a shared pool's Triton beside other deployments' (costs less; the first "
        "request after an idle unload waits for the load); pools open to every team take ONNX only"))
    placement.add_argument("--dedicated", dest="placement", action="store_const", const="dedicated",
                           help="a Triton server of its own (the default unless the operator changed it)")
    deploy.add_argument("--pool", metavar="POOL", help="with --shared: the pool ('modelport pools'; default: shared)")
    deploy.add_argument("--idle-unload", type=_idle_duration, metavar="T", help=(
        "with --shared: unload its models after T unused, e.g. 90s, 10m, 1h; 0 or never: keep them loaded "
        "(default: the pool's)"))
    deploy.add_argument("--canary", type=_percent, metavar="PERCENT", help=(
        "roll the new revision out as a canary: it takes PERCENT (1-99) of the requests beside the serving one "
        "until 'modelport promote' or 'modelport rollback'"))
    deploy.add_argument("--wait", action="store_true", help="wait until the new revision serves")
    deploy.add_argument("--timeout", type=_seconds, default=DEFAULT_DEPLOY_TIMEOUT, metavar="S",
                        help=f"how long --wait waits (default {DEFAULT_DEPLOY_TIMEOUT:g})")

    add("status", cmd_status, "show a deployment").add_argument("name", metavar="NAME")
    pools = add("pools", cmd_pools, "list the shared pools your team may deploy into, with their capacity")
    pools.add_argument("--model", metavar="MODEL:VERSION", help=(
        "say how many more copies of this model version fit in each pool (measured when it last loaded)"))
    logs = add("logs", cmd_logs, "print the Triton log of a deployment")
    logs.add_argument("name", metavar="NAME")
    logs.add_argument("--lines", type=_positive_int, metavar="N")
    logs.add_argument("--revision", type=_positive_int, metavar="N", help=(
        "the log of revision N (the canary's, say); the serving revision's if not given"))
    logs.add_argument("--all", action="store_true", help=(
        "also the CUDA, NVML and DCGM lines every Triton prints on a machine without a GPU (left out by default, "
        "as on the deployment's page)"))
    perf = add("perf", cmd_perf, "show where a deployment's time goes: gateway, Triton's queue and compute per "
                                 "model, the batch sizes Triton formed, and what to change when the queue dominates")
    perf.add_argument("name", metavar="NAME")
    perf.add_argument("--window", choices=PERF_WINDOWS, default="15m", help="the window (default 15m)")
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
    tune.add_argument("--apply", action="store_true", help="roll out the recommendation as a new revision (every "
                      "setting it changes is printed; one that narrows what clients may send is asked about first)")
    tune.add_argument("--narrow", action="store_true", help=(
        "with --apply: apply even where the tuned settings narrow what clients may send (a lower max batch size), "
        "without asking"))
    tune.add_argument("--canary", type=_percent, metavar="PERCENT", help=(
        "with --apply: roll the tuned revision out as a canary taking PERCENT (1-99) of the requests beside the "
        "serving one (then `modelport promote` or `modelport rollback`)"))
    tune.add_argument("--timeout", type=_seconds, default=None, metavar="S",
                      help="how long to wait (default: three times the budget plus two minutes)")

    infer = add("infer", cmd_infer, "send one inference request (KServe v2 JSON) through the portal")
    infer.add_argument("name", metavar="NAME")
    infer.add_argument("model", metavar="MODEL")
    infer.add_argument("--input", metavar="FILE.json", help="the request (KServe v2 JSON; '-' is stdin)")
    infer.add_argument("--file", action="append", metavar="INPUT=PATH", help=(
        "a file's bytes as the BYTES input INPUT (an image, say), sent as raw bytes; its shape is the one --input "
        "gives INPUT, else [1, 1]; repeat for more inputs"))
    return parser


def _stdout_to_devnull() -> None:
    """The standard recipe for a closed pipe (docs.python.org, signal: "Note on SIGPIPE")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (captured, say): nothing will flush to the pipe
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


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
    except BrokenPipeError:
        # The reader closed stdout (`modelport infer ... | head -1`): it has what it wanted, so no traceback and no
        # error line. Python flushes stdout once more at exit, which would raise again: point it at devnull first.
        # 141 is what a shell reports for a command killed by SIGPIPE (128 + 13), as 130 above is for SIGINT.
        _stdout_to_devnull()
        return 141
