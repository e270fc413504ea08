"""Modelport settings.

With no environment at all the portal runs on embedded defaults (SQLite, artifacts and the Celery broker on the
filesystem under var/). Production switches each piece by environment variables; see docs/configuration.md. DEBUG
is off unless DEBUG=1 is set (for people developing Modelport): a traceback page must never reach a user.

Importing this module has no side effects: it creates no directory and writes no file (mypy, `manage.py help` and
every tool import it). `manage.py ensure_dirs` (run by `make run` and bin/run-portal) creates var/ and the development
secret key; the web server, the Celery worker and storage create what they need when they start or first write. A
value that cannot be parsed fails here (ImproperlyConfigured); settings that contradict each other are reported by
the system checks in portal/checks.py (`manage.py check`, and `migrate` before every start), with an id and a hint.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
import django_stubs_ext
from django.core.exceptions import ImproperlyConfigured

from infra.env import env_bool, env_float, env_int, env_list, env_secret, env_str
from infra.schedule import beat_schedule

# Django's generic classes take their type arguments at run time too (`admin.ModelAdmin[Pool]`), as django-stubs
# types them: the typed apps (mypy's strict overrides in pyproject.toml) subclass them with their model.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("MODELPORT_VAR_DIR", str(BASE_DIR / "var"))).resolve()

PRODUCTION = env_str("MODELPORT_ENV", "development") == "production"
if env_str("MODELPORT_ENV", "development") not in ("development", "production"):
    raise ImproperlyConfigured("MODELPORT_ENV must be 'development' or 'production'")
# Opt-in even in development: `make run` is how people try Modelport, and Django's debug page shows tracebacks,
# settings and the request to whoever triggers an error (a fuzzing run got 29 of them).
DEBUG = env_bool("DEBUG", False)


def _secret_key() -> str:
    """SECRET_KEY (or SECRET_KEY_FILE); in development, else the key `manage.py ensure_dirs` keeps under var/ (so
    that sessions survive a restart; never a fixed default). Nothing is written here: settings are imported by mypy,
    `manage.py help` and every tool. Empty: the system check modelport.E100 says what to do."""
    key = env_secret("SECRET_KEY")
    if key or PRODUCTION:
        return key
    try:
        return (VAR_DIR / "secret_key").read_text().strip()
    except FileNotFoundError:
        return ""


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")
SITE_URL = env_str("SITE_URL", "http://127.0.0.1:8000").rstrip("/")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "accounts",
    "models_registry",
    "deployments",
    "gateway",
    "audit",
    "tuning",
    "performance",
    "web",
    "portal",  # the settings' system checks (portal/checks.py) and `manage.py ensure_dirs`
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "infra.null_bytes.RefuseNulMiddleware",  # before anything queries the database with the path or query
    "portal.static_files.StaticFilesMiddleware",  # whitenoise's, streaming asynchronously under ASGI
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "portal.errors.DatabaseOutageMiddleware",  # last: it sees a view's exception first
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"
ASGI_APPLICATION = "portal.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

_database_url = env_secret("DATABASE_URL")
if _database_url:
    if not _database_url.startswith(("postgres://", "postgresql://", "sqlite://")):
        raise ImproperlyConfigured("DATABASE_URL must be a postgres:// (or sqlite://) URL")
    # Health checks: a connection that PostgreSQL dropped (a restart) is replaced on the next request instead of
    # failing it. A connect timeout: an unreachable server answers 503 quickly (portal/errors.py), never a hang.
    DATABASES = {"default": dj_database_url.parse(_database_url, conn_max_age=env_int("DB_CONN_MAX_AGE", 60),
                                                  conn_health_checks=True)}
    if DATABASES["default"]["ENGINE"].endswith("postgresql"):
        DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = env_int("DB_CONNECT_TIMEOUT", 5, minimum=1)
else:
    DATABASES = {
        "default": {
            "ENGINE": "infra.sqlite3",  # Django's, creating var/ when it first connects
            "NAME": str(VAR_DIR / "modelport.sqlite3"),
            # A web server, a worker and beat share this file: wait for locks instead of failing at once.
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"  # created by `manage.py ensure_dirs` and at the web server's start
# Serve static files straight from the apps and static/ (no collectstatic step needed to run).
WHITENOISE_USE_FINDERS = True

# --- Security (production) -------------------------------------------------------------------------------
if PRODUCTION:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    if env_bool("TRUST_X_FORWARDED_PROTO", True):
        # Behind an ingress or load balancer that terminates TLS.
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    # The gateway and health endpoints are reached inside the cluster over plain HTTP.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^serve/"]

# --- Artifact storage --------------------------------------------------------------------------------------
S3_BUCKET = env_str("S3_BUCKET")
S3_ENDPOINT_URL = env_str("S3_ENDPOINT_URL")  # empty: AWS itself
S3_REGION = env_str("S3_REGION", "us-east-1")
S3_ACCESS_KEY_ID = env_secret("S3_ACCESS_KEY_ID")
S3_SECRET_ACCESS_KEY = env_secret("S3_SECRET_ACCESS_KEY")
S3_PREFIX = env_str("S3_PREFIX", "modelport").strip("/")
ARTIFACT_ROOT = Path(env_str("ARTIFACT_ROOT", str(VAR_DIR / "artifacts"))).resolve()

# --- Uploads ----------------------------------------------------------------------------------------------
MAX_UPLOAD_SIZE = env_int("MAX_UPLOAD_SIZE", 20 * 1024**3, minimum=1)  # bytes, per artifact
MAX_MULTIPART_UPLOAD_SIZE = env_int("MAX_MULTIPART_UPLOAD_SIZE", 100 * 1024**2, minimum=1)
UPLOAD_EXPIRY_HOURS = env_int("UPLOAD_EXPIRY_HOURS", 24, minimum=1)
# What one team's models, versions and uploads may hold (uploads count with their declared length), unless an
# operator set the team its own (admin console: Team storage quotas); and the free space on ARTIFACT_ROOT's
# filesystem that uploads never take, left for the database, logs and rendered repositories.
TEAM_STORAGE_QUOTA_BYTES = env_int("TEAM_STORAGE_QUOTA_BYTES", 100 * 1024**3, minimum=0)
STORAGE_FREE_SPACE_RESERVE_BYTES = env_int("STORAGE_FREE_SPACE_RESERVE_BYTES", 2 * 1024**3, minimum=0)
# --- Imports (issue 35; docs/importing.md) ---------------------------------------------------------------
# A version may be imported from the operator's MLflow registry, a Hugging Face repository or an s3:// / https://
# object instead of uploaded: fetched on a worker of the import lane, then inspected as an upload. What each team may
# import from is the operator's (admin console: Team sources); these are the defaults for a team without a row.
MLFLOW_TRACKING_URI = env_str("MLFLOW_TRACKING_URI").rstrip("/")  # empty: MLflow imports are off
MLFLOW_TRACKING_TOKEN = env_secret("MLFLOW_TRACKING_TOKEN")  # the operator's, never a team's
MLFLOW_TRACKING_USERNAME = env_str("MLFLOW_TRACKING_USERNAME")
MLFLOW_TRACKING_PASSWORD = env_secret("MLFLOW_TRACKING_PASSWORD")
IMPORT_MLFLOW_MODELS = "\n".join(env_list("IMPORT_MLFLOW_MODELS", ["*"]))  # glob patterns of registered models
HF_ENDPOINT = env_str("HF_ENDPOINT", "https://huggingface.co").rstrip("/")  # a mirror's address, where there is one
HF_TOKEN = env_secret("HF_TOKEN")  # sent only for the teams the operator allows (Team sources)
IMPORT_HUGGINGFACE_REPOS = "\n".join(env_list("IMPORT_HUGGINGFACE_REPOS", ["*"]))
# s3:// sources: the operator's endpoint and credentials (boto3's own chain: AWS_ACCESS_KEY_ID, a role), buckets
# allowed per team only. Empty endpoint: the artifact store's (S3_ENDPOINT_URL), else AWS itself.
IMPORT_S3_ENDPOINT_URL = env_str("IMPORT_S3_ENDPOINT_URL")
IMPORT_S3_REGION = env_str("IMPORT_S3_REGION", "us-east-1")
# https:// sources are a server-side fetch (an SSRF risk): off unless the operator turns them on, and then only
# hosts a team is allowed, public addresses only, no redirect to another host.
IMPORT_HTTPS_ENABLED = env_bool("IMPORT_HTTPS_ENABLED", False)
# DANGEROUS, for an air-gapped mirror on a private network only: lets https imports reach private addresses
# (10/8, 172.16/12, 192.168/16, fc00::/7), so any team allowed a host that resolves there reaches that network.
# Loopback, link-local (the cloud metadata address), multicast and unspecified stay refused.
IMPORT_HTTPS_ALLOW_PRIVATE = env_bool("IMPORT_HTTPS_ALLOW_PRIVATE", False)
# A PEM bundle of the authorities https imports trust (an internal mirror's); empty: certifi's public ones.
IMPORT_HTTPS_CA_BUNDLE = env_str("IMPORT_HTTPS_CA_BUNDLE")
IMPORT_TIME_LIMIT_SECONDS = env_int("IMPORT_TIME_LIMIT_SECONDS", 3600, minimum=1)
IMPORT_CONNECT_TIMEOUT_SECONDS = env_float("IMPORT_CONNECT_TIMEOUT_SECONDS", 10.0, minimum=0.1)
IMPORT_READ_TIMEOUT_SECONDS = env_float("IMPORT_READ_TIMEOUT_SECONDS", 60.0, minimum=0.1)
IMPORT_MAX_RETRIES = env_int("IMPORT_MAX_RETRIES", 4, minimum=0)
# Imports one team may have under way at once (the import lane's threads are shared by every team): one more is a 429.
IMPORT_MAX_ACTIVE_PER_TEAM = env_int("IMPORT_MAX_ACTIVE_PER_TEAM", 2, minimum=1)
IMPORT_RETRY_BACKOFF_SECONDS = env_float("IMPORT_RETRY_BACKOFF_SECONDS", 5.0, minimum=0.0)
# A tus PATCH whose body stops arriving for this long keeps what arrived and is answered 408
# (models_registry/tus_asgi.py).
UPLOAD_IDLE_TIMEOUT_SECONDS = env_int("UPLOAD_IDLE_TIMEOUT_SECONDS", 60, minimum=1)
# Upload reservations (docs/security.md "Upload reservations"): a declared Upload-Length counts against the
# declaring team's quota, never against what other teams may upload. An unfinished upload that receives no bytes for
# UPLOAD_STALL_EXPIRY_SECONDS expires (its quota is free at once; the periodic sweep removes it within a minute), and
# a team holds at most UPLOAD_MAX_OPEN_PER_TEAM unfinished uploads with at most UPLOAD_MAX_OPEN_BYTES_PER_TEAM still
# to come (what they declared less what arrived).
UPLOAD_STALL_EXPIRY_SECONDS = env_int("UPLOAD_STALL_EXPIRY_SECONDS", 600, minimum=1)
UPLOAD_MAX_OPEN_PER_TEAM = env_int("UPLOAD_MAX_OPEN_PER_TEAM", 4, minimum=1)
UPLOAD_MAX_OPEN_BYTES_PER_TEAM = env_int("UPLOAD_MAX_OPEN_BYTES_PER_TEAM", 2 * MAX_UPLOAD_SIZE, minimum=1)
# Untrusted archives (SavedModel, python models): limits against zip bombs.
ARCHIVE_MAX_ENTRIES = env_int("ARCHIVE_MAX_ENTRIES", 10_000, minimum=1)
ARCHIVE_MAX_TOTAL_SIZE = env_int("ARCHIVE_MAX_TOTAL_SIZE", 50 * 1024**3, minimum=1)
ARCHIVE_MAX_RATIO = env_int("ARCHIVE_MAX_RATIO", 200, minimum=1)
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024**2
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024**2
FILE_UPLOAD_TEMP_DIR = None

# --- Celery -----------------------------------------------------------------------------------------------
CELERY_BROKER_URL = env_secret("CELERY_BROKER_URL", "filesystem://")
if not CELERY_BROKER_URL.startswith(("filesystem://", "redis://", "rediss://", "memory://")):
    raise ImproperlyConfigured("CELERY_BROKER_URL must be filesystem://, redis:// or rediss://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    CELERY_BROKER_TRANSPORT = "infra.kombu_filesystem:Transport"  # writes messages atomically
    # The transport's channel creates these folders when it opens (infra/kombu_filesystem.py).
    _queue_dir, _processed_dir = VAR_DIR / "celery" / "queue", VAR_DIR / "celery" / "processed"
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(_processed_dir),
        "store_processed": False,
        "control_folder": str(VAR_DIR / "celery" / "control"),
    }
else:
    # Redis: a task whose worker died unacknowledged is delivered again after this many seconds, so it must exceed
    # the longest task (an inspection with its trial run, the render of a large model), or Redis hands a running task
    # to a second worker. Reconcile ticks need no redelivery: beat queues them again from the database.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 1800, minimum=5)}
# Each lane of workers names its pool with -P (infra/lanes.py): prefork where time limits must hold (inspection),
# threads elsewhere. Celery reads this setting before -P, so it is set only when the operator asks for one pool
# everywhere (and then inspection time limits hold only if it is prefork).
if env_str("CELERY_WORKER_POOL"):
    CELERY_WORKER_POOL = env_str("CELERY_WORKER_POOL")
RECONCILE_INTERVAL_SECONDS = env_float("RECONCILE_INTERVAL_SECONDS", 5.0, minimum=0.5)
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# How often a serving canary's guardrails are looked at (deployments/canary.py).
CANARY_CHECK_SECONDS = env_float("CANARY_CHECK_SECONDS", 5.0, minimum=1.0)
# How often the serving Tritons' statistics are read for the performance panel (performance/snapshots.py): the
# finest grain of its windows, and (with the longest window, 24 h) how many rows a revision keeps.
PERFORMANCE_SNAPSHOT_SECONDS = env_float("PERFORMANCE_SNAPSHOT_SECONDS", 60.0, minimum=5.0)
# The gateway's request buckets (gateway/models.py RequestStats) are kept this long, then deleted
# (gateway/stats.py prune): at least the longest window anything reads (24 h: the metrics API's 1440 minutes, a
# canary's longest window, the performance panel's 24h), and one hour more so that the oldest window is whole.
REQUEST_STATS_KEEP_HOURS = env_int("REQUEST_STATS_KEEP_HOURS", 25, minimum=25)
CELERY_BEAT_SCHEDULE = beat_schedule(RECONCILE_INTERVAL_SECONDS, CANARY_CHECK_SECONDS, PERFORMANCE_SNAPSHOT_SECONDS)

# --- Deployments and the local Triton runtime ------------------------------------------------------------
MODELPORT_RUNTIME_ENV = Path(env_str("MODELPORT_RUNTIME_ENV", str(BASE_DIR / "var" / "runtime-env"))).resolve()
DEPLOYMENTS_DIR = VAR_DIR / "deployments"
TRITON_READY_TIMEOUT_SECONDS = env_float("TRITON_READY_TIMEOUT_SECONDS", 180.0, minimum=5)
# After the gateway switched to a new revision, the old server keeps answering this long before it is stopped
# (longer than the gateway's route cache), so that no request of a rollout fails.
ROLLOUT_DRAIN_SECONDS = env_float("ROLLOUT_DRAIN_SECONDS", 2.0, minimum=0)
TRITON_RESPONSE_CACHE_BYTES = env_int("TRITON_RESPONSE_CACHE_BYTES", 64 * 1024**2, minimum=1)
TRITON_STOP_GRACE_SECONDS = env_float("TRITON_STOP_GRACE_SECONDS", 10.0, minimum=1)
# Logs of uploaded code (deployments/logtail.py): a model may print one line of gigabytes without a newline, so every
# reader (the API and the page, the death report, a pod's log) reads at most LOG_TAIL_MAX_BYTES from the end and cuts
# each line at LOG_LINE_MAX_BYTES; the API's `lines` goes up to LOG_MAX_LINES; events and statuses copy at most
# LOG_EXCERPT_MAX_CHARS. On disk a local Triton's log and its one rotated file hold at most TRITON_LOG_MAX_BYTES.
LOG_TAIL_MAX_BYTES = env_int("LOG_TAIL_MAX_BYTES", 1024**2, minimum=4096)
LOG_LINE_MAX_BYTES = env_int("LOG_LINE_MAX_BYTES", 16 * 1024, minimum=256)
LOG_MAX_LINES = env_int("LOG_MAX_LINES", 5000, minimum=1)
LOG_EXCERPT_MAX_CHARS = env_int("LOG_EXCERPT_MAX_CHARS", 4000, minimum=200)
# An event that repeats (a shared model unloaded while idle, loaded again by a request) updates the deployment's
# row of its run rather than adding one, for runs begun within this many seconds (deployments/events.py); 0: a row
# each time.
EVENT_REPEAT_WINDOW_SECONDS = env_int("EVENT_REPEAT_WINDOW_SECONDS", 3600, minimum=0)
TRITON_LOG_MAX_BYTES = env_int("TRITON_LOG_MAX_BYTES", 64 * 1024**2, minimum=1024**2)
# Frameworks the runtime env should carry beyond ONNX ("torch", "tensorflow"): `make run`/`make runtime-env` install
# them, and the `runtime_extras` check warns when the env lacks one. What serves is detected from the env itself
# (modelport.core.frameworks), so a framework added by hand works too.
MODELPORT_RUNTIME_EXTRAS = env_list("MODELPORT_RUNTIME_EXTRAS")
# The TorchScript trial run at inspection (modelport.core.trial_run): a subprocess in the runtime env, killed past
# these limits (importing torch alone takes a few seconds and about 1 GiB of address space). The time stays below
# CELERY_VISIBILITY_TIMEOUT, so that Redis never hands a running inspection to a second worker.
TRIAL_RUN_TIMEOUT_SECONDS = env_float("TRIAL_RUN_TIMEOUT_SECONDS", 50.0, minimum=5)
TRIAL_RUN_MEMORY_MB = env_int("TRIAL_RUN_MEMORY_MB", 4096, minimum=1024)
# A python model without requirements is called once at inspection, in a sandboxed Triton of its own, and refused
# when its answer does not match its signature (models_registry/python_trial.py). Off: accepted unchecked.
PYTHON_TRIAL_CALL = env_bool("PYTHON_TRIAL_CALL", True)
# A version's example request (an upload field, modelport/core/example_request.py): the trial call's request in place
# of zeros, and a default request. Untrusted input: at most this many bytes of JSON, checked against the signature.
EXAMPLE_REQUEST_MAX_BYTES = env_int("EXAMPLE_REQUEST_MAX_BYTES", 1024 * 1024, minimum=1024)
# An inspection as a whole (hashing, reading the format, the trial run): past this many seconds Celery's soft limit
# marks the version invalid, and INSPECTION_KILL_GRACE_SECONDS later its hard limit kills the worker's child process
# (the inspection lane runs the prefork pool, infra/lanes.py). A version still validating after both (its child
# was killed) is marked invalid by the periodic dispatch. Below CELERY_VISIBILITY_TIMEOUT, so that Redis never hands
# a running inspection to a second worker.
INSPECTION_TIME_LIMIT_SECONDS = env_float("INSPECTION_TIME_LIMIT_SECONDS", 300.0, minimum=5)
INSPECTION_KILL_GRACE_SECONDS = env_float("INSPECTION_KILL_GRACE_SECONDS", 10.0, minimum=1)
if INSPECTION_TIME_LIMIT_SECONDS <= TRIAL_RUN_TIMEOUT_SECONDS:
    raise ImproperlyConfigured("INSPECTION_TIME_LIMIT_SECONDS must exceed TRIAL_RUN_TIMEOUT_SECONDS (the trial run is "
                               "a part of the inspection)")
_visibility = CELERY_BROKER_TRANSPORT_OPTIONS.get("visibility_timeout")
if isinstance(_visibility, int) and INSPECTION_TIME_LIMIT_SECONDS + INSPECTION_KILL_GRACE_SECONDS >= _visibility:
    raise ImproperlyConfigured("INSPECTION_TIME_LIMIT_SECONDS + INSPECTION_KILL_GRACE_SECONDS must stay below "
                               "CELERY_VISIBILITY_TIMEOUT, or Redis hands a running inspection to a second worker")
# Fairness between teams: at most this many of a team's uploads are queued or running for inspection; the others
# wait in the database (status validating) and are queued as the team's own inspections finish, so that one team's
# hundred uploads never take every inspection slot ahead of another team's one.
INSPECTION_MAX_ACTIVE_PER_TEAM = env_int("INSPECTION_MAX_ACTIVE_PER_TEAM", 2, minimum=1)
# Python models' requirements (deployments/pyenvs.py): one environment per requirement set under PYENVS_DIR, built
# by a worker with pip, wheels only, from the operator's package source: MODELPORT_PIP_INDEX_URL (an index that
# replaces PyPI, e.g. a mirror on an air-gapped network) and/or MODELPORT_PIP_FIND_LINKS (a wheelhouse directory or
# page); unset, pip's own configuration applies (pip.conf, PIP_* variables; by default PyPI). A build taking longer
# than MODELPORT_PIP_TIMEOUT_SECONDS fails (it stays below CELERY_VISIBILITY_TIMEOUT). An environment no revision
# uses is removed once unused for PYENV_KEEP_UNUSED_SECONDS.
PYENVS_DIR = Path(env_str("PYENVS_DIR", str(VAR_DIR / "pyenvs"))).resolve()
MODELPORT_PIP_INDEX_URL = env_str("MODELPORT_PIP_INDEX_URL")
MODELPORT_PIP_FIND_LINKS = env_str("MODELPORT_PIP_FIND_LINKS")
MODELPORT_PIP_TIMEOUT_SECONDS = env_float("MODELPORT_PIP_TIMEOUT_SECONDS", 900.0, minimum=30)
PYENV_KEEP_UNUSED_SECONDS = env_float("PYENV_KEEP_UNUSED_SECONDS", 7 * 86400.0, minimum=0)
# Tunes (tuning/): one queued or running per deployment, and at most this many per team, so that one team's
# deployments cannot queue tunes of an hour each ahead of every other team's on the machine.
TUNE_MAX_ACTIVE_PER_TEAM = env_int("TUNE_MAX_ACTIVE_PER_TEAM", 2, minimum=1)

# --- Local runtime sandbox (docs/security.md, "Local runtime") ------------------------------------------------
# Every local Triton runs confined: namespaces, a read-only view of what it needs, Landlock, seccomp and cgroup
# limits. Where this machine's kernel cannot build the sandbox, SANDBOX_REQUIRED (on in production) refuses python
# models, which run uploaded code; setting it to false is the operator's explicit opt-out. SANDBOX_ENABLED=false
# starts every Triton unconfined (for debugging; SANDBOX_REQUIRED must then be false).
SANDBOX_ENABLED = env_bool("SANDBOX_ENABLED", True)
SANDBOX_REQUIRED = env_bool("SANDBOX_REQUIRED", PRODUCTION)
# The uid and gid a sandbox has outside when the portal runs as root (otherwise: the portal's own).
SANDBOX_UID = env_int("SANDBOX_UID", 65534, minimum=1)
SANDBOX_GID = env_int("SANDBOX_GID", 65534, minimum=1)
# Each sandbox's private /dev/shm, where the python backend passes tensors (it counts toward the memory limit).
SANDBOX_SHM_SIZE = env_str("SANDBOX_SHM_SIZE", "1Gi")
# Each sandbox's scratch directory (HOME, TMPDIR, /tmp): a tmpfs of this size, so a model cannot fill the host's
# disk; a write past it fails with ENOSPC, and what it holds counts toward the memory limit.
SANDBOX_SCRATCH_SIZE = env_str("SANDBOX_SCRATCH_SIZE", "1Gi")
SANDBOX_PIDS_MAX = env_int("SANDBOX_PIDS_MAX", 1024, minimum=64)  # processes and threads
# The CPU priority (nice value) of everything sandboxed, Tritons and trial runs: below the portal's own processes, so
# that models busy on every core leave the gateway a core when a request comes (docs/security.md, "CPU"). 0: the
# same as the portal's.
SANDBOX_NICE = env_int("SANDBOX_NICE", 10, minimum=0)
if SANDBOX_NICE > 19:
    raise ImproperlyConfigured(f"SANDBOX_NICE must be a nice value from 0 to 19, got {SANDBOX_NICE}")
# A dedicated local deployment that sets no resources.memory is limited to what its models were measured to take
# (deployments/server_memory.py: POOL_MODEL_MEMORY_HEADROOM over each instance's figure, at least
# POOL_MODEL_MEMORY_MIN) plus SANDBOX_SERVER_MEMORY for Triton itself and its python backend's shared memory.
# SANDBOX_DEFAULT_MEMORY ("" for none) where a model gives no figure: a TorchScript or SavedModel version never
# measured on this machine (an ONNX or python one is estimated from its file).
SANDBOX_SERVER_MEMORY = env_str("SANDBOX_SERVER_MEMORY", "256Mi")
SANDBOX_DEFAULT_MEMORY = env_str("SANDBOX_DEFAULT_MEMORY", "4Gi")
# Where an operator allowed a deployment egress (in the admin console), the TCP ports it may connect to.
SANDBOX_EGRESS_PORTS = env_list("SANDBOX_EGRESS_PORTS", ["53", "80", "443"])
# A cgroup (absolute path in the hierarchy, "/modelport") for the sandboxes; "": below the worker's own.
SANDBOX_CGROUP_PARENT = env_str("SANDBOX_CGROUP_PARENT")
# The orphan sweep stops a Triton of this var/ that no database row knows once it is this old.
TRITON_ORPHAN_GRACE_SECONDS = env_float("TRITON_ORPHAN_GRACE_SECONDS", 60.0, minimum=5)

# --- Shared servers (issue 24; deployments/pools.py, docs/pools.md) ---------------------------------------------
# A deployment's placement when its request names none: "dedicated" (a Triton of its own) or "shared".
DEPLOYMENT_DEFAULT_PLACEMENT = env_str("DEPLOYMENT_DEFAULT_PLACEMENT", "dedicated")
POOLS_DIR = VAR_DIR / "pools"
# The built-in pool `shared` on the local runtime (created at first use; the admin console changes it after that).
POOL_SHARED_MEMORY_BUDGET = env_str("POOL_SHARED_MEMORY_BUDGET", "2Gi")
POOL_SHARED_IDLE_UNLOAD_SECONDS = env_int("POOL_SHARED_IDLE_UNLOAD_SECONDS", 600, minimum=0)
# A pool's Triton's cgroup memory limit is its budget plus this (Triton's own memory, beside its models').
POOL_PROCESS_OVERHEAD = env_str("POOL_PROCESS_OVERHEAD", "512Mi")
# How long the gateway holds the first request to an unloaded model while it loads, before a 503 with Retry-After.
POOL_COLD_START_WAIT_SECONDS = env_float("POOL_COLD_START_WAIT_SECONDS", 10.0, minimum=0)
# A request to a dedicated cluster deployment scaled to zero (min_replicas 0, KEDA) is held while a pod starts: at most
# this long (KEDA's poll, Prometheus' scrape of the gateway and the pod's start add up), then a 503 with Retry-After;
# at most GATEWAY_MAX_HELD_PER_TEAM of a team's requests at once per gateway process, a 503 past it
# (gateway/scale_from_zero.py).
GATEWAY_SCALE_FROM_ZERO_WAIT_SECONDS = env_float("GATEWAY_SCALE_FROM_ZERO_WAIT_SECONDS", 60.0, minimum=0)
GATEWAY_MAX_HELD_PER_TEAM = env_int("GATEWAY_MAX_HELD_PER_TEAM", 32, minimum=1)
# The gateway's cold starts run in an executor of their own this big (never the one for its route and token
# lookups), and each team has at most this many of them in flight per gateway process (more wait their turn within
# POOL_COLD_START_WAIT_SECONDS, then 503 with Retry-After).
POOL_GATEWAY_LOAD_THREADS = env_int("POOL_GATEWAY_LOAD_THREADS", 2, minimum=1)
POOL_GATEWAY_LOADS_PER_TEAM = env_int("POOL_GATEWAY_LOADS_PER_TEAM", 1, minimum=1)
# Under memory pressure only models unused this long are evicted (least recently used first).
POOL_EVICTION_MIN_IDLE_SECONDS = env_float("POOL_EVICTION_MIN_IDLE_SECONDS", 30.0, minimum=0)
# Processes and threads a pool's Triton and its python-backend stubs may hold together (the cgroup's pids.max): a
# loaded python-backend model costs about 45 (its stub's threads and Triton's own for it), so SANDBOX_PIDS_MAX (one
# server's 1024) stopped a pool at 23 small models.
POOL_PIDS_MAX = env_int("POOL_PIDS_MAX", 16384, minimum=64)

# Another team's idle models are evicted for a load only once loaded this long (the team's own go first).
POOL_EVICTION_MIN_RESIDENCY_SECONDS = env_float("POOL_EVICTION_MIN_RESIDENCY_SECONDS", 300.0, minimum=0)
# The share of a pool open to every team that one team's loaded models may take (a team's own pool: all of it).
POOL_TEAM_SHARE = env_float("POOL_TEAM_SHARE", 0.5, minimum=0.01)
if POOL_TEAM_SHARE > 1:
    raise ImproperlyConfigured(f"POOL_TEAM_SHARE is a share of a pool's budget, at most 1, got {POOL_TEAM_SHARE}")
# A version never measured on this machine counts as its artifact's size times this until its first load.
POOL_UNMEASURED_FACTOR = env_float("POOL_UNMEASURED_FACTOR", 2.0, minimum=1)
# A pool's Triton that no deployment has had models in (loaded, loading or idle) for this long is stopped; the next
# deployment into the pool starts it again. 0: it runs until `make stop-triton`.
POOL_EMPTY_SERVER_STOP_SECONDS = env_float("POOL_EMPTY_SERVER_STOP_SECONDS", 300.0, minimum=0)
# Each model's memory in a local pool (issue 30; deployments/runtimes/local/pool_memory.py, docs/pools.md): a model's
# processes run in a memory cgroup of their own, limited to its reservation (its measured peak times the headroom,
# at least the minimum), which is what it is charged; past it the model loses its own process, never the pool's
# Triton. An answer over POOL_MAX_OUTPUT_BYTES is refused in the model's process before Triton copies it (0: no
# limit). A model's process waits this long for its cgroup before it refuses to run.
POOL_MODEL_MEMORY_MIN = env_str("POOL_MODEL_MEMORY_MIN", "128Mi")
POOL_MODEL_MEMORY_HEADROOM = env_float("POOL_MODEL_MEMORY_HEADROOM", 1.5, minimum=1)
POOL_MAX_OUTPUT_BYTES = env_int("POOL_MAX_OUTPUT_BYTES", 16 * 2**20, minimum=0)
POOL_STUB_PLACEMENT_SECONDS = env_float("POOL_STUB_PLACEMENT_SECONDS", 20.0, minimum=1)
# A shared revision is kept loaded, unused, at least this many times as long as its last load took (beside its own
# idle_unload_seconds), so that a model that loads for 30 s is not unloaded and loaded again every few seconds.
POOL_IDLE_UNLOAD_LOAD_FACTOR = env_float("POOL_IDLE_UNLOAD_LOAD_FACTOR", 10.0, minimum=0)

# --- Resource ceilings (deployments/ceilings.py, docs/security.md "Resource ceilings") --------------------------
# What a team may ask for is the operator's to set: per deployment (each server or pod) and per team (the sum over
# its deployments that are not stopped, canaries counted, on each runtime). Quantities are Kubernetes' ("8Gi", "4");
# 0: no ceiling beyond the planner's own bounds. Each team's quota in the admin (Teams -> quota) overrides any of
# them. Left unset (""), the local runtime's memory ceilings (per deployment and per team) are this machine's memory
# less LOCAL_MEMORY_RESERVE (for the portal, its database and the system) and its CPU ceiling per deployment is the
# machine's cores: a limit above the machine is no limit at all, and one team alone cannot overcommit it.


def _machine_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        return 0


def _quantity_setting(name: str, default: str = "") -> str:
    """A Kubernetes quantity from the environment, checked here so that a typo stops the start, not a deploy."""
    from modelport.core import quantity  # plain code (no Django): safe to import from the settings

    value = env_str(name, default).strip()
    if value:
        try:
            quantity.parse_quantity(value)
        except quantity.QuantityError as exc:
            raise ImproperlyConfigured(f"{name}: {exc}") from None
    return value


MACHINE_MEMORY_BYTES = _machine_memory_bytes()
MACHINE_CPUS = os.cpu_count() or 1
LOCAL_MEMORY_RESERVE = _quantity_setting("LOCAL_MEMORY_RESERVE", "2Gi")
DEPLOYMENT_MAX_MEMORY = _quantity_setting("DEPLOYMENT_MAX_MEMORY")  # "": local, the machine less the reserve
DEPLOYMENT_MAX_CPU = _quantity_setting("DEPLOYMENT_MAX_CPU")  # "": local, this machine's cores
DEPLOYMENT_MAX_INSTANCES = env_int("DEPLOYMENT_MAX_INSTANCES", 16, minimum=0)  # model instances per server
DEPLOYMENT_MAX_REPLICAS = env_int("DEPLOYMENT_MAX_REPLICAS", 0, minimum=0)  # 0: the planner's bound (100)
DEPLOYMENT_MAX_GPUS = env_int("DEPLOYMENT_MAX_GPUS", 0, minimum=0)  # per replica; 0: the planner's bound (16)
TEAM_MAX_MEMORY = _quantity_setting("TEAM_MAX_MEMORY")  # "": local, the machine less the reserve
TEAM_MAX_CPU = _quantity_setting("TEAM_MAX_CPU")
TEAM_MAX_GPUS = env_int("TEAM_MAX_GPUS", 0, minimum=0)
TEAM_MAX_REPLICAS = env_int("TEAM_MAX_REPLICAS", 0, minimum=0)  # servers (pods) at once, autoscaling's maximum
# Memory limits across teams (docs/security.md "Memory limits across teams"): the local runtime admits a deployment
# only while the memory limits of every team's running and starting deployments together stay within this machine's
# memory less LOCAL_MEMORY_RESERVE, times this factor (1.0: no overcommit; 1.5: limits may add up to half as much
# again, betting that not every server uses its whole limit at once; 0: no machine-wide admission).
DEPLOYMENT_MEMORY_OVERCOMMIT = env_float("DEPLOYMENT_MEMORY_OVERCOMMIT", 1.0, minimum=0)
if not DEPLOYMENT_MEMORY_OVERCOMMIT < float("inf"):  # also refuses "nan", which every comparison would let pass
    raise ImproperlyConfigured(f"DEPLOYMENT_MEMORY_OVERCOMMIT must be finite, got {DEPLOYMENT_MEMORY_OVERCOMMIT}")

# --- Kubernetes runtime ----------------------------------------------------------------------------------
# Deployments with runtime "kubernetes": Triton pods in a namespace per team, loading the model repository from
# S3. See docs/kubernetes.md; deployments.runtimes.kubernetes.config reads these into one frozen dataclass.


def _env_pairs(name: str, default: str = "") -> dict[str, str]:
    """"a=b,c=d" as {"a": "b", "c": "d"}."""
    pairs: dict[str, str] = {}
    for item in env_list(name, [default] if default else []):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ImproperlyConfigured(f"{name} must be a comma-separated list of key=value pairs, got {item!r}")
        pairs[key.strip()] = value.strip()
    return pairs


# Where the cluster is: a kubeconfig file (the standard KUBECONFIG variable), or the pod's service account.
KUBERNETES_KUBECONFIG = env_str("KUBECONFIG")
KUBERNETES_CONTEXT = env_str("KUBERNETES_CONTEXT")  # empty: the kubeconfig's current context
KUBERNETES_IN_CLUSTER = env_bool("KUBERNETES_IN_CLUSTER", False)
# team -> namespace; teams not listed get KUBERNETES_NAMESPACE_PREFIX + team name.
KUBERNETES_NAMESPACES = _env_pairs("KUBERNETES_NAMESPACES")
KUBERNETES_NAMESPACE_PREFIX = env_str("KUBERNETES_NAMESPACE_PREFIX", "modelport-")
KUBERNETES_CREATE_NAMESPACES = env_bool("KUBERNETES_CREATE_NAMESPACES", True)
KUBERNETES_TRITON_IMAGE = env_str("KUBERNETES_TRITON_IMAGE", "nvcr.io/nvidia/tritonserver:24.10-py3")
# An image with custom backends (TNN) built FROM the Triton image; used when a revision serves a TNN model.
KUBERNETES_TRITON_CUSTOM_IMAGE = env_str("KUBERNETES_TRITON_CUSTOM_IMAGE")
KUBERNETES_TNN_BACKEND_NAME = env_str("KUBERNETES_TNN_BACKEND_NAME", "tnn")
KUBERNETES_IMAGE_PULL_SECRETS = env_list("KUBERNETES_IMAGE_PULL_SECRETS")
# The S3 bucket Triton loads model repositories from; defaults to the artifact store's.
KUBERNETES_S3_ENDPOINT_URL = env_str("KUBERNETES_S3_ENDPOINT_URL", S3_ENDPOINT_URL)
KUBERNETES_S3_BUCKET = env_str("KUBERNETES_S3_BUCKET", S3_BUCKET)
KUBERNETES_S3_PREFIX = env_str("KUBERNETES_S3_PREFIX", f"{S3_PREFIX}/repositories").strip("/")
KUBERNETES_S3_REGION = env_str("KUBERNETES_S3_REGION", S3_REGION)
KUBERNETES_S3_ACCESS_KEY_ID = env_secret("KUBERNETES_S3_ACCESS_KEY_ID", S3_ACCESS_KEY_ID)
KUBERNETES_S3_SECRET_ACCESS_KEY = env_secret("KUBERNETES_S3_SECRET_ACCESS_KEY", S3_SECRET_ACCESS_KEY)
# Triton's pods hold no S3 credentials: an init container fetches the revision's files through presigned GET
# URLs that live this long (the worker renews them at half-life; S3 allows at most 7 days). See docs/security.md.
KUBERNETES_REPOSITORY_URL_SECONDS = env_int("KUBERNETES_REPOSITORY_URL_SECONDS", 24 * 3600, minimum=3600)
# The init container's image (it runs `python3`); empty: the Triton image, which has it.
KUBERNETES_FETCH_IMAGE = env_str("KUBERNETES_FETCH_IMAGE")
# The Triton image of a cluster pool's pods: it serves every model through Modelport's generated python-backend models
# (each in processes of its own, confined to its memory limit), so it needs onnxruntime and numpy<2 for its python3
# (platform/docker/triton-pool.Dockerfile). Empty: KUBERNETES_TRITON_IMAGE, whose python has no onnxruntime.
KUBERNETES_POOL_TRITON_IMAGE = env_str("KUBERNETES_POOL_TRITON_IMAGE")
# The namespace of the pools open to every team on the cluster (docs/pools.md); a team's own pool runs in its namespace.
KUBERNETES_POOL_NAMESPACE = env_str("KUBERNETES_POOL_NAMESPACE", "modelport-pools")
# Triton's pods may connect to DNS (in this namespace) and to these destinations only, e.g.
# "10.0.5.0/24:9000,namespace=storage:9000": list the S3 endpoint, which the init container downloads from.
KUBERNETES_TRITON_EGRESS = env_list("KUBERNETES_TRITON_EGRESS")
KUBERNETES_DNS_NAMESPACE = env_str("KUBERNETES_DNS_NAMESPACE", "kube-system")
# With tracing on (OTEL_EXPORTER_OTLP_ENDPOINT), where Triton's pods reach the collector, one egress rule with the
# endpoint's port ("namespace=observability:4318", "10.0.7.3/32:4318"): their NetworkPolicy lets them reach it and
# their Triton exports spans there. Unset: the pods are not traced (docs/observability.md).
KUBERNETES_TRACE_EGRESS = env_str("KUBERNETES_TRACE_EGRESS")
KUBERNETES_DEFAULT_CPU = env_str("KUBERNETES_DEFAULT_CPU", "1")
KUBERNETES_DEFAULT_MEMORY = env_str("KUBERNETES_DEFAULT_MEMORY", "4Gi")
KUBERNETES_SHM_SIZE = env_str("KUBERNETES_SHM_SIZE", "1Gi")
KUBERNETES_TMP_SIZE = env_str("KUBERNETES_TMP_SIZE", "1Gi")  # Triton's writable /tmp (its root filesystem is not)
# A revision's resources.gpu_type selects nodes by this label; KUBERNETES_GPU_TYPES maps short names to label
# values ("a100=NVIDIA-A100-SXM4-80GB"); a type not listed is used as the label value itself.
KUBERNETES_GPU_NODE_LABEL = env_str("KUBERNETES_GPU_NODE_LABEL", "nvidia.com/gpu.product")
KUBERNETES_GPU_TYPES = _env_pairs("KUBERNETES_GPU_TYPES")
KUBERNETES_GPU_TOLERATIONS = env_list("KUBERNETES_GPU_TOLERATIONS", ["nvidia.com/gpu"])  # taint keys
# Only the gateway (these pods in this namespace) may reach Triton; Prometheus may scrape port 8002 if set.
KUBERNETES_GATEWAY_NAMESPACE = env_str("KUBERNETES_GATEWAY_NAMESPACE", "modelport")
KUBERNETES_GATEWAY_POD_LABELS = _env_pairs(
    "KUBERNETES_GATEWAY_POD_LABELS", "app.kubernetes.io/name=modelport,app.kubernetes.io/component=web"
)
# The reconcile worker's pods (same namespace) may reach Triton's HTTP port: the performance panel's snapshot pass
# reads its statistics API. Never the inspection worker's labels (it runs uploaded code); empty: not admitted.
KUBERNETES_WORKER_POD_LABELS = _env_pairs(
    "KUBERNETES_WORKER_POD_LABELS", "app.kubernetes.io/name=modelport,app.kubernetes.io/component=worker"
)
KUBERNETES_METRICS_NAMESPACE = env_str("KUBERNETES_METRICS_NAMESPACE")
KUBERNETES_QUEUE_TIME_METRIC = env_str("KUBERNETES_QUEUE_TIME_METRIC", "triton_queue_time_us")
# What a dedicated cluster deployment's "autoscaling" renders (docs/kubernetes.md, "Autoscaling"): "hpa", an HPA on
# the deployment's own metric (cpu or queue_time); "queue-ratio-hpa", an HPA on the Prometheus Adapter's external
# metric modelport_triton_queue_compute_ratio; "keda", a KEDA ScaledObject reading that ratio from
# KUBERNETES_KEDA_PROMETHEUS_URL. The last two scale on KUBERNETES_AUTOSCALING_TARGET_RATIO, not the deployment's
# target.
KUBERNETES_AUTOSCALING = env_str("KUBERNETES_AUTOSCALING", "hpa")
if KUBERNETES_AUTOSCALING not in ("hpa", "queue-ratio-hpa", "keda"):
    raise ImproperlyConfigured(
        f"KUBERNETES_AUTOSCALING must be hpa, queue-ratio-hpa or keda, got {KUBERNETES_AUTOSCALING!r}")
KUBERNETES_AUTOSCALING_TARGET_RATIO = env_float("KUBERNETES_AUTOSCALING_TARGET_RATIO", 1.0, minimum=0.01)
KUBERNETES_KEDA_PROMETHEUS_URL = env_str("KUBERNETES_KEDA_PROMETHEUS_URL")
KUBERNETES_CLUSTER_DOMAIN = env_str("KUBERNETES_CLUSTER_DOMAIN", "cluster.local")
# How long a rollout may take (big models download and load slowly), and how long a pod may wait for a node.
KUBERNETES_READY_TIMEOUT_SECONDS = env_int("KUBERNETES_READY_TIMEOUT_SECONDS", 1800, minimum=10)
KUBERNETES_UNSCHEDULABLE_GRACE_SECONDS = env_int("KUBERNETES_UNSCHEDULABLE_GRACE_SECONDS", 120, minimum=0)

# --- Inference gateway (/serve/) ------------------------------------------------------------------------
# Counters shared by every web process and the gRPC gateway (gateway rate limits and stream slots, sign-in
# throttling). Empty: the broker's Redis when it is one, else each process counts on its own.
REDIS_URL = env_secret("REDIS_URL",
                       CELERY_BROKER_URL if CELERY_BROKER_URL.startswith(("redis://", "rediss://")) else "")
if REDIS_URL and not REDIS_URL.startswith(("redis://", "rediss://")):
    raise ImproperlyConfigured("REDIS_URL must be a redis:// or rediss:// URL")
GATEWAY_MAX_BODY_BYTES = env_int("GATEWAY_MAX_BODY_BYTES", 256 * 1024**2, minimum=1)
GATEWAY_UPSTREAM_TIMEOUT_SECONDS = env_float("GATEWAY_UPSTREAM_TIMEOUT_SECONDS", 60.0, minimum=0.1)
# Token, session and route answers are reused this long: revoking or stopping takes effect within it.
GATEWAY_CACHE_TTL_SECONDS = env_float("GATEWAY_CACHE_TTL_SECONDS", 0.5, minimum=0)
GATEWAY_RATE_LIMIT_PER_SECOND = env_float("GATEWAY_RATE_LIMIT_PER_SECOND", 5000.0, minimum=0)  # per token; 0: off
GATEWAY_RATE_LIMIT_BURST = env_int("GATEWAY_RATE_LIMIT_BURST", 5000, minimum=1)
GATEWAY_MAX_UPSTREAM_CONNECTIONS = env_int("GATEWAY_MAX_UPSTREAM_CONNECTIONS", 256, minimum=1)
# Triton's answer is streamed through; one over this many bytes is cut off with a 502 (memory stays bounded).
GATEWAY_MAX_RESPONSE_BYTES = env_int("GATEWAY_MAX_RESPONSE_BYTES", 256 * 1024**2, minimum=1024)
# A stream (/generate_stream, issue 33) whose model sends nothing for this long is ended with an error event: a silent
# model holds the connection, a Triton slot and the caller's wait for nothing.
GATEWAY_STREAM_IDLE_SECONDS = env_float("GATEWAY_STREAM_IDLE_SECONDS", 60.0, minimum=0.1)
# Streams a team may have open at once, the web processes and the gRPC gateway together through REDIS_URL (per process
# without it, or while Redis is down); 429 past it, other teams' streams are not touched; 0: no limit.
GATEWAY_MAX_STREAMS_PER_TEAM = env_int("GATEWAY_MAX_STREAMS_PER_TEAM", 64, minimum=0)
# A stream's total length (HTTP's /generate_stream and the OpenAI API's streamed answers, gRPC's decoupled
# ModelStreamInfer): past either bound it is ended with an error, so that a model that never stops, or a caller that
# never hangs up, cannot hold a connection, a Triton slot and a stream slot for ever.
GATEWAY_MAX_STREAM_SECONDS = env_float("GATEWAY_MAX_STREAM_SECONDS", 600.0, minimum=1.0)
GATEWAY_MAX_STREAM_BYTES = env_int("GATEWAY_MAX_STREAM_BYTES", 64 * 1024**2, minimum=1024)
# A caller that reads a stream slower than the model writes it is given this long for each piece to leave (the web
# server's send buffer is the only buffering, a few tens of KiB); past it the stream is ended and counted as a slow
# reader, never buffered further in the gateway.
GATEWAY_STREAM_SEND_SECONDS = env_float("GATEWAY_STREAM_SEND_SECONDS", 30.0, minimum=0.1)
# An inference input's element count x datatype size may not exceed this (Triton allocates it before reading).
GATEWAY_MAX_TENSOR_BYTES = env_int("GATEWAY_MAX_TENSOR_BYTES", 256 * 1024**2, minimum=1)
# Deeper JSON is refused before it reaches Triton, whose parser overflows its stack on ~300,000 levels.
GATEWAY_MAX_JSON_DEPTH = env_int("GATEWAY_MAX_JSON_DEPTH", 64, minimum=4)
# JSON requests' FP32/FP64 tensors go to Triton in the binary tensor extension, which it reads without parsing text
# (gateway/fastpath/json_body.py; same answers); false: the JSON is forwarded as sent.
GATEWAY_TRANSCODE_JSON = env_bool("GATEWAY_TRANSCODE_JSON", True)
# The JSON fast path (gateway/fastpath/: numpy depth check, simdjson, transcoding); false: its plain reference
# (gateway/fastpath/reference.py: a regex depth check, json.loads, JSON forwarded as sent), same answers, more CPU.
GATEWAY_JSON_FAST_PATH = env_bool("GATEWAY_JSON_FAST_PATH", True)
# What an inference request's body may cost the web process (gateway/bodies.py, docs/security.md "What a request
# body costs"). JSON (a JSON body after inflating, or a binary request's JSON header) past this many bytes is refused
# with 413 pointing at the binary tensor extension: parsing JSON takes about 14 bytes of memory per byte of it.
GATEWAY_MAX_JSON_BYTES = env_int("GATEWAY_MAX_JSON_BYTES", 16 * 1024**2, minimum=1024)
# JSON that a shared pool's Triton would parse itself (what the gateway did not transcode to binary) past this: 413.
GATEWAY_MAX_POOL_JSON_BYTES = env_int("GATEWAY_MAX_POOL_JSON_BYTES", 2 * 1024**2, minimum=1024)
# A compressed body may inflate to at most this many times the compressed bytes received (1 MB is always allowed).
GATEWAY_MAX_INFLATE_RATIO = env_int("GATEWAY_MAX_INFLATE_RATIO", 32, minimum=1)
# JSON over 512 KB is checked in this many processes of the web process's own (0: in threads of it, where simdjson's
# parse holds every other request up), at most GATEWAY_JSON_PARSE_BYTES_IN_FLIGHT of it at once (at least
# GATEWAY_MAX_JSON_BYTES): the parsers' memory is about 14 times that.
GATEWAY_JSON_PARSE_PROCESSES = env_int("GATEWAY_JSON_PARSE_PROCESSES", 2, minimum=0)
GATEWAY_JSON_PARSE_BYTES_IN_FLIGHT = env_int("GATEWAY_JSON_PARSE_BYTES_IN_FLIGHT", 32 * 1024**2, minimum=1024)
# Request bodies on Django's paths are refused past this many bytes before Django reads (and spools) them; the
# largest legitimate one is a multipart model upload. A tus PATCH may carry up to MAX_UPLOAD_SIZE.
MAX_REQUEST_BODY_BYTES = env_int("MAX_REQUEST_BODY_BYTES", MAX_MULTIPART_UPLOAD_SIZE + 1024**2, minimum=1024)
# /metrics names every team's deployments and their traffic: with a token, scrapers must send it; without one it is
# closed (403) unless METRICS_OPEN opens it to anyone who reaches it (a network only operators reach).
METRICS_TOKEN = env_secret("METRICS_TOKEN")
METRICS_OPEN = env_bool("METRICS_OPEN", False)
# In production METRICS_OPEN without METRICS_TOKEN is refused: the system check modelport.E001 stops `migrate`.

# --- REST API ---------------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["accounts.permissions.IsTeamMember"],
    "DEFAULT_SCHEMA_CLASS": "infra.api_schema.AutoSchema",
    "EXCEPTION_HANDLER": "infra.api_errors.exception_handler",
    # DRF's own three, with JSON nesting bounded (modelport/core/json_input.py).
    "DEFAULT_PARSER_CLASSES": ["infra.api_json.BoundedJSONParser", "rest_framework.parsers.FormParser",
                               "rest_framework.parsers.MultiPartParser"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Modelport API",
    "DESCRIPTION": "Upload, version and deploy models on NVIDIA Triton Inference Server.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI from the installed sidecar package, never a CDN: the portal must work air-gapped.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The schema is exact (infra/api_schema.py, tests/test_schema_fuzz.py): separate request and response
    # components, so that read-only fields are not in request bodies and generated clients type both right.
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "infra.api_schema.add_links",
                             "infra.api_schema.refuse_unknown_properties"],
    "ENUM_NAME_OVERRIDES": {"FormatEnum": "models_registry.models.Format",
                            "ArtifactFormatEnum": "models_registry.api.ARTIFACT_FORMATS",
                            "PipelineFormatEnum": "models_registry.api.PIPELINE_FORMATS",
                            # A tune's fields appear in two components (a tune, and a tune with its applied changes).
                            "TuneStatusEnum": "tuning.models.TuneRun.Status",
                            "TuneSampleEnum": "tuning.models.TuneRun.Sample",
                            # A revision's role in the performance answer, beside a team member's role.
                            "PerformanceRoleEnum": "performance.report.ROLES",
                            # The gateway's statistic in a revision's and in each model's figures: one enum.
                            "PerformanceGatewayStatisticEnum": "performance.report.GATEWAY_STATISTICS",
                            "PerformanceModelStatisticEnum": "performance.report.MODEL_STATISTICS",
                            "RoleEnum": "accounts.models.Membership.Role"},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# --- Accounts: API tokens, sign-in throttling, /metrics -------------------------------------------------------
# The longest lifetime of a new API token, in days; a token created without an expiry gets this one. 0: no maximum.
API_TOKEN_MAX_LIFETIME_DAYS = env_int("API_TOKEN_MAX_LIFETIME_DAYS", 365, minimum=0)
# Sign-in (the portal's and the admin's) is refused with 429 for what is left of SIGN_IN_LOCKOUT_SECONDS once, within
# that time, an address has had ..._PER_ADDRESS attempts (any usernames), an account at one address (or from one
# browser that signed in to it before) ..._PER_ACCOUNT_AND_ADDRESS failures, or an account ..._PER_ACCOUNT failures
# from browsers that never signed in to it (many addresses: a bound on distributed guessing that spares the user's
# own browsers). accounts/signin.py; docs/security.md, "Sign-in throttling".
SIGN_IN_MAX_FAILURES_PER_ACCOUNT_AND_ADDRESS = env_int("SIGN_IN_MAX_FAILURES_PER_ACCOUNT_AND_ADDRESS", 5, minimum=1)
SIGN_IN_MAX_FAILURES_PER_ACCOUNT = env_int("SIGN_IN_MAX_FAILURES_PER_ACCOUNT", 50, minimum=1)
SIGN_IN_MAX_FAILURES_PER_ADDRESS = env_int("SIGN_IN_MAX_FAILURES_PER_ADDRESS", 30, minimum=1)
SIGN_IN_LOCKOUT_SECONDS = env_int("SIGN_IN_LOCKOUT_SECONDS", 900, minimum=1)
# Reverse proxies (ingress, load balancer) in front of the portal that append the client to X-Forwarded-For:
# the client's address is the entry this far from the right. 0: the TCP peer's address (REMOTE_ADDR).
NUM_PROXIES = env_int("NUM_PROXIES", 0, minimum=0)

# --- gRPC inference gateway (manage.py grpc_gateway, started by bin/run-portal) ----------------------------------
# Triton's gRPC protocol for tritonclient.grpc, with the HTTP gateway's access rules, limits and statistics. The
# port it listens on (8001, beside the portal's 8000, as Triton's own ports are); 0: bin/run-portal does not start it.
GATEWAY_GRPC_PORT = env_int("GATEWAY_GRPC_PORT", 8001, minimum=0)
# The address programs connect to, for the deployment page's snippet ("grpc.modelport.example.com:443" behind an
# ingress); empty: the page's own host name with GATEWAY_GRPC_PORT.
GATEWAY_GRPC_PUBLIC_ADDRESS = env_str("GATEWAY_GRPC_PUBLIC_ADDRESS", "")
# Its Prometheus counters are its own process's: GET /metrics on this port (behind METRICS_TOKEN); 0: not served.
GATEWAY_GRPC_METRICS_PORT = env_int("GATEWAY_GRPC_METRICS_PORT", 0, minimum=0)

# --- Slow and greedy clients (docs/security.md, "Slow clients") ----------------------------------------------------
# The web server (uvicorn with portal/web_server.py's protocol): a request's head (request line and headers) must
# arrive whole within this many seconds of its first byte (or of the connection's opening), else 408 and closed.
WEB_HEADER_TIMEOUT_SECONDS = env_float("WEB_HEADER_TIMEOUT_SECONDS", 10.0, minimum=0.1)
# A request body from which nothing arrives for this long (while the server is ready to read it) is answered 408.
WEB_BODY_TIMEOUT_SECONDS = env_float("WEB_BODY_TIMEOUT_SECONDS", 60.0, minimum=0.1)
# Open connections per client address (an IPv6 client's /64), and in all, per web process; past the first a new
# connection is answered 429 and closed; at the total it takes the place of the connection idle longest (a half-sent
# head, a kept-alive one), and only when none is idle is it answered 503. Behind a reverse proxy every client is the
# proxy's address: raise the first to the proxy's own connection count and cap per client there.
WEB_MAX_CONNECTIONS_PER_CLIENT = env_int("WEB_MAX_CONNECTIONS_PER_CLIENT", 256, minimum=1)
WEB_MAX_CONNECTIONS = env_int("WEB_MAX_CONNECTIONS", 10000, minimum=1)
# A request answered before its body was read (401, 404, 413): the rest of the body is read and dropped so that the
# client can read the answer, on the same connection when at most WEB_DRAIN_BYTES are left, else for at most
# WEB_LINGER_SECONDS and WEB_DRAIN_BYTES after the answer, before the connection is closed.
WEB_LINGER_SECONDS = env_float("WEB_LINGER_SECONDS", 10.0, minimum=0)
WEB_DRAIN_BYTES = env_int("WEB_DRAIN_BYTES", 64 * 1024**2, minimum=0)
# The gRPC gateway: a connection that has not finished its HTTP/2 handshake (preface and settings) within this many
# seconds is closed; one without calls for GATEWAY_GRPC_IDLE_SECONDS is sent GOAWAY and closed (clients reconnect
# when needed); past GATEWAY_GRPC_MAX_CONNECTIONS the connections idle longest are closed for new ones
# (gateway/grpc_connections.py), and gRPC core refuses new connections at twice it.
GATEWAY_GRPC_HANDSHAKE_TIMEOUT_SECONDS = env_float("GATEWAY_GRPC_HANDSHAKE_TIMEOUT_SECONDS", 10.0, minimum=0.1)
GATEWAY_GRPC_IDLE_SECONDS = env_float("GATEWAY_GRPC_IDLE_SECONDS", 300.0, minimum=1)
GATEWAY_GRPC_MAX_CONNECTIONS = env_int("GATEWAY_GRPC_MAX_CONNECTIONS", 10000, minimum=1)
