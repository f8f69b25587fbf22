"""What the benchmark scripts share: timing a whole child process, the runs, the machine.

Imported by ``bench_ingest.py`` and ``bench_nsys.py`` (run as scripts, so this
folder is on ``sys.path``).
"""

from __future__ import annotations

import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path


@dataclass
class Runs:
    """One tool's runs on one input."""

    wall: list[float] = field(default_factory=list)  # seconds
    cpu: list[float] = field(default_factory=list)  # user + system seconds, all threads
    rss_mb: list[float] = field(default_factory=list)  # peak resident set, MB
    inner: list[float] = field(default_factory=list)  # the tool's own timing, if it gives one
    error: str | None = None  # why the tool failed on this input (no timing then)

    def add(self, wall: float, cpu: float, rss_mb: float) -> None:
        self.wall.append(wall)
        self.cpu.append(cpu)
        self.rss_mb.append(rss_mb)

    @property
    def median(self) -> float:
        return statistics.median(self.wall) if self.wall else float("nan")

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu) if self.cpu else float("nan")

    @property
    def peak(self) -> float:
        return max(self.rss_mb) if self.rss_mb else float("nan")


def run_child(cmd: list[str], **kw) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds, peak RSS MB, stdout+stderr) of one child process.

    Peak memory is the larger of the child's own ``ru_maxrss`` and the
    largest sum of PSS (proportional set size: a page shared by n processes
    counts 1/n in each) over the child and all its descendants, sampled every
    20 ms while it has any (Linux): ``ru_maxrss`` alone would hide worker processes, and a sum
    of RSS would count the pages that forked workers share with their parent
    once per process. For a single process this is its ``ru_maxrss``.
    """
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)
    sampler = TreeRssSampler(proc.pid)
    sampler.start()
    output = proc.stdout.read()
    sampler.stop()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    text = output.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{text[-3000:]}")
    peak_mb = max(usage.ru_maxrss / 1024, sampler.peak_kb / 1024)
    return wall, usage.ru_utime + usage.ru_stime, peak_mb, text


class TreeRssSampler(threading.Thread):
    """Largest sum of PSS (kB) over a process and its descendants, sampled every 20 ms.

    Only while the process has children: a lone process's peak is its own
    ``ru_maxrss``, and reading PSS walks its page tables (costly on a big
    process, and it would slow the process being measured).
    """

    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_kb = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.02):
            tree = _tree(self.pid)
            if len(tree) > 1:
                self.peak_kb = max(self.peak_kb, sum(map(_pss_kb, tree)))

    def stop(self) -> None:
        self._done.set()
        self.join()


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (Linux ``/proc/PID/task/TID/children``)."""
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    todo += [int(child) for child in fh.read().split()]
        except OSError:
            continue
    return tree


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def loglog_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(x): the fitted exponent of y ~ x^k
    (1 = linear); NaN when the x are all equal."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    sxx = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True)) / sxx if sxx else math.nan


def stallscope_cmd(choice: str | None = None) -> list[str]:
    """The command that runs stallscope: ``choice`` split as a shell would, else ours."""
    if choice:
        return shlex.split(choice)
    exe = Path(sys.executable).with_name("stallscope")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "stallscope.cli"]


def machine() -> dict[str, str]:
    """Date, CPU model, core count, memory, OS and Python of this machine."""
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(
                line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    mem = "unknown"
    try:
        with open("/proc/meminfo") as fh:
            kb = int(next(line.split()[1] for line in fh if line.startswith("MemTotal")))
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration):
        pass
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": mem,
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def find_python(module: str, choice: str | None, venv_python: str, flag: str) -> str | None:
    """The first Python that can import ``module``: ``choice`` (exits if it cannot), else
    this one, ``venv_python``, python3, python; None when none can."""
    candidates = (
        [choice]
        if choice
        else [sys.executable, venv_python, shutil.which("python3"), shutil.which("python")]
    )
    for python in candidates:
        if python and Path(python).exists():
            probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True)
            if probe.returncode == 0:
                return python
        if choice:
            sys.exit(f"{flag} {choice} cannot import {module}")
    return None
