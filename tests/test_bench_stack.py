"""The benchmarks' throwaway portal (bench/stack.py) waits for its deployments to be gone before it stops the
worker: a DELETE only asks the worker to stop a deployment's Triton, which runs detached (in its sandbox) and would
outlive the bench. No portal runs here: manage.py's answers are played back."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import stack as bench_stack
from bench.stack import Stack, wait_deleted


class _Played(Stack):
    def __init__(self, counts: list[int]) -> None:
        super().__init__(var_dir=Path("/nonexistent"), url="http://127.0.0.1:1", token="")
        self.counts = counts
        self.calls = 0

    def manage(self, *args: str) -> str:
        assert args[:2] == ("shell", "-c") and "Deployment.objects.count()" in args[2]
        self.calls += 1
        return f"some warning\n{self.counts.pop(0) if self.counts else 1}\n"


def test_it_waits_until_the_worker_has_removed_every_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_stack.time, "sleep", lambda _: None)
    stack = _Played([3, 1, 0, 5])
    wait_deleted(stack)
    assert stack.calls == 3  # stopped asking once none was left


def test_it_gives_up_after_the_timeout_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    clock = iter(range(0, 1000, 10))
    monkeypatch.setattr(bench_stack.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(bench_stack.time, "sleep", lambda _: None)
    stack = _Played([])
    wait_deleted(stack, timeout=30)
    assert 1 <= stack.calls <= 3
    assert "deployments still stopping after 30 s" in capsys.readouterr().err
