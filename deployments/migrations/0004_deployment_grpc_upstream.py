from __future__ import annotations

from typing import Any

from django.db import migrations, models


def fill_grpc_upstream(apps: Any, schema_editor: Any) -> None:
    """Deployments serving before the gRPC gateway existed get their server's gRPC endpoint now, so that they need
    no restart: a local server's from its TritonServer row, a Kubernetes Service's from its HTTP address (the
    manifests have always exposed gRPC on port 8001 beside HTTP on 8000)."""
    Deployment = apps.get_model("deployments", "Deployment")
    TritonServer = apps.get_model("deployments", "TritonServer")
    for deployment in Deployment.objects.exclude(upstream_url="").filter(grpc_upstream=""):
        target = ""
        if deployment.runtime == "local":
            for server in TritonServer.objects.filter(revision_id=deployment.serving_revision_id, state="ready"):
                if deployment.upstream_url == f"http://127.0.0.1:{server.http_port}":
                    target = f"127.0.0.1:{server.grpc_port}"
        elif deployment.upstream_url.startswith("http://") and deployment.upstream_url.endswith(":8000"):
            target = deployment.upstream_url.removeprefix("http://").removesuffix(":8000") + ":8001"
        if target:
            Deployment.objects.filter(pk=deployment.pk).update(grpc_upstream=target)


class Migration(migrations.Migration):

    dependencies = [
        ("deployments", "0003_merge_sandbox_and_reconcile_queue"),
    ]

    operations = [
        migrations.AddField(
            model_name="deployment",
            name="grpc_upstream",
            field=models.CharField(blank=True, max_length=255),
        ),
        migrations.RunPython(fill_grpc_upstream, migrations.RunPython.noop),
    ]
