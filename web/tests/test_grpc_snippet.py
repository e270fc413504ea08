"""The deployment page's gRPC snippet (web/grpc_snippet.py): the tritonclient.grpc twin of the Python snippet, with
the gRPC gateway's address and metadata. tests/test_grpc_gateway_e2e.py runs one against the real gateway."""

from __future__ import annotations

from typing import Any

from deployments.models import Deployment
from tests.support.people import Person, signed_in
from web import grpc_snippet, inference

SIGNATURE = {
    "inputs": [{"name": "image", "datatype": "BYTES", "dims": [-1, 1]},
               {"name": "ids", "datatype": "INT64", "dims": [-1, 3]}],
    "outputs": [{"name": "label", "datatype": "FP32", "dims": [-1, 10]}],
}


def test_the_grpc_snippet_builds_the_same_tensors_with_the_grpc_client_and_metadata() -> None:
    http = inference.python_snippet("http://models.example.com", "digits-prod", "digits", SIGNATURE)
    snippet = grpc_snippet.python_grpc_snippet(http, "models.example.com:8001", False, "digits-prod")
    assert "import tritonclient.grpc as grpcclient" in snippet and "httpclient" not in snippet
    assert 'client = grpcclient.InferenceServerClient(url="models.example.com:8001")' in snippet
    assert '"authorization": "Bearer " + os.environ["MODELPORT_TOKEN"]' in snippet
    assert '"modelport-deployment": "digits-prod"' in snippet
    tensors = [line for line in http.splitlines() if "InferInput" in line or "set_data_from_numpy" in line]
    assert len(tensors) == 4
    for line in tensors:
        assert line.replace("httpclient.", "grpcclient.") in snippet
    assert 'result = client.infer("digits", inputs, headers=headers)' in snippet
    compile(snippet, "snippet", "exec")
    tls = grpc_snippet.python_grpc_snippet(http, "grpc.example.com:443", True, "digits-prod")
    assert 'InferenceServerClient(url="grpc.example.com:443", ssl=True)' in tls


def test_the_address_is_the_configured_one_or_the_pages_host_with_the_grpc_port(settings: Any) -> None:
    settings.GATEWAY_GRPC_PUBLIC_ADDRESS = ""
    settings.GATEWAY_GRPC_PORT = 8001
    assert grpc_snippet.public_address("https://models.example.com:8443") == ("models.example.com:8001", False)
    assert grpc_snippet.public_address("http://[::1]:8000") == ("[::1]:8001", False)
    settings.GATEWAY_GRPC_PUBLIC_ADDRESS = "grpc.models.example.com:443"
    assert grpc_snippet.public_address("https://models.example.com") == ("grpc.models.example.com:443", True)
    settings.GATEWAY_GRPC_PUBLIC_ADDRESS = ""
    settings.GATEWAY_GRPC_PORT = 0
    assert grpc_snippet.public_address("https://models.example.com") is None


def test_the_deployment_page_offers_the_grpc_snippet_after_the_python_one(
    alice: Person, deployment: Deployment, settings: Any
) -> None:
    settings.GATEWAY_GRPC_PUBLIC_ADDRESS = ""
    settings.GATEWAY_GRPC_PORT = 8001
    response = signed_in(alice).get("/deployments/digits-prod/")
    [served] = response.context["served"]
    assert [key for _, _, key in served["snippets"]] == ["curl", "python", "grpc", "cli"]
    content = response.content.decode()
    assert "Python (tritonclient.grpc)" in content
    assert 'InferenceServerClient(url=&quot;testserver:8001&quot;)' in content
    assert "&quot;modelport-deployment&quot;: &quot;digits-prod&quot;" in content
    settings.GATEWAY_GRPC_PORT = 0
    [served] = signed_in(alice).get("/deployments/digits-prod/").context["served"]
    assert "grpc" not in [key for _, _, key in served["snippets"]]


DIGITS = {"inputs": [{"name": "input", "datatype": "FP32", "dims": [-1, 64]}],
          "outputs": [{"name": "label", "datatype": "INT64", "dims": [-1, 1]}]}


def sent_by(snippet: str, module: Any, monkeypatch: Any) -> list[Any]:
    """Run a snippet with its client's infer intercepted: the numpy arrays it would send."""
    sent: list[Any] = []

    class Answer:
        def as_numpy(self, name: str) -> str:
            return f"<{name}>"

    def infer(self: Any, model: str, inputs: list[Any], **kwargs: Any) -> Answer:
        sent.extend(inputs)
        return Answer()

    monkeypatch.setattr(module.InferenceServerClient, "__init__", lambda self, *a, **k: None)
    monkeypatch.setattr(module.InferenceServerClient, "infer", infer)
    monkeypatch.setattr(module.InferenceServerClient, "__del__", lambda self: None, raising=False)  # nothing opened
    monkeypatch.setenv("MODELPORT_TOKEN", "mp_test")
    exec(compile(snippet, "snippet", "exec"), {})  # noqa: S102 - the page's own snippet, run as a user would
    return sent


def test_both_python_snippets_send_the_held_out_example_that_try_it_and_curl_send(monkeypatch: Any) -> None:
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    from models_registry.samples import SAMPLE_DIGIT_PIXELS
    from web.sample_data import sample_inputs

    data = sample_inputs(DIGITS)
    request = inference.with_data(inference.example_request(DIGITS), data)
    assert request["inputs"][0]["data"] == [float(v) for v in SAMPLE_DIGIT_PIXELS]
    http = inference.python_snippet("http://models.example.com", "digits", "digits", DIGITS, data)
    grpc = grpc_snippet.python_grpc_snippet(http, "models.example.com:8001", False, "digits")
    assert "np.zeros" not in http
    for snippet, module in ((http, httpclient), (grpc, grpcclient)):
        [tensor] = sent_by(snippet, module, monkeypatch)
        assert tensor.name() == "input" and tensor.shape() == [1, 64] and tensor.datatype() == "FP32"
    # The bytes each client would put on the wire are the example's pixels, as float32.
    expected = np.asarray([SAMPLE_DIGIT_PIXELS], dtype=np.float32)
    [tensor] = sent_by(http, httpclient, monkeypatch)
    assert tensor._get_binary_data() == expected.tobytes()
    [tensor] = sent_by(grpc, grpcclient, monkeypatch)
    assert tensor._get_content() == expected.tobytes()


def test_both_python_snippets_send_the_versions_example_text_for_a_bytes_input(monkeypatch: Any) -> None:
    """A text model uploaded with an example request ("hello world"): the Python snippets send that text, as Try it
    and curl do, not an empty element the model may refuse."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    words = {"inputs": [{"name": "text", "datatype": "BYTES", "dims": [-1, 1]}],
             "outputs": [{"name": "upper", "datatype": "BYTES", "dims": [-1, 1]}]}
    http = inference.python_snippet("http://models.example.com", "words", "words", words, {"text": ["hello world"]})
    grpc = grpc_snippet.python_grpc_snippet(http, "models.example.com:8001", False, "words")
    assert 'b""' not in http
    [tensor] = sent_by(http, httpclient, monkeypatch)
    assert tensor.name() == "text" and tensor.shape() == [1, 1] and tensor.datatype() == "BYTES"
    assert b"hello world" in tensor._get_binary_data()
    [tensor] = sent_by(grpc, grpcclient, monkeypatch)
    assert b"hello world" in tensor._get_content()
    # Without an example the element stays empty (the comment says what to put there).
    assert 'b""' in inference.python_snippet("http://models.example.com", "words", "words", words)
