"""The progress line appears on a terminal (and only there), with stages and elapsed time."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time

import pytest

from tests.test_store_concurrency import big_trace


def run_on_terminal(args: list[str], env: dict) -> str:
    """Run a command with stdout and stderr on a pseudo-terminal; return what it printed."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, stdout=follower, stderr=follower, env=env, close_fds=True)
    os.close(follower)
    chunks = []
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


def test_progress_on_a_terminal(tmp_path):
    trace = big_trace(tmp_path / "rank0.json", 60_000, 0)
    env = dict(os.environ, STALLSCOPE_STORE=str(tmp_path / "store"))
    out = run_on_terminal([sys.executable, "-m", "stallscope.cli", "ingest", str(trace)], env)
    assert "[--------------------] 0/1 parsing" in out
    assert "writing" in out and "s)" in out
    lines = [line for line in out.splitlines() if line.strip()]
    assert any(line.startswith("ingested: job ") for line in lines)
    assert "analyzing" in out  # then the job is analyzed and its report stored (report_store)
    assert lines[-1].startswith("report of job ")


@pytest.mark.parametrize("command", ["analyze", "ingest"])
def test_a_refused_file_leaves_only_its_error_on_the_terminal(tmp_path, command):
    """`analyze FILE` or `ingest FILE` past --max-memory-mb: the worker is killed mid-parse with its progress
    line drawn; the line is blanked before the one-line error, so the terminal shows the
    error and nothing of the bar."""
    from tests.hostile.make_hostile import _kineto

    path = _kineto(kernels=20_000).write(tmp_path / "big.pt.trace.json")
    env = dict(os.environ, STALLSCOPE_STORE=str(tmp_path / "store"))
    args = [sys.executable, "-m", "stallscope.cli", command, "--max-memory-mb", "60", str(path)]
    out = run_on_terminal(args, env)
    (line,) = [x for x in out.replace("\r\n", "\n").split("\n") if "stallscope: error:" in x]
    *drawn, shown = line.split("\r")
    assert shown.startswith("stallscope: error: ingest needed more than the 60 MiB"), shown
    assert "[" in "".join(drawn), "no progress was drawn: the test shows nothing"
    assert drawn[-1].strip() == "" and len(drawn[-1]) >= max(len(x) for x in drawn), drawn[-2:]
