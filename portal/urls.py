from __future__ import annotations

from django.contrib import admin
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from accounts import api as accounts_api
from accounts.signin import throttled
from audit import api as audit_api
from deployments import api as deployments_api
from deployments import manifests_api, pools_api
from gateway import api as gateway_api
from models_registry import api as registry_api
from models_registry import tus
from performance import api as performance_api
from portal.errors import DATABASE_DOWN
from tuning import api as tuning_api


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness and readiness: this process answers. A database outage is reported, not failed on: restarting or
    unrouting the web processes would not bring the database back, and their gateway keeps serving from its cache."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DATABASE_DOWN:
        return JsonResponse({"status": "ok", "database": "unavailable"})
    return JsonResponse({"status": "ok", "database": "ok"})


api_v1 = [
    path("api/v1/me/", accounts_api.me),
    path("api/v1/tokens/", accounts_api.tokens_list),
    path("api/v1/tokens/<int:token_id>/", accounts_api.token_detail),
    path("api/v1/models/", registry_api.models_list),
    path("api/v1/models/<str:name>/", registry_api.model_detail),
    path("api/v1/models/<str:name>/versions/", registry_api.versions_list),
    path("api/v1/models/<str:name>/versions/<int:number>/", registry_api.version_detail),
    path("api/v1/models/<str:name>/versions/<int:number>/cancel/", registry_api.version_cancel),
    path("api/v1/uploads/", tus.UploadCreateView.as_view()),
    path("api/v1/uploads/<str:upload_id>", tus.UploadDetailView.as_view()),
    path("api/v1/uploads/<str:upload_id>/", tus.UploadDetailView.as_view()),
    path("api/v1/pools/", pools_api.pools_list),
    path("api/v1/deployments/", deployments_api.deployments_list),
    path("api/v1/deployments/<str:name>/", deployments_api.deployment_detail),
    path("api/v1/deployments/<str:name>/stop", deployments_api.deployment_stop),
    path("api/v1/deployments/<str:name>/start", deployments_api.deployment_start),
    path("api/v1/deployments/<str:name>/promote", deployments_api.deployment_promote),
    path("api/v1/deployments/<str:name>/rollback", deployments_api.deployment_rollback),
    path("api/v1/deployments/<str:name>/events/", deployments_api.deployment_events),
    path("api/v1/deployments/<str:name>/logs/", deployments_api.deployment_logs),
    path("api/v1/deployments/<str:name>/manifests", manifests_api.deployment_manifests),
    path("api/v1/deployments/<str:name>/metrics/", gateway_api.deployment_metrics),
    path("api/v1/deployments/<str:name>/performance/", performance_api.deployment_performance),
    path("api/v1/deployments/<str:name>/tune", tuning_api.tune_create),
    path("api/v1/deployments/<str:name>/tunes/", tuning_api.tune_list),
    path("api/v1/deployments/<str:name>/tunes/<int:tune_id>/", tuning_api.tune_detail),
    path("api/v1/deployments/<str:name>/tunes/<int:tune_id>/apply", tuning_api.tune_apply),
    path("api/v1/deployments/<str:name>/tunes/<int:tune_id>/cancel", tuning_api.tune_cancel),
    path("api/v1/audit/", audit_api.audit_log),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/v1/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]

urlpatterns = [
    path("healthz", healthz),
    path("metrics", gateway_api.prometheus_metrics),
    # The admin's sign-in, throttled like the portal's (accounts/signin.py); before admin/ so that it wins.
    path("admin/login/", throttled(admin.site.login)),
    path("admin/", admin.site.urls),
    *api_v1,
    path("", include("web.urls")),
]

# A JSON error on the API, a plain page elsewhere, 503 while the database is unreachable; never a traceback.
handler500 = "portal.errors.server_error"
# A JSON 404 for API paths that match no URL (infra/api_errors.py), the 404 page elsewhere.
handler404 = "infra.api_errors.page_not_found"
