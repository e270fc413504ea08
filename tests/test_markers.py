"""An unmarked test that starts Triton, a worker or a browser fails loudly, naming the marker to add; marked, it
goes ahead (tests/markers.py). Each case is a tiny test file run by pytester in this process, with Django already
set up by this session (so `-p no:django`)."""

from __future__ import annotations

import pytest

ARGS = ("-p", "tests.markers", "-p", "no:django", "-p", "no:cacheprovider", "-W",
        "ignore::pytest.PytestUnknownMarkWarning")


def run(pytester: pytest.Pytester, source: str) -> pytest.RunResult:
    pytester.makepyfile(test_generated=source)
    return pytester.runpytest_inprocess(*ARGS)


def test_an_unmarked_test_that_starts_a_worker_fails_naming_the_marker(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
        from tests import processes

        def test_it(tmp_path):
            processes.start_worker(tmp_path / "worker.log")
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_generated.py::test_it starts a real Celery worker but is not marked "
                                 "@pytest.mark.worker: add the marker*"])


def test_an_unmarked_test_that_starts_triton_fails_before_anything_starts(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
        from deployments.runtimes.local import triton

        def test_it(tmp_path):
            triton.start_server(tmp_path, tmp_path / "triton.log", None, tmp_path)
    """)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_it starts a real Triton server but is not marked @pytest.mark.triton*"])
    assert not (pytester.path / "triton.log").exists()


def test_the_runtime_itself_is_refused_too_and_a_marked_test_is_not(pytester: pytest.Pytester) -> None:
    """The guard replaces the one function every Triton start goes through; with the marker the real one is left."""
    result = run(pytester, """
        import pytest
        from deployments.runtimes.local import triton

        REAL = triton.start_server

        def test_unmarked():
            assert triton.start_server is not REAL

        @pytest.mark.triton
        def test_marked():
            assert triton.start_server is REAL
    """)
    result.assert_outcomes(passed=2)


def test_an_unmarked_browser_is_refused_and_the_marked_one_allowed(pytester: pytest.Pytester) -> None:
    result = run(pytester, """
        import pytest
        from tests.markers import require

        def test_unmarked():
            require("browser", "drives a real browser")

        @pytest.mark.browser
        def test_marked():
            require("browser", "drives a real browser")
    """)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_unmarked drives a real browser but is not marked @pytest.mark.browser*"])
