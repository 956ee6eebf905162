"""Nexus settings: every value comes from the environment, with an embedded default."""

from __future__ import annotations

from pathlib import Path

import dj_database_url

from nexus.env import (
    bundled_redis_socket,
    data_dir,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_str,
    persistent_secret,
    private_sqlite,
)

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = data_dir()

SECRET_KEY = env_str("NEXUS_SECRET_KEY", "") or persistent_secret(DATA_DIR / "secret_key")
DEBUG = env_bool("NEXUS_DEBUG", False)
NEXUS_HOST = env_str("NEXUS_HOST", "127.0.0.1")
NEXUS_PORT = env_int("NEXUS_PORT", 8000, minimum=1)
# Where agents reach this controller (to copy model folders onto their nodes).
NEXUS_CONTROLLER_URL = env_str("NEXUS_CONTROLLER_URL", f"http://{NEXUS_HOST}:{NEXUS_PORT}")
ALLOWED_HOSTS = env_list("NEXUS_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", NEXUS_HOST])
CSRF_TRUSTED_ORIGINS = env_list("NEXUS_CSRF_TRUSTED_ORIGINS", [])

# Not "daphne": its app only puts daphne behind runserver (Nexus starts daphne itself) and
# imports Twisted into every process, the Celery workers and the history writer included (0.3 s
# of each start).
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Django's widget templates, for the kit's form renderer (FORM_RENDERER below).
    "django.forms",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "channels",
    "nexus",
    "nodes",
    "pools",
    "deployments",
    "serving",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # After MessageMiddleware: messages of htmx requests leave as toasts (docs/ui.md).
    "nexus.ui.middleware.HtmxMessagesMiddleware",
]

ROOT_URLCONF = "nexus.urls"
ASGI_APPLICATION = "nexus.asgi.application"
WSGI_APPLICATION = None

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

# Every {{ form }} renders with the console kit's templates (templates/ui/forms/).
FORM_RENDERER = "nexus.ui.forms.FormRenderer"

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", f"sqlite:///{DATA_DIR / 'nexus.sqlite3'}"),
        conn_max_age=env_int("NEXUS_DB_CONN_MAX_AGE", 0, minimum=0),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    if DATABASES["default"]["NAME"] not in ("", ":memory:"):
        private_sqlite(Path(DATABASES["default"]["NAME"]))
    # A file, not memory, so that live servers started by the tests share the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        "transaction_mode": "IMMEDIATE",
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "static"

# Messages on the server: the admin shows a new token's secret once through a message.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "pools:list"
LOGOUT_REDIRECT_URL = "login"

# Redis: the bundled server on a Unix socket under the data dir unless REDIS_URL is set.
REDIS_URL = env_str("REDIS_URL", "")
NEXUS_BUNDLED_REDIS = REDIS_URL == ""
if NEXUS_BUNDLED_REDIS:
    REDIS_URL = f"unix://{bundled_redis_socket(DATA_DIR)}"
NEXUS_REDIS_PREFIX = env_str("NEXUS_REDIS_PREFIX", "nexus")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # Bounded, so that an unreachable Redis cannot stall a save that pushes to pages. A
            # consumer's receive blocks on Redis for up to 5 s (channels_redis' brpop_timeout):
            # a read timeout below that closed every live page's socket after 2 s of quiet.
            "hosts": [{"address": REDIS_URL, "socket_connect_timeout": 2, "socket_timeout": 10}],
            "prefix": f"{NEXUS_REDIS_PREFIX}:channels",
        },
    }
}

# Celery speaks redis+socket:// for Unix sockets where redis-py says unix://.
CELERY_BROKER_URL = REDIS_URL.replace("unix://", "redis+socket://", 1)
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_DEFAULT_QUEUE = f"{NEXUS_REDIS_PREFIX}"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
# Nodes: how often the fleet is refreshed (status, inventory); a node that misses one is offline.
NEXUS_NODE_REFRESH_S = env_int("NEXUS_NODE_REFRESH_S", 10, minimum=1)
NEXUS_AGENT_TIMEOUT_S = env_int("NEXUS_AGENT_TIMEOUT_S", 5, minimum=1)
# `make run` starts a local agent on this loopback port.
NEXUS_AGENT_PORT = env_int("NEXUS_AGENT_PORT", 7100, minimum=1)
# Model serving: how often replicas are reconciled (placed, started, rolled out, replaced) and
# due health probes are sent. Probe timing itself follows each service's health check.
NEXUS_SERVING_TICK_S = env_float("NEXUS_SERVING_TICK_S", 1.0, minimum=0.2)
# Autoscaling: every rule is evaluated this often (docs/autoscaling.md); Prometheus rules query
# this server's HTTP API (empty: none configured, such rules have no data).
NEXUS_AUTOSCALING_INTERVAL_S = env_float("NEXUS_AUTOSCALING_INTERVAL_S", 10.0, minimum=1.0)
NEXUS_PROMETHEUS_URL = env_str("NEXUS_PROMETHEUS_URL", "")
# The model store lists the model folders of this project ("" turns the store off); its seed
# cards are written after every migrate unless NEXUS_MODEL_STORE_SEED is off (docs/model-store.md).
NEXUS_MODEL_STORE_PROJECT = env_str("NEXUS_MODEL_STORE_PROJECT", "model-store")
NEXUS_MODEL_STORE_SEED = env_bool("NEXUS_MODEL_STORE_SEED", True)
# The one beat schedule table: every row expires just before its next run.
CELERY_BEAT_SCHEDULE = {
    "worker-heartbeat": {
        "task": "nexus.tasks.heartbeat",
        "schedule": 10.0,
        "options": {"expires": 9.0},
    },
    "nodes-refresh": {
        "task": "nodes.tasks.refresh_nodes",
        "schedule": float(NEXUS_NODE_REFRESH_S),
        "options": {"expires": NEXUS_NODE_REFRESH_S * 0.9},
    },
    "serving-reconcile": {
        "task": "serving.tasks.reconcile",
        "schedule": NEXUS_SERVING_TICK_S,
        "options": {"expires": NEXUS_SERVING_TICK_S * 0.9},
    },
    "serving-probe": {
        "task": "serving.tasks.probe_routes",
        "schedule": NEXUS_SERVING_TICK_S,
        "options": {"expires": NEXUS_SERVING_TICK_S * 0.9},
    },
    # A request held for a service scaled to zero is seen within a tick.
    "serving-wake": {
        "task": "serving.tasks.wake",
        "schedule": NEXUS_SERVING_TICK_S,
        "options": {"expires": NEXUS_SERVING_TICK_S * 0.9},
    },
    "serving-autoscale": {
        "task": "serving.tasks.autoscale",
        "schedule": NEXUS_AUTOSCALING_INTERVAL_S,
        "options": {"expires": NEXUS_AUTOSCALING_INTERVAL_S * 0.9},
    },
    "pools-prune-history": {
        "task": "pools.tasks.prune_history",
        "schedule": 300.0,
        "options": {"expires": 290.0},
    },
    # Deployment rows whose worker died or restarted are followed again by another.
    "deployments-resume-stalled": {
        "task": "deployments.tasks.resume_stalled",
        "schedule": 30.0,
        "options": {"expires": 27.0},
    },
}

REST_FRAMEWORK = {
    # Token first: its WWW-Authenticate header makes anonymous calls 401, not 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "nexus.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["nexus.auth.StaffWritesAuthenticatedReads"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Nexus API",
    "DESCRIPTION": "Administer pools, targets and client tokens.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # One name for the request-kind choices used by targets, dry runs and history.
    "ENUM_NAME_OVERRIDES": {
        "RequestKindEnum": "pools.models.RequestKind",
        "TokenKindEnum": "nexus.models.TOKEN_KINDS",
        "AdminAccessEnum": "nexus.models.ADMIN_ACCESS",
        "TrialStateEnum": "serving.models.TrialState",
        "TargetStateEnum": "pools.models.TARGET_STATES",
        "RoutingOutcomeEnum": "pools.models.RoutingOutcome",
        "ScaleOutcomeEnum": "serving.models.SCALE_OUTCOMES",
    },
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

# The gateway (hot path): body bound, upstream timeouts, snapshot refresh.
NEXUS_MAX_BODY_BYTES = env_int("NEXUS_MAX_BODY_BYTES", 16 * 1024 * 1024, minimum=1024)
# On SIGTERM/SIGINT, how long requests and streams in flight may go on before they are ended.
NEXUS_SHUTDOWN_GRACE_S = env_float("NEXUS_SHUTDOWN_GRACE_S", 30.0, minimum=0.0)
# Every request (docs/reliability.md): the request target (path and query), the header lines
# together, how long the headers may take to arrive (slowloris), and how long a body may go
# without a byte while it is being read (a trickled body; nginx's client_body_timeout).
NEXUS_MAX_URL_BYTES = env_int("NEXUS_MAX_URL_BYTES", 8192, minimum=256)
NEXUS_MAX_HEADER_BYTES = env_int("NEXUS_MAX_HEADER_BYTES", 32768, minimum=1024)
NEXUS_HEADER_TIMEOUT_S = env_float("NEXUS_HEADER_TIMEOUT_S", 10.0, minimum=0.1)
NEXUS_BODY_TIMEOUT_S = env_float("NEXUS_BODY_TIMEOUT_S", 60.0, minimum=0.1)
# Model folders: the largest file one upload may write (bytes); larger ones get 413.
NEXUS_MAX_UPLOAD_BYTES = env_int("NEXUS_MAX_UPLOAD_BYTES", 1 << 30, minimum=1)
NEXUS_UPSTREAM_CONNECT_TIMEOUT_S = env_int("NEXUS_UPSTREAM_CONNECT_TIMEOUT_S", 5, minimum=1)
NEXUS_UPSTREAM_READ_TIMEOUT_S = env_int("NEXUS_UPSTREAM_READ_TIMEOUT_S", 600, minimum=1)
NEXUS_UPSTREAM_MAX_CONNECTIONS = env_int("NEXUS_UPSTREAM_MAX_CONNECTIONS", 1000, minimum=1)
NEXUS_ENCRYPTION_KEY = env_str("NEXUS_ENCRYPTION_KEY", "")
# In-flight counts per target: "auto" shares them through Redis when the operator set REDIS_URL
# (several gateway processes), else keeps them in memory (one embedded process); "memory" or
# "redis" forces one. A lease not renewed for the TTL (its process died) frees its slot.
NEXUS_LEDGER = env_choice("NEXUS_LEDGER", "auto", ("auto", "memory", "redis"))
NEXUS_LEDGER_LEASE_TTL_S = env_int("NEXUS_LEDGER_LEASE_TTL_S", 60, minimum=3)
# /metrics names every pool and target: staff sessions and staff's admin tokens read it (what
# Prometheus scrapes with, docs/access.md); true: anyone (a scraper on a private network).
NEXUS_METRICS_PUBLIC = env_bool("NEXUS_METRICS_PUBLIC", False)
# A line per request from the web server (daphne); off by default: the history already records
# every gateway request, and the line costs CPU on the hot path.
NEXUS_ACCESS_LOG = env_bool("NEXUS_ACCESS_LOG", False)

NEXUS_LOG_LEVEL = env_str("NEXUS_LOG_LEVEL", "INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": NEXUS_LOG_LEVEL},
    "loggers": {
        # daphne logs every request at INFO: too loud for the hot path.
        "django.channels.server": {"level": "WARNING"},
        # httpx logs each upstream request at INFO: a log line per request on the hot path.
        "httpx": {"level": "WARNING"},
    },
}
