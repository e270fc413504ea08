"""Bounded log reads (deployments/logtail.py) and the local Triton's log keeper: a model that writes one line of
hundreds of MiB without a newline costs a reader at most the cap, and the disk at most TRITON_LOG_MAX_BYTES."""

from __future__ import annotations

import os
import time
import tracemalloc
from pathlib import Path

from deployments import logtail
from deployments.runtimes.local import logkeeper, serverlog
from deployments.runtimes.local import triton as lt

MiB = 1024**2


def giant_line_log(path: Path, size: int = 6 * MiB) -> Path:
    """A log of a few lines, then one line of `size` bytes with no newline (the 300 MiB bomb, smaller)."""
    with open(path, "wb") as f:
        f.write(b"I0101 00:00:00.000000 1 server.cc:1] started\n")
        block = b"x" * MiB
        for _ in range(size // MiB):
            f.write(block)
    return path


def test_a_giant_line_without_a_newline_is_read_within_the_cap_with_a_marker(tmp_path: Path) -> None:
    log = giant_line_log(tmp_path / "triton.log")
    tracemalloc.start()
    try:
        text = logtail.read_tail([log], 1, max_bytes=MiB, line_max=16 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(text.encode()) <= 16 * 1024 + 100
    assert text.startswith("x" * 16 * 1024)
    assert text.endswith(logtail.cut_marker(MiB - 16 * 1024, more=True))  # the line began before the MiB read
    # Memory: what was read (1 MiB) and its pieces, not the 6 MiB file.
    assert peak < 4 * MiB


def test_it_returns_the_last_lines_and_cuts_each_long_one_with_the_number_of_bytes_cut(tmp_path: Path) -> None:
    log = tmp_path / "triton.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(1000)) + b"y" * 5000 + b"\nlast\n")
    text = logtail.read_tail([log], 3, max_bytes=MiB, line_max=1000)
    assert text == "line 999\n" + "y" * 1000 + logtail.cut_marker(4000) + "\nlast\n"
    assert logtail.cut_marker(4000) == "… (4,000 bytes cut)"


def test_it_reads_the_rotated_file_too_and_never_more_than_the_bytes_asked_for(tmp_path: Path) -> None:
    current = tmp_path / "triton.log"
    rotated = tmp_path / "triton.log.1"
    rotated.write_bytes(b"".join(b"old %d\n" % i for i in range(100)))
    current.write_bytes(b"new 0\nnew 1\n")
    assert serverlog.log_files(current) == [rotated, current]
    assert serverlog.tail_log(current, 3) == "old 99\nnew 0\nnew 1\n"
    # 20 bytes from the end: the older file's line that began before them is left out, not shown half.
    assert logtail.read_tail([rotated, current], 100, max_bytes=20) == "old 99\nnew 0\nnew 1\n"


def test_control_characters_a_model_prints_never_reach_a_terminal(tmp_path: Path) -> None:
    log = tmp_path / "triton.log"
    log.write_bytes(b"\x1b]0;owned\x07\x1b[2J tab\there\r\n\x00\x9b\n")
    assert logtail.read_tail([log], 10) == "\ufffd]0;owned\ufffd\ufffd[2J tab\there\n\ufffd\ufffd\n"


def test_a_line_separator_a_model_prints_starts_no_line(tmp_path: Path) -> None:
    # str.splitlines() breaks at U+2028/U+2029: in a pool's log, another team's tensor name printed by onnxruntime
    # could otherwise start a line that reads as Triton's own about this deployment's model.
    log = tmp_path / "triton.log"
    forged = 'W onnxruntime: w\u2028I1201 14:45:15.484194 1 model.cc:1] "d7-r1-digits failed"\u2029x\n'
    log.write_bytes(forged.encode())
    text = logtail.read_tail([log], 10)
    assert len(text.splitlines()) == 1
    assert text == forged.replace("\u2028", "\ufffd").replace("\u2029", "\ufffd")


def test_a_missing_log_and_an_empty_one_read_as_nothing(tmp_path: Path) -> None:
    (tmp_path / "empty.log").write_bytes(b"")
    assert logtail.read_tail([tmp_path / "nothing.log"], 10) == ""
    assert logtail.read_tail([tmp_path / "empty.log"], 10) == ""


def test_tritons_errors_are_read_from_the_tail_and_cut(tmp_path: Path) -> None:
    log = tmp_path / "triton.log"
    with open(log, "wb") as f:
        f.write(b"E0101 00:00:00.000000 1 model.py:1] " + b"e" * (3 * MiB) + b"\n")
        f.write(b"error: creating server: Internal - failed to load all models\n")
    errors = serverlog.log_errors(log, max_bytes=MiB, line_max=2000)
    assert errors == ["error: creating server: Internal - failed to load all models"]  # the giant one began earlier
    log.write_bytes(b"E0101 00:00:00.000000 1 model.py:1] " + b"e" * (3 * MiB) + b"\n")
    [error] = serverlog.log_errors(log, max_bytes=4 * MiB, line_max=2000)
    assert len(error) < 2100 and error.endswith("bytes cut)")


def test_tail_text_bounds_output_already_in_memory() -> None:
    text = logtail.tail_text(b"a\n" + b"z" * (2 * MiB), 10, max_bytes=MiB, line_max=100)
    assert text == "z" * 100 + logtail.cut_marker(MiB - 100, more=True)


def test_an_excerpt_keeps_the_start_and_says_how_much_was_cut() -> None:
    message = "Revision 3 stopped serving: the Triton process died; restarting it.\n" + "x" * (5 * MiB)
    short = logtail.excerpt(message, 4000)
    assert short.startswith("Revision 3 stopped serving") and len(short) < 4100
    assert short.endswith("bytes cut)")
    assert logtail.excerpt("short\nlines", 4000) == "short\nlines"
    many = logtail.excerpt("\n".join(["line"] * 10_000), 200)
    assert len(many) < 250 and many.endswith(logtail.cut_marker(len("\n".join(["line"] * 10_000)) - 200))


# --- The log keeper ------------------------------------------------------------------------------------------


def test_the_keeper_rotates_within_its_limit_and_keeps_the_newest_bytes(tmp_path: Path) -> None:
    log = tmp_path / "triton.log"
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the writer: 20 MiB without a newline, then a last line
        os.close(read_fd)
        block = b"x" * MiB
        for _ in range(20):
            os.write(write_fd, block)
        os.write(write_fd, b"\nthe end\n")
        os._exit(0)
    os.close(write_fd)
    logkeeper.keep(read_fd, str(log), 2 * MiB)
    os.close(read_fd)
    os.waitpid(pid, 0)
    assert _size_on_disk(log) <= 2 * MiB
    assert serverlog.tail_log(log, 1) == "the end\n"


def test_the_keeper_never_blocks_the_server_past_its_limit_nor_when_its_directory_is_gone(tmp_path: Path) -> None:
    """A full pipe would stall Triton and the models in their writes: 64 MiB through a keeper limited to 1 MiB
    (whose log directory is removed half-way) must flow at the speed of a pipe, and the disk keep at most 1 MiB."""
    directory = tmp_path / "r1"
    directory.mkdir()
    log = directory / "triton.log"
    started = time.monotonic()
    with serverlog.log_writer(log, MiB) as writer:
        block = b"y" * MiB
        for i in range(64):
            writer.write(block)
            if i == 8:
                assert _size_on_disk(log) <= MiB
            if i == 32:
                # The keeper may rotate (and so create a file) between the unlinks and the rmdir: try again.
                for _ in range(50):
                    for path in serverlog.log_files(log):
                        path.unlink(missing_ok=True)
                    try:
                        directory.rmdir()
                        break
                    except OSError:
                        time.sleep(0.01)
                assert not directory.exists()
    seconds = time.monotonic() - started
    keeper = serverlog._keepers[-1]
    assert keeper.wait(timeout=10) == 0  # it ends once every writer closed the pipe
    assert seconds < 20, f"64 MiB took {seconds:.1f} s: the keeper held the writer up"
    assert not directory.exists()
    lt.reap_children()
    assert keeper not in serverlog._keepers


def _size_on_disk(log: Path) -> int:
    """The log's files' bytes now. The keeper rotates while this runs: a file listed may be renamed or removed
    before its stat (an exists() check first only narrows the race), and a file gone is none of the disk's."""
    total = 0
    for path in serverlog.log_files(log):
        try:
            total += path.stat().st_size
        except FileNotFoundError:
            pass
    return total


def ignored_signals(pid: int) -> set[int]:
    """The signals `pid` ignores, from the SigIgn mask of /proc/<pid>/status (bit n-1 for signal n)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask >> (n - 1) & 1}
    return set()


def test_the_keeper_ignores_the_signals_a_terminal_or_a_stopping_portal_sends(tmp_path: Path) -> None:
    import signal

    log = tmp_path / "triton.log"
    with serverlog.log_writer(log, MiB) as writer:
        keeper = serverlog._keepers[-1]
        # Once it ignores them (a signal in the moment before, while the interpreter starts, which a loaded machine
        # makes longer than the 0.3 s this used to wait, would end it as any process).
        wanted = {signal.SIGINT, signal.SIGHUP, signal.SIGTERM}
        deadline = time.monotonic() + 20
        while not wanted <= ignored_signals(keeper.pid):
            assert time.monotonic() < deadline, "the keeper did not come to ignore SIGINT, SIGHUP and SIGTERM"
            time.sleep(0.02)
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            os.kill(keeper.pid, sig)
        writer.write(b"still here\n")
    assert keeper.wait(timeout=10) == 0
    assert log.read_bytes() == b"still here\n"


def test_after_the_server_exits_a_reader_waits_until_its_last_words_are_written(tmp_path: Path) -> None:
    """Triton's last lines (why it failed) may still be in the pipe when it exits: probe() and the death report
    wait for the keeper to write them and end."""
    log = tmp_path / "triton.log"
    with serverlog.log_writer(log, 64 * MiB) as writer:
        writer.write(b"z" * (8 * MiB) + b"\nerror: creating server: Internal - failed to load all models\n")
    assert serverlog.wait_log_written(log, timeout=10) is True
    assert serverlog.tail_log(log, 1) == "error: creating server: Internal - failed to load all models\n"
    assert serverlog.wait_log_written(tmp_path / "other.log", timeout=0) is True  # no keeper of it: nothing to wait for
