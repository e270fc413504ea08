"""The deployment page's gRPC snippet: the page's tritonclient.http snippet (web/inference.py) turned into its
tritonclient.grpc twin, the same tensors with the gRPC client, the gateway's gRPC address and its two metadata keys.
Derived from the HTTP snippet rather than written twice, so that both always build the same inputs; a test keeps
the derivation honest (web/tests/test_grpc_snippet.py). Plain functions, no Django beyond reading settings."""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings


def public_address(base_url: str) -> tuple[str, bool] | None:
    """Where programs reach the gRPC gateway, and whether over TLS: GATEWAY_GRPC_PUBLIC_ADDRESS (TLS when it is on
    port 443, as behind an ingress), else the page's host name with GATEWAY_GRPC_PORT; None when it is off."""
    configured = settings.GATEWAY_GRPC_PUBLIC_ADDRESS
    if configured:
        return configured, configured.endswith(":443")
    if not settings.GATEWAY_GRPC_PORT:
        return None
    host = urlsplit(base_url).hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{settings.GATEWAY_GRPC_PORT}", False


def python_grpc_snippet(http_snippet: str, address: str, ssl: bool, deployment: str) -> str:
    lines = []
    for line in http_snippet.splitlines():
        if line.startswith("client = "):
            line = f'client = grpcclient.InferenceServerClient(url="{address}"{", ssl=True" if ssl else ""})'
        elif line.startswith("headers = "):
            line = ('# gRPC metadata keys are lower case; the deployment is named in one.\n'
                    'headers = {"authorization": "Bearer " + os.environ["MODELPORT_TOKEN"],\n'
                    f'           "modelport-deployment": "{deployment}"}}')
        else:
            line = line.replace("import tritonclient.http as httpclient", "import tritonclient.grpc as grpcclient")
            line = line.replace("httpclient.", "grpcclient.")
        lines.append(line)
    return "\n".join(lines)
