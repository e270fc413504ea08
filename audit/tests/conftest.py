from deployments.tests.conftest import digits_v1  # noqa: F401 - shared fixture
