"""The registry's tests' fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from models_registry.models import Model
from models_registry.sample_models import textgen
from tests.support.people import Person


@pytest.fixture
def digits_model(alice: Person) -> Model:
    """alice's model "digits" with no versions yet (`digits`, in the root conftest.py, is a ready version)."""
    return Model.objects.create(team=alice.team, name="digits", created_by=alice.user)


@pytest.fixture(scope="module")
def textgen_model() -> textgen.CharModel:
    """The sample text generator trained as `make samples` trains it (half a second), once per test module."""
    from models_registry.samples import train_textgen

    return textgen.CharModel(textgen.load_counts(train_textgen().weights))


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3-compatible server over HTTP on 127.0.0.1, once per test module (the storage and import tests)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
