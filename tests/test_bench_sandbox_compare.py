"""bench/serving/sandbox_compare.py: serving runs sorted by whether their Tritons ran sandboxed (as each run
recorded), compared cell by cell. Results documents are made up for the test."""

from __future__ import annotations

from typing import Any

import pytest

from bench.serving import sandbox_compare


def _document(sandboxed: bool | None, throughput: float, cpu: float, mixed: bool = False) -> dict[str, Any]:
    runs = [{"server": "e-direct", "concurrency": c, "throughput": throughput * c, "p99_ms": 10.0,
             "cpu_ms_per_request": {"triton": cpu}} for c in (1, 8)]
    flags = {"e": sandboxed, "d": (not sandboxed) if mixed else sandboxed}
    return {"workloads": [{"workload": "resnet", "runs": runs, "sandboxed": flags}],
            "machine": {"loadavg_before": ["1"]}, "versions": {"git": "abc"}}


def test_runs_are_sorted_by_what_they_recorded_and_a_mixed_or_unrecorded_run_is_refused() -> None:
    assert sandbox_compare.sandbox_mode(_document(True, 1, 1)) == "on"
    assert sandbox_compare.sandbox_mode(_document(False, 1, 1)) == "off"
    with pytest.raises(ValueError, match="not one sandbox setting"):
        sandbox_compare.sandbox_mode(_document(True, 1, 1, mixed=True))
    with pytest.raises(ValueError, match="none recorded"):
        sandbox_compare.sandbox_mode({"workloads": [{"runs": []}]})


def test_the_table_gives_medians_and_on_off_ratios() -> None:
    documents = [_document(False, 100, 0.5), _document(True, 90, 0.55), _document(False, 120, 0.5),
                 _document(True, 110, 0.45)]
    table = sandbox_compare.table(documents)
    # Medians: off 110/s and 0.5 ms, on 100/s and 0.5 ms at 1 client; 8x the rates at 8 clients.
    assert ("| resnet | e-direct | 1 | 110 (100–120) | 100 (90–110) | 0.91 | 10.0 | 10.0 | 0.500 | 0.500 | 1.00 |"
            in table)
    assert "| resnet | e-direct | 8 | 880 (800–960) | 800 (720–880) | 0.91 |" in table
    assert "throughput 0.91 over 2 cells" in table
    assert "with more than one client 1.00 over 1 cells" in table
