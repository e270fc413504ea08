"""The Kubernetes runtime's start-up checks of its settings (Django system checks, registered by portal/checks.py
through the runtime registry): quantities and egress rules go into every Triton pod, so a typo is reported at start,
not in each rollout."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning

from deployments.runtimes.kubernetes.config import KubernetesConfig, parse_egress
from modelport.core.quantity import CPU, MEMORY, QuantityError, check_quantity

MAX_PRESIGNED_URL_SECONDS = 7 * 24 * 3600  # S3's limit for presigned URLs


def kubernetes_settings() -> list[CheckMessage]:
    """Quantities and egress rules go into every Triton pod: a typo is reported here, not in each rollout. With a
    cluster configured, what its rollouts would lack (S3 for the repositories, egress to reach it) is a warning."""
    messages: list[CheckMessage] = []
    for name, bounds in (("KUBERNETES_DEFAULT_CPU", CPU), ("KUBERNETES_DEFAULT_MEMORY", MEMORY),
                         ("KUBERNETES_SHM_SIZE", MEMORY), ("KUBERNETES_TMP_SIZE", MEMORY)):
        try:
            check_quantity(getattr(settings, name), bounds)
        except QuantityError as exc:
            messages.append(Error(f"{name}: {exc}", hint="Write a Kubernetes quantity (CPU: 500m, 2; memory: 4Gi).",
                                  id="modelport.E110"))
    bad_egress = False
    for entry in settings.KUBERNETES_TRITON_EGRESS:
        try:
            parse_egress(entry)
        except ValueError as exc:
            bad_egress = True
            messages.append(Error(f"KUBERNETES_TRITON_EGRESS: {exc}", hint="See docs/kubernetes.md, Egress.",
                                  id="modelport.E111"))
    if settings.KUBERNETES_TRACE_EGRESS:
        try:
            parse_egress(settings.KUBERNETES_TRACE_EGRESS)
        except ValueError as exc:
            bad_egress = True
            messages.append(Error(f"KUBERNETES_TRACE_EGRESS: {exc}", hint="See docs/observability.md, Kubernetes.",
                                  id="modelport.E114"))
    if settings.KUBERNETES_REPOSITORY_URL_SECONDS > MAX_PRESIGNED_URL_SECONDS:
        messages.append(Error(f"KUBERNETES_REPOSITORY_URL_SECONDS is {settings.KUBERNETES_REPOSITORY_URL_SECONDS}, "
                              "above S3's limit for presigned URLs (604800, 7 days).",
                              hint="Set it to at most 604800.", id="modelport.E112"))
    if messages or bad_egress:
        return messages
    config = KubernetesConfig.from_settings(settings)
    if config.cluster_configured:
        for problem in (config.s3_problem(), config.egress_problem()):
            if problem:
                messages.append(Warning(f"A Kubernetes cluster is configured but its rollouts would fail: {problem}",
                                        id="modelport.W113"))
        problem = config.trace_problem()
        if problem:
            messages.append(Warning(f"Triton's pods will not be traced: {problem}", id="modelport.W115"))
        if config.autoscaling == "keda" and not config.keda_prometheus_url:
            messages.append(Warning(
                "KUBERNETES_AUTOSCALING is keda but KUBERNETES_KEDA_PROMETHEUS_URL is empty: every deployment with "
                "autoscaling is refused when it is planned.",
                hint="Set it to the Prometheus that records the queue-to-compute ratio (docs/kubernetes.md, "
                     "Autoscaling).", id="modelport.W116"))
    return messages
