"""System checks of the settings: settings that contradict each other, or values the settings module stores as
read (quantities, egress rules) that only a domain module can validate.

They run with `manage.py check` and before `migrate` (which `make run`, docker-compose's migrate service and the
Kubernetes init container run before every start), so an error stops a deployment before it serves; each message
has an id (modelport.E1xx errors, W1xx warnings) and a hint saying what to change. A value that cannot be parsed at
all (a bool that is not one, a URL of the wrong scheme) still fails when the settings are imported (infra/env.py).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured

from infra.var_dir import SECRET_KEY_HINT

_LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1", "testserver"}


def _secret_key() -> str:
    try:
        return str(settings.SECRET_KEY)
    except ImproperlyConfigured:  # Django refuses to hand out an empty key
        return ""


@register(Tags.security)
def secret_key(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    key = _secret_key()
    if not key:
        where = "MODELPORT_ENV=production" if settings.PRODUCTION else f"{settings.VAR_DIR}/secret_key is missing"
        return [Error(f"SECRET_KEY is not set ({where}).", hint=SECRET_KEY_HINT, id="modelport.E100")]
    if settings.PRODUCTION and (len(key) < 50 or len(set(key)) < 5 or key.startswith("django-insecure")):
        return [Error("SECRET_KEY is too weak for production.",
                      hint="Use at least 50 random characters, e.g. "
                           "`python -c 'import secrets; print(secrets.token_urlsafe(64))'`.", id="modelport.E101")]
    return []


@register(Tags.security)
def allowed_hosts(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    hosts = list(settings.ALLOWED_HOSTS)
    if settings.PRODUCTION and not hosts:
        return [Error("ALLOWED_HOSTS is empty in production: the portal would answer 400 to every request.",
                      hint="Set ALLOWED_HOSTS to the portal's host names, comma-separated.", id="modelport.E102")]
    public = [host for host in hosts if host not in _LOCAL_HOSTS]
    if settings.DEBUG and public:
        return [Warning(f"DEBUG is on while ALLOWED_HOSTS lets others reach the portal ({', '.join(public)}): "
                        "Django's debug page shows tracebacks, settings and requests to whoever triggers an error.",
                        hint="Unset DEBUG, or keep ALLOWED_HOSTS to this machine's loopback names.",
                        id="modelport.W103")]
    return []


@register()
def s3_storage(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if (settings.S3_ACCESS_KEY_ID or settings.S3_ENDPOINT_URL) and not settings.S3_BUCKET:
        return [Error("S3 credentials or S3_ENDPOINT_URL are set but S3_BUCKET is not: artifacts would silently go "
                      "to the local disk.", hint="Set S3_BUCKET, or unset the S3_* settings to store artifacts "
                      "under ARTIFACT_ROOT.", id="modelport.E104")]
    return []


@register()
def sandbox_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    from modelport.core.sandbox import memory_bytes, scratch_bytes

    messages: list[CheckMessage] = []
    if settings.SANDBOX_REQUIRED and not settings.SANDBOX_ENABLED:
        messages.append(Error("SANDBOX_ENABLED=false contradicts SANDBOX_REQUIRED=true (the default in production).",
                              hint="Set SANDBOX_REQUIRED=false to run python models unconfined, or unset "
                                   "SANDBOX_ENABLED.", id="modelport.E105"))
    for name in ("SANDBOX_SHM_SIZE", "SANDBOX_DEFAULT_MEMORY", "SANDBOX_SERVER_MEMORY"):
        value = getattr(settings, name)
        if not value:
            continue
        try:
            memory_bytes(value)
        except ValueError as exc:
            messages.append(Error(f"{name}: {exc}", hint="Write a memory quantity such as 512Mi or 4Gi.",
                                  id="modelport.E106"))
    try:
        scratch_bytes(settings.SANDBOX_SCRATCH_SIZE)
    except ValueError as exc:
        messages.append(Error(f"SANDBOX_SCRATCH_SIZE: {exc}", hint="Write a size such as 256Mi or 1Gi.",
                              id="modelport.E106"))
    for port in settings.SANDBOX_EGRESS_PORTS:
        if not port.isdigit() or not 0 < int(port) < 65536:
            messages.append(Error(f"SANDBOX_EGRESS_PORTS must list TCP ports (1-65535), got {port!r}.",
                                  hint="A comma-separated list of port numbers, e.g. 53,80,443.", id="modelport.E107"))
    return messages


@register()
def kubernetes_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The Kubernetes runtime's settings, checked by the runtime (deployments/runtimes/kubernetes/checks.py)."""
    from deployments.runtimes.registry import settings_checks

    return settings_checks()


@register()
def limits(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Limits that contradict each other: each is valid on its own (infra/env.py bounds it), not together."""
    messages: list[CheckMessage] = []
    if settings.MAX_REQUEST_BODY_BYTES < settings.MAX_MULTIPART_UPLOAD_SIZE:
        messages.append(Warning(
            f"MAX_REQUEST_BODY_BYTES ({settings.MAX_REQUEST_BODY_BYTES}) is below MAX_MULTIPART_UPLOAD_SIZE "
            f"({settings.MAX_MULTIPART_UPLOAD_SIZE}): a multipart upload within its limit is refused with 413.",
            hint="Raise MAX_REQUEST_BODY_BYTES above MAX_MULTIPART_UPLOAD_SIZE (its default adds 1 MiB) or unset it.",
            id="modelport.W120"))
    if settings.MAX_MULTIPART_UPLOAD_SIZE > settings.MAX_UPLOAD_SIZE:
        messages.append(Warning(
            f"MAX_MULTIPART_UPLOAD_SIZE ({settings.MAX_MULTIPART_UPLOAD_SIZE}) is above MAX_UPLOAD_SIZE "
            f"({settings.MAX_UPLOAD_SIZE}), the limit of any artifact: the smaller one applies.",
            hint="Lower MAX_MULTIPART_UPLOAD_SIZE to at most MAX_UPLOAD_SIZE.", id="modelport.W121"))
    rate, burst = settings.GATEWAY_RATE_LIMIT_PER_SECOND, settings.GATEWAY_RATE_LIMIT_BURST
    if rate and burst < rate:
        messages.append(Warning(
            f"GATEWAY_RATE_LIMIT_BURST ({settings.GATEWAY_RATE_LIMIT_BURST}) is below GATEWAY_RATE_LIMIT_PER_SECOND "
            f"({settings.GATEWAY_RATE_LIMIT_PER_SECOND:g}): a token can never use its rate within one second.",
            hint="Set GATEWAY_RATE_LIMIT_BURST to at least the rate per second.", id="modelport.W122"))
    if settings.ROLLOUT_DRAIN_SECONDS <= settings.GATEWAY_CACHE_TTL_SECONDS:
        messages.append(Warning(
            f"ROLLOUT_DRAIN_SECONDS ({settings.ROLLOUT_DRAIN_SECONDS:g}) is not above GATEWAY_CACHE_TTL_SECONDS "
            f"({settings.GATEWAY_CACHE_TTL_SECONDS:g}): a gateway may still route to a server a rollout has stopped.",
            hint="Keep ROLLOUT_DRAIN_SECONDS longer than GATEWAY_CACHE_TTL_SECONDS.", id="modelport.W123"))
    if settings.GATEWAY_GRPC_PORT > 65535:
        messages.append(Error(f"GATEWAY_GRPC_PORT is {settings.GATEWAY_GRPC_PORT}, not a TCP port.",
                              hint="Use a port between 1 and 65535, or 0 to turn the gRPC gateway off.",
                              id="modelport.E124"))
    return messages
