"""Every shell command of the README and docs/ runs as written against a live portal, so that none drifts again
(docs/pipelines.md's curl answered 404 for months: it lacked create_model=true).

The blocks are the fenced ```sh, ```bash and ```console blocks of README.md and docs/*.md. Each block runs in bash
(-e, -u, pipefail) from the checkout against a portal that bin/run-portal (what `make run` starts) serves from a
temporary MODELPORT_VAR_DIR on free ports, in document order, file by file. The docs name the portal and the
token the way a reader sets them, `export MODELPORT_URL=... MODELPORT_TOKEN=...`: the test supplies both and leaves
such lines out. Each file's token is of a team of that file's own, as each page is read on its own: the README's
`digits-hf` import and docs/importing-hf.md's, or docs/importing-mlflow.md's `digits` and docs/pipelines.md's, would
otherwise be one model's versions 1 and 2 where each page says 1.

The portal is started as the import pages' operator starts it: MLFLOW_TRACKING_URI names a real `mlflow server`
(SQLite store, artifacts served through it) that the test starts, with the README's `fraud@champion` registered,
and HF_ENDPOINT a local hub-compatible endpoint (tests/support/hf_hub_server.py) serving `acme/digits-onnx`, since
the tests do not reach huggingface.co. A doc's `export MLFLOW_TRACKING_URI=...` is supplied the same way.

A block that cannot run here is listed in NOT_RUN with the reason; a block neither runnable nor listed fails the
test, and so does a listed one that is gone. Every fenced block must name its language, so that a shell block cannot
hide as plain text."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.processes import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"sh", "bash", "console"}
# What the docs' `export` lines may set: the test gives each its own value.
SUPPLIED = {"MODELPORT_URL", "MODELPORT_TOKEN", "MLFLOW_TRACKING_URI"}

# (file, the block's first line) -> why it does not run here.
NOT_RUN: dict[tuple[str, str], str] = {
    ("docs/benchmarks.md", ".venv/bin/python bench/tracing.py --duration 4 --repeats 4    # about 2 minutes; "
                           "bench/results/tracing.json"):
        "a benchmark of minutes that writes bench/results/",
    ("docs/benchmarks.md", ".venv/bin/python bench/streaming.py --duration 8 --warmup 2    # about 3 minutes; "
                           "bench/results/streaming.json"):
        "a benchmark of minutes that writes bench/results/",
    ("README.md", "make run     # the portal on http://127.0.0.1:8000 with embedded defaults; prints how to sign in"):
        "starts the portal in the foreground (the test starts the same bin/run-portal), and runs the whole suite",
    ("README.md", "modelport tune digits-prod --p99-ms 20 --budget 10m --apply              # or --apply --canary "
                  "10: try it on 10% first"):
        "measures temporary Tritons for up to 10 minutes; tests/test_tune_e2e.py runs a tune end to end",
    ("docs/benchmarks.md", '/usr/bin/time -v make test-fast    # "User time" + "System time"; the -m expression is '
                           "in the Makefile"):
        "runs the fast suite: minutes of CPU",
    ("docs/benchmarks.md", ".venv/bin/python bench/upload_bench.py                                  # 2 GiB; "
                           "chunked, single, checksum; both paths; 3 runs each"):
        "a benchmark: minutes of uploads of 2 GiB",
    ("docs/benchmarks.md", "make bench                                     # ~45 min: creates var/bench-env and "
                           "var/peers/*, runs everything"):
        "a benchmark of about 45 minutes with environments of its own",
    ("docs/benchmarks.md", "make bench RUNTIME_EXTRAS=torch,tensorflow BENCH_ARGS=--quick     # the smoke test (all "
                           "workloads), formats included"):
        "a benchmark (minutes) with the framework extras",
    ("docs/benchmarks.md", 'make bench RUNTIME_EXTRAS=torch,tensorflow BENCH_ARGS="--quick --output '
                           'bench/results/serving-quick-20261201.json --no-plots"'):
        "the same smoke test, writing its results file: minutes, with the framework extras",
    ("docs/benchmarks.md", "SANDBOX_ENABLED=false .venv/bin/python -m bench.serving.run --quick --workloads 1,2 "
                           "--servers d-direct,e-gateway,e-direct \\"):
        "a benchmark that writes bench/results/",
    ("docs/benchmarks.md", ".venv/bin/python bench/sandbox_overhead.py --rounds 5 --duration 4 --concurrency 1 8"):
        "a benchmark of minutes",
    ("docs/benchmarks.md", "make bench                                          # everything: the section above, "
                           "and the peers on workloads 2, 3"):
        "a benchmark of about 45 minutes with the peers' environments",
    ("docs/benchmarks.md", ".venv/bin/python bench/gateway_overhead.py            # about 16 minutes (HTTP and "
                           "gRPC); --quick for a smoke test"):
        "a benchmark of about 16 minutes",
    ("docs/benchmarks.md", ".venv/bin/python bench/shared_pool.py --models 30 --dedicated 30 --hot 5 --duration 10"):
        "a benchmark of minutes that starts thirty Tritons",
    ("docs/benchmarks.md",
     ".venv/bin/python -m bench.serving.run --peers-only --quick --workloads 2 --no-plots   # 209 s here"):
        "a benchmark of minutes with the peers' environments (make bench creates them)",
    ("docs/benchmarks.md",
     ".venv/bin/python -m bench.serving.run --peers-only --workloads 2 --no-plots   # 485 s here"):
        "a benchmark of minutes with the peers' environments (make bench creates them)",
    ("docs/benchmarks.md", ".venv/bin/python bench/shared_pool.py --models 10 --dedicated 10 --hot 3 --duration 8 "
                           "--output OUT.json"):
        "a benchmark of minutes, the serving one with the bench env (make bench creates it), run before and after",
    ("docs/benchmarks.md", ".venv/bin/python -m bench.serving.run --quick --no-plots --output OUT.json    # in each "
                           "tree, one after the other"):
        "the whole serving smoke benchmark, ten minutes with the peers' and bench environments, run before and after",
    ("docs/benchmarks.md", ".venv/bin/python bench/json_path.py --nested        # ~20 s"):
        "a benchmark: its figures are CPU times of this machine, not a result to check",
    ("docs/benchmarks.md", ".venv/bin/python bench/json_path.py          # ~20 s: the CNN request through the old "
                           "check, the new, the new + transcode"):
        "a benchmark: its figures are CPU times of this machine, not a result to check",
    ("docs/benchmarks.md", ".venv/bin/python bench/gateway_options.py --grpc --repeats 4 --duration 4 --warmup 1   "
                           "# ~7 min here; --quick: 3 s runs, 2 repeats"):
        "a benchmark of minutes that starts granian and nginx beside the portal (tests/test_bench_gateway_options.py "
        "checks its summary and its nginx configuration)",
    ("docs/benchmarks.md", ".venv/bin/python bench/gateway_json.py --clients 32 --repeat 4 --duration 4 --binary   "
                           "# ~2 min here"):
        "a benchmark of minutes: its figures are CPU times of this machine, not a result to check",
    ("docs/benchmarks.md", ".venv/bin/python bench/gateway_json.py --clients 16 32 --repeat 5 --baseline main   "
                           "# ~2 min"):
        "a benchmark of minutes: its figures are CPU times of this machine, not a result to check",
    ("docs/benchmarks.md", ".venv/bin/python bench/gateway_options.py --fronts uvicorn --baseline main --repeats 3 "
                           "--duration 4 --warmup 1   # ~4 min"):
        "a benchmark of minutes with a real Triton: its figures are CPU times of this machine, not a result to check",
    ("docs/importing-mlflow.md", ".venv/bin/mlflow server --host 127.0.0.1 --port 5000 --backend-store-uri "
                                 "sqlite:///var/mlflow/store.sqlite \\"):
        "starts an MLflow tracking server and the portal in the foreground, on fixed ports: the test starts both as "
        "it says (a real mlflow server with a SQLite store and served artifacts; the portal with MLFLOW_TRACKING_URI "
        "and IMPORT_MLFLOW_MODELS) on free ports, and runs the walkthrough's other blocks against them",
    ("docs/kubernetes.md", "docker build -f platform/docker/Dockerfile -t registry.example.com/modelport:0.1.0 . && "
                           "docker push ..."):
        "needs Docker, a registry and a Kubernetes cluster (kubectl); none runs here",
    ("docs/kubernetes.md", "MODELPORT_URL=https://modelport.example.com MODELPORT_TOKEN=mp_... "
                           "KUBECONFIG=~/.kube/config make e2e-k8s"):
        "needs a real Kubernetes cluster with Modelport installed",
}
# Run after every other block, since it ends the portal: `make stop` must stop what bin/run-portal started.
RUN_LAST = {("README.md", "make stop          # the web server, the gRPC gateway, the worker and beat; it says what "
                          "keeps running")}

FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[^\s`]*)[ \t]*$")


@dataclass(frozen=True)
class Block:
    file: str  # relative to the checkout
    line: int  # of the opening fence, 1-based
    lang: str
    text: str

    @property
    def key(self) -> tuple[str, str]:
        return self.file, self.text.splitlines()[0] if self.text else ""


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, indented ones (in a list item) with their indent removed."""
    found: list[Block] = []
    opening: tuple[int, str, str] | None = None
    body: list[str] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = FENCE.match(line)
        if opening is None:
            if match:
                opening, body = (number, match["lang"], match["indent"]), []
        elif match and not match["lang"]:
            indent = opening[2]
            text = "\n".join(b[len(indent):] if b.startswith(indent) else b for b in body)
            found.append(Block(str(path.relative_to(ROOT)), opening[0], opening[1], text))
            opening = None
        else:
            body.append(line)
    assert opening is None, f"{path.name}:{opening[0]}: a fenced block that never closes"
    return found


def shell_blocks() -> list[Block]:
    return [b for path in DOCS for b in blocks(path) if b.lang in SHELL]


def runnable(block: Block) -> str:
    """The block as the test runs it: the `export` lines that set what the test supplies left out."""
    kept = []
    for line in block.text.splitlines():
        assigned = re.match(r"^export\s+(.*)$", line)
        if assigned:
            names = set(re.findall(r"(\w+)=", assigned[1]))
            assert names <= SUPPLIED, (f"{block.file}:{block.line}: exports {sorted(names - SUPPLIED)}; the test "
                                       f"supplies only {sorted(SUPPLIED)}")
            continue
        kept.append(line)
    return "\n".join(kept)


# --- without a portal -----------------------------------------------------------------------------------------


def test_every_fenced_block_names_its_language() -> None:
    unnamed = [f"{b.file}:{b.line}" for path in DOCS for b in blocks(path) if not b.lang]
    assert not unnamed, f"fenced blocks without a language (sh, text, json, ...): {unnamed}"


def test_every_shell_block_runs_or_says_why_not() -> None:
    keys = {b.key for b in shell_blocks()}
    assert set(NOT_RUN) <= keys, f"listed in NOT_RUN but gone from the docs: {sorted(set(NOT_RUN) - keys)}"
    assert RUN_LAST <= keys, f"RUN_LAST but gone from the docs: {sorted(RUN_LAST - keys)}"
    for block in shell_blocks():
        if block.key not in NOT_RUN:
            runnable(block)  # its exports are the supplied ones
    assert len(keys) == len(shell_blocks()), "two shell blocks of one file start with the same line"


# --- against a live portal ------------------------------------------------------------------------------------


def team_of(file: str) -> str:
    """The team a file's blocks run in: README.md -> docs-readme, docs/importing-hf.md -> docs-importing-hf."""
    return "docs-" + re.sub(r"[^a-z0-9]+", "-", Path(file).stem.lower()).strip("-")


@pytest.mark.worker
def test_every_shell_command_of_the_docs_runs_against_a_live_portal(tmp_path: Path) -> None:
    from tests.running_portal import RunningPortal, run
    from tests.support import mlflow_server
    from tests.support.hf_hub_server import digits_repo, running_hub

    portal = RunningPortal(tmp_path / "var")
    with mlflow_server.running_mlflow_server(tmp_path / "mlflow") as tracking, \
            running_hub({"acme/digits-onnx": digits_repo()}) as hub:
        # What the README's "Deploy from MLflow" imports: a registered model `fraud` with an alias `champion`.
        mlflow_server.set_alias(tracking, "fraud", "champion", mlflow_server.log_onnx(tracking, "fraud"))
        # The operator's settings of docs/importing-mlflow.md's first block (and the README's `fraud`), and the
        # mirror docs/importing-hf.md names for an operator without huggingface.co.
        portal.env.update(MLFLOW_TRACKING_URI=tracking.url, IMPORT_MLFLOW_MODELS="digits-*,fraud",
                          HF_ENDPOINT=hub.url)
        try:
            portal.start()
            todo = [b for b in shell_blocks() if b.key not in NOT_RUN]
            tokens = {}
            for file in dict.fromkeys(b.file for b in todo):
                made = run(portal.env, sys.executable, "manage.py", "create_api_token", "--user", "docs", "--team",
                           team_of(file), "--create", "--name", "docs-test")
                assert made.returncode == 0, made.stderr
                tokens[file] = made.stdout.strip()
            ran = []
            for block in [b for b in todo if b.key not in RUN_LAST] + [b for b in todo if b.key in RUN_LAST]:
                env = {**portal.env, "MODELPORT_URL": portal.url, "MODELPORT_TOKEN": tokens[block.file]}
                done = subprocess.run(["bash", "-euo", "pipefail", "-c", runnable(block)], cwd=ROOT, env=env,
                                      capture_output=True, text=True, timeout=300)
                assert done.returncode == 0, (f"{block.file}:{block.line} failed ({done.returncode}):\n{block.text}\n"
                                              f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")
                ran.append((block, done.stdout))
            assert len(ran) >= 6, [b.key for b, _ in ran]
            outputs = {b.key: out for b, out in ran}

            def output_of(file: str, text: str) -> str:
                [out] = [out for b, out in ran if b.file == file and text in b.text]
                return out.replace(" ", "")

            # What they did, seen from the portal: the pipeline exists in the token's team, the models imported from
            # MLflow and the hub answered through the gateway, and `make stop` stopped it.
            pipeline = output_of("docs/pipelines.md", "/api/v1/models/digits-pipeline/versions/")
            assert '"format":"ensemble"' in pipeline and '"status":"ready"' in pipeline
            assert '"name":"label"' in output_of("docs/importing-mlflow.md", "/serve/digits-from-mlflow/")
            assert '"name":"label"' in output_of("docs/importing-hf.md", "/serve/digits-hf-prod/")
            assert '"kind":"mlflow"' in output_of("README.md", "models:/fraud@champion")
            assert any(item.path.startswith("/cdn/") for item in hub.received), "the hub served no model file"
            [stop] = [out for key, out in outputs.items() if key in RUN_LAST]
            assert "Modelport has stopped" in stop
            assert portal.process is not None
            portal.process.wait(timeout=60)
        finally:
            portal.kill()
