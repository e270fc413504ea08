from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path
from django.views.generic import RedirectView

from accounts.signin import throttled
from web import tune_views, views

urlpatterns = [
    path("login/", throttled(auth_views.LoginView.as_view(redirect_authenticated_user=True)), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("team/", views.switch_team, name="switch-team"),
    path("", views.dashboard, name="dashboard"),
    path("dashboard/live/", views.dashboard_live, name="dashboard-live"),
    path("models/", views.models_list, name="models"),
    # Before <name>/: a model named "upload" is reached through the API (and the admin) only.
    path("models/upload/", views.upload, name="upload"),
    # Where a newcomer types it; temporary, so that the page may move without browsers remembering this.
    path("upload/", RedirectView.as_view(pattern_name="upload", query_string=True)),
    path("models/upload/pipeline/", views.pipeline_new, name="pipeline-new"),
    path("models/upload/import/", views.upload_import, name="upload-import"),
    path("models/<str:name>/", views.model_detail, name="model-detail"),
    path("models/<str:name>/versions/", views.model_versions, name="model-versions"),
    path("models/<str:name>/delete/", views.model_delete, name="model-delete"),
    path("models/<str:name>/versions/<int:number>/cancel/", views.version_cancel, name="version-cancel"),
    path("deployments/new/", views.deployment_new, name="deployment-new"),
    path("deployments/<str:name>/", views.deployment_detail, name="deployment-detail"),
    path("deployments/<str:name>/edit/", views.deployment_edit, name="deployment-edit"),
    path("deployments/<str:name>/live/", views.deployment_live, name="deployment-live"),
    path("deployments/<str:name>/logs/", views.deployment_logs, name="deployment-logs"),
    path("deployments/<str:name>/stop/", views.deployment_stop, name="deployment-stop"),
    path("deployments/<str:name>/start/", views.deployment_start, name="deployment-start"),
    path("deployments/<str:name>/promote/", views.deployment_promote, name="deployment-promote"),
    path("deployments/<str:name>/rollback/", views.deployment_rollback, name="deployment-rollback"),
    path("deployments/<str:name>/delete/", views.deployment_delete, name="deployment-delete"),
    path("deployments/<str:name>/tune/", tune_views.deployment_tune, name="deployment-tune"),
    path("deployments/<str:name>/tunes/<int:tune_id>/apply/", tune_views.deployment_tune_apply,
         name="deployment-tune-apply"),
    path("deployments/<str:name>/tunes/<int:tune_id>/cancel/", tune_views.deployment_tune_cancel,
         name="deployment-tune-cancel"),
    path("samples/deploy/", views.sample_deploy, name="sample-deploy"),
    path("samples/digit.png", views.sample_digit, name="sample-digit"),
    path("samples/<str:which>/", views.sample_progress, name="sample-progress"),
    path("tokens/", views.tokens, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.token_revoke, name="token-revoke"),
]
