"""The test files `make test-fast` leaves out (marker `slow`; `make test` runs them): each one's tests took 70 ms
of CPU or more on average in the fast suite (measured 2026-12-03 with a getrusage plugin around each test, self and
children, on the 2-core machine at a load under 1; docs/benchmarks.md, "The fast test suite"). They drive several
layers at once (pages and the API through deployments and pipelines, a live portal for the CLI, lint-imports or
manage.py in child processes, property comparisons over thousands of generated bodies), where the unit tests of
those same modules stay in the fast suite. A file is listed whole, so that what is fast and what is not reads from
one place, and a new slow file is added here when it is measured."""

from __future__ import annotations

SLOW_FILES = (
    "accounts/tests/test_signin_lockout.py",
    "deployments/tests/test_api_canary.py",
    "deployments/tests/test_api_pipelines.py",
    "deployments/tests/test_canary.py",
    "deployments/tests/test_ceilings.py",
    "deployments/tests/test_idle_time_in_place.py",
    "deployments/tests/test_k8s_api.py",
    "deployments/tests/test_k8s_autoscaling.py",
    "deployments/tests/test_k8s_fetch.py",
    "deployments/tests/test_k8s_runtime.py",
    "deployments/tests/test_k8s_scale_from_zero.py",
    "deployments/tests/test_local_pyenvs.py",
    "deployments/tests/test_machine_memory.py",
    "deployments/tests/test_pool_events.py",
    "deployments/tests/test_reconcile_queue.py",
    "gateway/tests/test_body_costs.py",
    "gateway/tests/test_bodylimit.py",
    "gateway/tests/test_canary_split.py",
    "gateway/tests/test_grpc_decoupled.py",
    "gateway/tests/test_grpc_gateway.py",
    "gateway/tests/test_grpc_slow_reader.py",
    "gateway/tests/test_grpc_tracing.py",
    "gateway/tests/test_infer_body.py",
    "gateway/tests/test_json_fast_path_switch.py",
    "gateway/tests/test_not_found.py",
    "gateway/tests/test_pool_gateway.py",
    "gateway/tests/test_stream_slots_totals.py",
    "infra/tests/test_var_dir.py",
    "modelport_cli/tests/test_cli_portal.py",
    "modelport_cli/tests/test_cli_push_from_portal.py",
    "modelport_cli/tests/test_mlflow_plugin_cli.py",
    "models_registry/tests/test_import_huggingface.py",
    "models_registry/tests/test_mlflow_fetch.py",
    "models_registry/tests/test_pipeline_streaming_api.py",
    "models_registry/tests/test_pipelines.py",
    "models_registry/tests/test_samples.py",
    "models_registry/tests/test_tus_asgi.py",
    "models_registry/tests/test_upload_reservations.py",
    "performance/tests/test_api_pipeline.py",
    "portal/tests/test_portal_tracing.py",
    "tests/test_browser_import.py",
    "tests/test_layers.py",
    "tests/test_mlflow_deployments_e2e.py",
    "tests/test_mlflow_e2e.py",
    "tests/test_mlflow_frameworks_e2e.py",
    "tests/test_mlflow_import_e2e.py",
    "tests/test_nasty_inputs.py",
    "tests/test_observability_prometheus.py",
    "tests/test_observability_promtool.py",
    "tests/test_openai_e2e.py",
    "tests/test_performance_e2e.py",
    "tests/test_pipeline_stream_e2e.py",
    "tests/test_run_portal_ports.py",
    "tests/test_tracing_e2e.py",
    "tuning/tests/test_measure.py",
    "web/tests/test_admin.py",
    "web/tests/test_canary_page.py",
    "web/tests/test_deploy_form.py",
    "web/tests/test_pools_pages.py",
    "web/tests/test_samples.py",
    "web/tests/test_tune_panel.py",
)


def is_slow(nodeid: str) -> bool:
    """Whether the test `nodeid` (pytest's, relative to the checkout) is in a listed file."""
    return nodeid.split("::", 1)[0] in _LISTED


_LISTED = frozenset(SLOW_FILES)
