#!/usr/bin/env python3
"""The agent container of a Kubernetes pool's Triton pod: it loads and unloads revisions as the worker says.

Usage: python3 pool_agent.py --desired DIR --repository DIR [--triton URL] [--interval S] [--once]
       (in the portal's tree: python -m deployments.runtimes.kubernetes.pool_agent ...)

How it is told: the worker writes one key per revision (`d<deployment>-r<revision>.json`) into the pool's loads
Secret, which the kubelet mounts into this container (and into no other) at --desired. The agent reads that
directory every --interval seconds and converges: a revision listed and not loaded is fetched and loaded, one
loaded and no longer listed is unloaded and its files removed. A mounted Secret rather than an HTTP port: the worker
would otherwise need a way into every pod the autoscaler adds (and a NetworkPolicy opening the pods to it), the
pod's other container, running in the same network namespace, could call a port on localhost too, and the agent
would need a credential to check callers; a Secret reaches every replica, new ones included, with nothing to
listen on. The price is the kubelet's sync of mounted Secrets (about a minute at worst). A Secret rather than a
ConfigMap: the entries hold presigned URLs, read credentials.

What each entry holds, and what the agent checks before anything is written (every entry is untrusted until it
passes): its revision key, the models to load (in order) all named `<key>-...`, and its files, each a path inside
the repository under one of the revision's own model directories, a size (at most --max-file-bytes, the entry's
total at most --max-revision-bytes), a sha256 and a presigned GET URL. Each file is streamed to a temporary name,
counted and hashed, and renamed into place only when both match (fetch_repository.py's checks, shared with the
dedicated pods' init container); a download never reads past the recorded size.

It then calls Triton's repository API on localhost (load, unload), restricted by the admin key in
$MODELPORT_ADMIN_KEY. After every pass that changed something it prints one status line, which the worker reads
from this container's log (the only thing that writes to it):

    modelport-pool-agent status {"loaded": ["d3-r1"], "failed": {"d4-r2": "why"}, "sha256": {"d4-r2": "<entry's>"},
                                 "last_used": {"d3-r1": 1764600000000}, "memory": {"d3-r1": {"digits": 1048576}}}

(the sha256 of each refused entry's bytes as mounted, so that the worker never reads an old refusal as the
current entry's; each loaded revision's last inference, in ms since the epoch, from Triton's statistics, so that
the worker unloads an idle one; and each model's memory: the peak resident memory its own processes report in
--usage-dir, summed over its instances, or where a model reports none, the `memory_usage` Triton's statistics give
at load). A line is printed too when a revision's last use moved on by USAGE_REPORT_SECONDS, or a model's memory
grew by MEMORY_REPORT_FRACTION, not at every request.

Confinement (docs/security.md): an entry gives each model's memory limit (`memory_limits`, bytes per process); the
agent writes it to --limits-dir/<model> before the load, where the stub wrapper of Triton's container
(pool_stub.py) reads it and limits the model's process to it before any model code runs. Only this container can
write that directory; a model with no limit there does not load.

An entry marked `"unloaded": true` is one the worker found idle: the agent unloads its models and removes its files
(the next load fetches them again, every sha256 checked again, so the repository emptyDir holds only what is
loaded), and loads it again once the worker clears the mark.

Standard library only, and Python 3.8+: it runs in a slim python image (KUBERNETES_FETCH_IMAGE) or Triton's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from typing import Any

try:  # in the portal's tree
    from deployments.runtimes.kubernetes import fetch_repository as fetch
except ImportError:
    # in the pod: the sibling file of the same ConfigMap (run with python3 -I, no script dir on the path)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import fetch_repository as fetch  # type: ignore[no-redef]

STATUS_PREFIX = "modelport-pool-agent status "
ADMIN_HEADER = "modelport-admin-key"
ADMIN_KEY_ENV = "MODELPORT_ADMIN_KEY"
REVISION_RE = re.compile(r"d[0-9]{1,12}-r[0-9]{1,9}")
MODEL_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,200}")
MAX_ENTRY_BYTES = 512 * 1024  # an entry's JSON (a Secret holds 1 MiB in all)
MAX_MESSAGE = 500
PYTHON_BACKEND_RE = re.compile(r'^\s*backend\s*:\s*"python"', re.MULTILINE)
MAX_USAGE_FILES = 64  # a model's instances (Triton's instance_group count is within the portal's ceilings)
USAGE_FILE_BYTES = 32
MEMORY_REPORT_FRACTION = 0.1  # a model's figure that grew by a tenth is worth a status line
TRITON_TIMEOUT_SECONDS = 600.0  # a load of a big model
USAGE_REPORT_SECONDS = 10.0


class Refused(Exception):
    """An entry the agent will not act on, or a load that failed: the revision is reported failed with this."""


def log(message: str) -> None:
    """One line, whatever the message quotes (Triton's error for a team's model, a server's answer): every character
    that is not printable (newlines, U+2028 and U+2029, NEL, other controls) is written escaped, so that no message
    can start a line that reads as the agent's about another revision."""
    safe = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in message)
    print(f"modelport-pool-agent: {safe}", flush=True)


# --- What the worker asks for ------------------------------------------------------------------------------------


def read_desired(directory: Path) -> dict[str, bytes]:
    """The entries of the mounted Secret: {revision key: raw JSON}. The kubelet's own `..data` links and anything
    not named like a revision are skipped; an entry too big is kept (and refused when checked)."""
    found: dict[str, bytes] = {}
    if not directory.is_dir():
        return found
    for path in sorted(directory.iterdir()):
        name = path.name
        if name.startswith(".") or not name.endswith(".json") or not REVISION_RE.fullmatch(name[:-5]):
            continue
        try:
            with path.open("rb") as handle:
                found[name[:-5]] = handle.read(MAX_ENTRY_BYTES + 1)
        except OSError as exc:
            log(f"cannot read {name}: {exc}")
    return found


def is_idle(raw: bytes) -> bool:
    """Whether the worker marked the entry unloaded (idle): a well-formed object with `"unloaded": true`. Anything
    else is treated as an entry to load, and refused there if it is not one."""
    try:
        entry = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return isinstance(entry, dict) and entry.get("unloaded") is True


def parse_entry(key: str, raw: bytes, max_file_bytes: int, max_revision_bytes: int) -> dict[str, Any]:
    """The entry, checked: Refused naming what is wrong."""
    if len(raw) > MAX_ENTRY_BYTES:
        raise Refused(f"its entry is over {MAX_ENTRY_BYTES} bytes")
    try:
        entry = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refused(f"its entry is not JSON: {exc}") from None
    if not isinstance(entry, dict) or entry.get("format") != 1 or entry.get("revision") != key:
        raise Refused("its entry is not a pool load of this revision (format 1)")
    models = entry.get("models")
    if not isinstance(models, list) or not models:
        raise Refused("its entry names no models")
    for model in models:
        if not isinstance(model, str) or not MODEL_NAME_RE.fullmatch(model) or not model.startswith(key + "-"):
            raise Refused(f"model name {model!r} is not one of this revision's ({key}-...)")
    files = entry.get("files")
    if not isinstance(files, list) or not files:
        raise Refused("its entry lists no files")
    total = 0
    seen = set()
    for item in files:
        if not isinstance(item, dict):
            raise Refused("its entry lists a file that is not an object")
        path = _own_path(item.get("path"), key)
        size = item.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise Refused(f"{path}: invalid size {size!r}")
        if size > max_file_bytes:
            raise Refused(f"{path} is {size} bytes, over the pool's {max_file_bytes} per file")
        digest, url = item.get("sha256"), item.get("url")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise Refused(f"{path}: invalid sha256 {digest!r}")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise Refused(f"{path}: no http(s) URL")
        if path in seen:
            raise Refused(f"{path} is listed twice")
        seen.add(path)
        total += size
    if total > max_revision_bytes:
        raise Refused(f"its files take {total} bytes, over the pool's {max_revision_bytes} per revision")
    directories = entry.get("directories", [])
    if not isinstance(directories, list):
        raise Refused("its directories are not a list")
    for directory in directories:
        _own_path(directory, key)
    limits = entry.get("memory_limits", {})
    if not isinstance(limits, dict):
        raise Refused("its memory limits are not an object")
    for model, limit in limits.items():
        if model not in models:
            raise Refused(f"it gives a memory limit for {model!r}, which is not one of its models")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 0 < limit <= max_revision_bytes:
            raise Refused(f"the memory limit of {model!r} is not a number of bytes within the pool's "
                          f"{max_revision_bytes}")
    return entry


def _own_path(value: Any, key: str) -> str:
    """A path inside the repository, under one of the revision's own model directories (`<key>-<model>/...`): an
    entry never writes over another revision's files, nor anywhere outside the repository."""
    try:
        path = fetch._relative(value, "path")
    except fetch.FetchError as exc:
        raise Refused(str(exc)) from None
    if not PurePosixPath(path).parts[0].startswith(key + "-"):
        raise Refused(f"{path!r} is outside this revision's model directories ({key}-...)")
    return path


# --- Triton's repository API on localhost -------------------------------------------------------------------------


class Triton:
    def __init__(self, url: str, admin_key: str, timeout: float = TRITON_TIMEOUT_SECONDS) -> None:
        self.url = url.rstrip("/")
        self.admin_key = admin_key
        self.timeout = timeout
        # Triton is on localhost: never through a proxy the environment names (http_proxy would otherwise take
        # 127.0.0.1 too, and the admin key with it). The presigned URL downloads (fetch_repository) keep the
        # environment's proxy: the S3 endpoint may be reachable only through one.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _post(self, path: str, timeout: float | None = None) -> bytes:
        headers = {"Content-Type": "application/json"}
        if self.admin_key:
            headers[ADMIN_HEADER] = self.admin_key
        request = urllib.request.Request(f"{self.url}{path}", data=b"{}", method="POST", headers=headers)
        with self._opener.open(request, timeout=timeout or self.timeout) as response:
            return bytes(response.read(16 * 1024 * 1024))

    def action(self, name: str, action: str) -> str | None:
        """Load or unload `name`: None when done, else Triton's error (bounded)."""
        try:
            self._post(f"/v2/repository/models/{name}/{action}")
            return None
        except urllib.error.HTTPError as exc:
            body = exc.read(64 * 1024) if exc.fp is not None else b""
            try:
                return str(json.loads(body or b"{}").get("error") or exc.reason)[:MAX_MESSAGE]
            except ValueError:
                return str(exc.reason)[:MAX_MESSAGE]
        except OSError as exc:
            return f"Triton did not answer: {exc}"[:MAX_MESSAGE]

    def model_stats(self) -> dict[str, tuple[int, int | None]]:
        """(last inference in ms since the epoch, the memory Triton's statistics report or None) per model name;
        {} when Triton does not answer. The statistics are not a restricted API: no admin key is sent."""
        request = urllib.request.Request(f"{self.url}/v2/models/stats", method="GET")
        try:
            with self._opener.open(request, timeout=10) as response:
                data = json.loads(response.read(16 * 1024 * 1024))
        except (OSError, ValueError):
            return {}
        found: dict[str, tuple[int, int | None]] = {}
        rows = data.get("model_stats") if isinstance(data, dict) else None
        for row in rows if isinstance(rows, list) else []:
            if not isinstance(row, dict):
                continue
            name, last = str(row.get("name", "")), row.get("last_inference")
            last_ms = last if isinstance(last, int) and not isinstance(last, bool) and last > 0 else 0
            usage = row.get("memory_usage")
            sizes = [u.get("byte_size") for u in usage if isinstance(u, dict)] if isinstance(usage, list) else []
            memory = sum(int(b) for b in sizes if isinstance(b, int) and not isinstance(b, bool) and b >= 0)
            previous = found.get(name, (0, None))
            found[name] = (max(previous[0], last_ms), (memory or None) if sizes else previous[1])
        return found

    def ready_models(self) -> list[str] | None:
        """The names of the models Triton has READY (None when it does not answer)."""
        try:
            index = json.loads(self._post("/v2/repository/index", timeout=10))
        except (OSError, ValueError):
            return None
        return [str(m.get("name")) for m in index if isinstance(m, dict) and m.get("state") == "READY"]


# --- Converging ---------------------------------------------------------------------------------------------------


class Agent:
    def __init__(self, desired: Path, repository: Path, triton: Triton, *, max_file_bytes: int,
                 max_revision_bytes: int, limits_dir: Path | None = None, usage_dir: Path | None = None) -> None:
        self.desired = desired
        self.limits_dir = limits_dir
        self.usage_dir = usage_dir
        self.repository = repository
        self.triton = triton
        self.max_file_bytes = max_file_bytes
        self.max_revision_bytes = max_revision_bytes
        self.loaded: dict[str, list[str]] = {}  # revision -> its models, as loaded
        self.failed: dict[str, str] = {}
        self._failed_entry: dict[str, str] = {}  # the sha256 of the entry that failed: retried once it changes
        self.triton_down = False  # Triton did not answer at the last pass (reported once, not at every pass)
        self.last_used: dict[str, int] = {}  # revision -> its models' last inference (ms since the epoch)
        self.reported_use: dict[str, int] = {}  # what the last status line said of it
        self.memory: dict[str, dict[str, int]] = {}  # revision -> {model (its own name): bytes}, its peak
        self.reported_memory: dict[str, dict[str, int]] = {}  # what the last status line said of it

    def adopt(self) -> None:
        """After a restart of this container: the revisions whose models Triton still has ready are loaded."""
        ready = set(self.triton.ready_models() or [])
        for key, raw in read_desired(self.desired).items():
            try:
                entry = parse_entry(key, raw, self.max_file_bytes, self.max_revision_bytes)
            except Refused:
                continue
            if all(name in ready for name in entry["models"]):
                self.loaded[key] = list(entry["models"])

    def converge(self) -> bool:
        """One pass; whether anything changed. Triton's own state is read first: if its container restarted (OOM,
        liveness) it came back with nothing loaded, and each revision whose models are not all ready is loaded
        again in this pass. While Triton does not answer, nothing is reported loaded."""
        desired = {key: raw for key, raw in read_desired(self.desired).items() if not is_idle(raw)}
        changed = False
        ready = self.triton.ready_models()
        if ready is None:
            if not (self.loaded or not self.triton_down):
                return False
            log("Triton does not answer: nothing is reported loaded until it does")
            for key in set(self.loaded) - set(desired):
                self._remove_files(key)
            self.loaded.clear()
            self.triton_down = True
            self.report()
            return True
        self.triton_down = False
        for key in sorted(self.loaded):
            missing = [name for name in self.loaded[key] if name not in ready]
            if missing:
                log(f"{key}: Triton no longer has {', '.join(missing)} ready: loading it again")
                del self.loaded[key]
                changed = True
        for key in sorted(set(self.loaded) - set(desired)):
            self._unload(key)
            changed = True
        for key in sorted(set(self.failed) - set(desired)):
            del self.failed[key]
            self._failed_entry.pop(key, None)
            changed = True
        for key, raw in sorted(desired.items()):
            if key in self.loaded:
                continue
            digest = hashlib.sha256(raw).hexdigest()
            if self._failed_entry.get(key) == digest:
                continue  # the same entry failed before: wait for the worker to change it (renewed URLs, say)
            changed = True
            try:
                entry = parse_entry(key, raw, self.max_file_bytes, self.max_revision_bytes)
                self._load(key, entry)
            except Refused as exc:
                self._remove_files(key)
                self.failed[key] = str(exc)[:MAX_MESSAGE]
                self._failed_entry[key] = digest
                log(f"{key}: refused: {exc}")
                continue
            self.failed.pop(key, None)
            self._failed_entry.pop(key, None)
        grew = self._note_memory()
        if self._note_use() or grew or changed:
            self.report()
            changed = True
        return changed

    def _note_memory(self) -> bool:
        """Read again the peaks the loaded models' processes report; whether one grew by MEMORY_REPORT_FRACTION
        since the last status line (the worker keeps the most seen: a model's reservation follows its use)."""
        grew = False
        for key, names in self.loaded.items():
            for name in names:
                figure = self.usage_bytes(name)
                if figure is None:
                    continue
                model = name[len(key) + 1:]
                figures = self.memory.setdefault(key, {})
                figures[model] = max(figures.get(model, 0), figure)
                said = self.reported_memory.get(key, {}).get(model, 0)
                if figures[model] > said * (1 + MEMORY_REPORT_FRACTION):
                    grew = True
        return grew

    def usage_bytes(self, name: str) -> int | None:
        """The peak resident memory model `name`'s processes report (the sum of its instances'), None when none
        does (a model that runs in Triton's own process, or no usage directory). What a model's process writes is
        read bounded: at most MAX_USAGE_FILES files of USAGE_FILE_BYTES, each a non-negative integer."""
        if self.usage_dir is None:
            return None
        folder = self.usage_dir / name
        try:
            paths = sorted(p for p in folder.iterdir() if not p.name.startswith("."))[:MAX_USAGE_FILES]
        except OSError:
            return None
        total, found = 0, False
        for path in paths:
            try:
                with path.open("rb") as handle:
                    text = handle.read(USAGE_FILE_BYTES + 1)
                value = int(text.decode("ascii")) if len(text) <= USAGE_FILE_BYTES else -1
            except (OSError, UnicodeDecodeError, ValueError):
                continue
            if value >= 0:
                total, found = total + value, True
        return total if found else None

    def _check_limits(self, key: str, entry: dict[str, Any]) -> None:
        """Refuse, before Triton is asked, a model that runs in processes of its own (the python backend) and that
        its entry gives no limit (an entry written before limits were): the wrapper would refuse to start its
        process, and Triton wait for the dead stub until the load times out, holding this agent's every other load."""
        if self.limits_dir is None:
            return
        for name in entry["models"]:
            if name in entry.get("memory_limits", {}):
                continue
            try:
                with (self.repository / name / "config.pbtxt").open("rb") as handle:
                    config = handle.read(MAX_ENTRY_BYTES).decode("utf-8", "replace")
            except OSError:
                continue  # no config of its own (Triton refuses it anyway)
            if PYTHON_BACKEND_RE.search(config):
                raise Refused(f"model {name[len(key) + 1:]!r} runs in processes of its own and its entry gives it no "
                              "memory limit: the worker writes one at the revision's next change (a rollout, or its "
                              "URLs' renewal)")

    def _write_limits(self, key: str, entry: dict[str, Any]) -> None:
        """Each model's memory limit where the stub wrapper reads it (replaced whole: a stub never reads half)."""
        if self.limits_dir is None:
            return
        try:
            self.limits_dir.mkdir(parents=True, exist_ok=True)
            for name, limit in entry.get("memory_limits", {}).items():
                tmp = self.limits_dir / f".{name}.tmp"
                tmp.write_text(f"{limit}\n")
                os.replace(tmp, self.limits_dir / name)
        except OSError as exc:
            raise Refused(f"its memory limits cannot be written: {exc}") from None

    def _note_use(self) -> bool:
        """Read each loaded revision's last inference; whether one moved on by USAGE_REPORT_SECONDS since the last
        status line said (so that the worker sees use without a line per request)."""
        if not self.loaded:
            self.last_used.clear()
            return False
        stats = self.triton.model_stats()
        moved = False
        for key, names in self.loaded.items():
            last = max((stats.get(name, (0, None))[0] for name in names), default=0)
            self.last_used[key] = max(self.last_used.get(key, 0), last)
            if self.last_used[key] - self.reported_use.get(key, 0) >= USAGE_REPORT_SECONDS * 1000:
                moved = True
        for key in set(self.last_used) - set(self.loaded):
            del self.last_used[key]
        return moved

    def _load(self, key: str, entry: dict[str, Any]) -> None:
        self.repository.mkdir(parents=True, exist_ok=True)
        try:
            for item in entry["files"]:
                fetch.fetch_file(item, self.repository)
        except fetch.FetchError as exc:
            raise Refused(str(exc)) from None
        for directory in entry.get("directories", []):
            (self.repository / directory).mkdir(parents=True, exist_ok=True)
        self._write_limits(key, entry)
        self._check_limits(key, entry)
        done: list[str] = []
        self.memory.pop(key, None)
        for name in entry["models"]:
            error = self.triton.action(name, "load")
            if error is not None:
                for loaded in reversed(done):
                    self.triton.action(loaded, "unload")
                raise Refused(f"model {name[len(key) + 1:]!r} failed to load: "
                              f"{error.replace(key + '-', '')}")
            done.append(name)
        self.loaded[key] = done
        stats = self.triton.model_stats()
        measured = {}
        for name in done:
            # Its own processes' peak where it runs in processes of its own, else what Triton's statistics say.
            own = self.usage_bytes(name)
            size = own if own is not None else stats.get(name, (0, None))[1]
            if size:
                measured[name[len(key) + 1:]] = size
        if measured:
            self.memory[key] = measured
        log(f"{key}: loaded {len(done)} model(s), every sha256 verified")

    def _unload(self, key: str) -> None:
        self.memory.pop(key, None)
        for name in reversed(self.loaded.pop(key)):
            error = self.triton.action(name, "unload")
            if error is not None:
                log(f"{key}: unload of {name} failed: {error}")
        self._remove_files(key)
        log(f"{key}: unloaded")

    def _remove_files(self, key: str) -> None:
        if self.limits_dir is not None and self.limits_dir.is_dir():
            for path in self.limits_dir.iterdir():
                if path.name.startswith(key + "-"):
                    path.unlink(missing_ok=True)
        if not self.repository.is_dir():
            return
        for path in self.repository.iterdir():
            if path.name.startswith(key + "-") and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif path.name.startswith(key + "-"):
                path.unlink()

    def status(self) -> dict[str, Any]:
        """What it loaded, what it refused and why, and the sha256 of each refused entry: the worker counts a
        refusal only against the entry it refused (an entry removed and added again, a quick retry, is not failed
        by the old refusal before the kubelet has synced the new one)."""
        return {"loaded": sorted(self.loaded), "failed": dict(sorted(self.failed.items())),
                "sha256": {key: self._failed_entry[key] for key in sorted(self.failed) if key in self._failed_entry},
                "last_used": {key: self.last_used[key] for key in sorted(self.loaded) if self.last_used.get(key)},
                "memory": {key: self.memory[key] for key in sorted(self.loaded) if key in self.memory}}

    def report(self) -> None:
        self.reported_use = dict(self.last_used)
        self.reported_memory = {key: dict(figures) for key, figures in self.memory.items()}
        print(STATUS_PREFIX + json.dumps(self.status(), sort_keys=True), flush=True)


def parse_status(log_text: str) -> dict[str, Any] | None:
    """The last status line of the agent's log (what the worker reads), or None."""
    for line in reversed(log_text.splitlines()):
        if line.startswith(STATUS_PREFIX):
            try:
                status = json.loads(line[len(STATUS_PREFIX):])
            except ValueError:
                return None
            if (isinstance(status, dict) and isinstance(status.get("loaded"), list)
                    and isinstance(status.get("failed"), dict)
                    and all(isinstance(status.get(field, {}), dict) for field in ("sha256", "last_used", "memory"))):
                return status
            return None
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Load and unload a pool's revisions as its loads Secret says.")
    parser.add_argument("--desired", type=Path, required=True, help="the mounted loads Secret")
    parser.add_argument("--repository", type=Path, required=True, help="Triton's model repository (an emptyDir)")
    parser.add_argument("--triton", default="http://127.0.0.1:8000")
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--max-file-bytes", type=int, default=8 * 1024**3)
    parser.add_argument("--max-revision-bytes", type=int, default=16 * 1024**3)
    parser.add_argument("--ready-file", type=Path, help=(
        "written once the first pass is done (every listed revision loaded or refused): the container's readiness "
        "probe, so that a new pod takes requests only once it has what the others serve"))
    parser.add_argument("--limits-dir", type=Path, help=(
        "where each model's memory limit is written for the stub wrapper of Triton's container (pool_stub.py)"))
    parser.add_argument("--usage-dir", type=Path, help="where the models' processes report their peak memory")
    parser.add_argument("--once", action="store_true", help="one pass, then exit (tests)")
    args = parser.parse_args(argv)
    agent = Agent(args.desired, args.repository, Triton(args.triton, os.environ.get(ADMIN_KEY_ENV, "")),
                  max_file_bytes=args.max_file_bytes, max_revision_bytes=args.max_revision_bytes,
                  limits_dir=args.limits_dir, usage_dir=args.usage_dir)
    if args.once:
        agent.converge()
        agent.report()
        if args.ready_file is not None:
            args.ready_file.write_text("ready\n")
        return 1 if agent.failed else 0
    while agent.triton.ready_models() is None:  # Triton is starting
        time.sleep(args.interval)
    agent.adopt()
    agent.report()
    agent.converge()
    if args.ready_file is not None:
        # Once, never removed: a later load (another deployment's rollout) must not take the pod out of service.
        args.ready_file.write_text("ready\n")
    while True:
        time.sleep(args.interval)
        agent.converge()


if __name__ == "__main__":
    sys.exit(main())
