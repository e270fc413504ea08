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


def test_the_slow_files_exist_and_the_fast_suite_leaves_them_out() -> None:
    from pathlib import Path

    from tests.slow_files import SLOW_FILES

    root = Path(__file__).resolve().parent.parent
    assert list(SLOW_FILES) == sorted(set(SLOW_FILES))
    assert [name for name in SLOW_FILES if not (root / name).is_file() or not Path(name).name.startswith("test_")] == []
    makefile = (root / "Makefile").read_text().splitlines()
    fast = next(line for line in makefile if "-m pytest -m" in line and "fuzz" in line)
    assert "and not slow" in fast


def test_a_listed_files_tests_are_marked_slow_and_no_other(request: pytest.FixtureRequest) -> None:
    from tests.slow_files import is_slow

    assert is_slow("tests/test_layers.py::test_the_checkout_keeps_its_layers")
    assert is_slow("web/tests/test_admin.py::test_x[a::b]")
    assert not is_slow("tests/test_markers.py::test_a_listed_files_tests_are_marked_slow_and_no_other")
    assert not is_slow("tests/test_layers.py.bak::test_x") and not is_slow("layers.py::test_x")
    # In this run, whatever it collected: the marker follows the list.
    assert all((item.get_closest_marker("slow") is not None) == is_slow(item.nodeid) for item in request.session.items)
