"""Run an ingest under a wall-time and a memory limit, in a forked worker that can be killed.

The CLI's ``ingest`` (:func:`run_limited`) and ``analyze FILE``
(:func:`call_limited`, which brings the worker's result or exception back)
fork. The worker checks a cooperative deadline
(``--timeout``: between files, while decompressing, and in SQLite's progress
handler) and caps decompression at a third of ``--max-memory-mb``, refusing
with its own one-line message. The parent watches: every
:data:`MEMORY_POLL_S` it sums the proportional set size (PSS) of the worker's
process group (the worker and its decode processes), and it kills the group
when that passes ``--max-memory-mb`` or when the worker is still running a
grace period after the deadline (stuck in C code that never returns to
Python). It then removes the staging folder the worker left (its lease names
a dead pid on this host) and says why in one line. The store is unchanged
either way.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TypeVar

from stallscope.errors import EnvironmentProblem, InputError, StallscopeError

T = TypeVar("T")

GRACE_S = 5.0
MEMORY_POLL_S = 0.2
EXIT_INPUT, EXIT_ENVIRONMENT = 3, 4


def run_limited(
    work: Callable[[], int],
    *,
    timeout_s: float | None,
    memory_mb: int | None,
    cleanup: Callable[[], None],
) -> int:
    """``work()``'s exit code, run in a forked worker under the limits (see the module docstring);
    a limit, a killed worker or an interrupt is one line on stderr and its exit code."""
    from stallscope.progress import Progress

    try:
        return call_limited(work, timeout_s=timeout_s, memory_mb=memory_mb, cleanup=cleanup)
    except KeyboardInterrupt:
        Progress().clear_line()  # the killed worker's progress line, on a terminal
        print("stallscope: interrupted; the store is unchanged", file=sys.stderr)
        return 130
    except EnvironmentProblem as exc:
        Progress().clear_line()
        print(f"stallscope: error: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except InputError as exc:
        Progress().clear_line()
        print(f"stallscope: error: {exc}", file=sys.stderr)
        return EXIT_INPUT


def call_limited(
    work: Callable[[], T],
    *,
    timeout_s: float | None,
    memory_mb: int | None,
    cleanup: Callable[[], None],
) -> T:
    """``work()``'s result, computed in a forked worker under the limits (the module docstring).

    The result comes back pickled; an exception ``work`` raised is raised here (same
    class and message). Past a limit the worker's process group is killed,
    ``cleanup()`` runs and :class:`InputError` says which limit in one line; a worker
    killed by a signal is :class:`EnvironmentProblem`; an interrupt (Ctrl-C, SIGTERM on
    the main thread) kills the worker, cleans up and raises ``KeyboardInterrupt``.
    Without ``os.fork`` (Windows) ``work`` runs here under the cooperative deadline only.
    """
    from stallscope.ingest.limits import apply_memory_limit, start_deadline

    if not hasattr(os, "fork"):
        start_deadline(timeout_s)
        apply_memory_limit(memory_mb)
        try:
            return work()
        finally:
            start_deadline(None)
            apply_memory_limit(None)
    sys.stdout.flush()
    sys.stderr.flush()
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the worker
        os.close(read_fd)
        _worker(work, write_fd, parent, timeout_s, memory_mb)
    os.close(write_fd)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # (also done by the worker: whichever runs first)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(_read_all(read_fd)), daemon=True)
    reader.start()
    status = _supervise(pid, timeout_s, memory_mb, cleanup)
    reader.join()
    if os.WIFSIGNALED(status):
        cleanup()
        name = signal.Signals(os.WTERMSIG(status)).name
        raise EnvironmentProblem(
            f"the ingest worker was killed ({name}: out of memory?); the store is unchanged"
        )
    ok, value = _outcome(received[0] if received else b"")
    if ok:
        return value
    raise value


def _worker(work, write_fd: int, parent: int, timeout_s, memory_mb) -> None:
    """The forked worker: run ``work`` under the limits, send ``(ok, value)`` back, exit."""
    from stallscope.ingest.limits import apply_memory_limit, start_deadline

    code = 70
    try:
        os.setpgid(0, 0)
        _die_with_parent()
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(130)
        start_deadline(timeout_s)
        apply_memory_limit(memory_mb)
        try:
            outcome = (True, work())
        except BaseException as exc:  # noqa: BLE001 (sent to the parent, which raises it)
            if os.environ.get("STALLSCOPE_DEBUG") and not isinstance(exc, StallscopeError):
                traceback.print_exc()
            outcome = (False, exc)
        _send(write_fd, outcome)
        code = 0
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _supervise(pid: int, timeout_s: float | None, memory_mb: int | None, cleanup) -> int:
    """Wait for the worker: its wait status, or raise once it is past a limit or interrupted."""
    from stallscope.ingest.limits import timeout_reason

    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main else None
    deadline = None if timeout_s is None else time.monotonic() + timeout_s + GRACE_S
    try:
        status = _wait(pid, deadline, memory_mb)
    except KeyboardInterrupt:
        _kill_group(pid)
        cleanup()
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    if isinstance(status, str):  # past a limit: killed
        _kill_group(pid)
        cleanup()
        reason = timeout_reason(timeout_s) if status == "time" else memory_reason(memory_mb)
        raise InputError("", f"{reason}; the store is unchanged")
    return status


def _send(fd: int, outcome: tuple[bool, object]) -> None:
    try:
        data = pickle.dumps(outcome)
    except Exception:  # noqa: BLE001 (an unpicklable result or exception: say what it was)
        value = outcome[1]
        data = pickle.dumps((False, RuntimeError(f"{type(value).__name__}: {value}")))
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as stream:
        return stream.read()


def _outcome(data: bytes) -> tuple[bool, object]:
    if not data:
        return False, StallscopeError("the ingest worker ended without a result")
    try:
        return pickle.loads(data)
    except Exception as exc:  # noqa: BLE001
        return False, StallscopeError(f"the ingest worker's result is unreadable ({exc})")


def _wait(pid: int, deadline: float | None, memory_mb: int | None) -> int | str:
    """The worker's wait status, or ``"time"``/``"memory"`` once it is past a limit."""
    pause, next_poll = 0.002, 0.0
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        now = time.monotonic()
        if deadline is not None and now > deadline:
            return "time"
        if memory_mb and now >= next_poll:
            next_poll = now + MEMORY_POLL_S
            if group_over_memory(pid, memory_mb):
                return "memory"
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def memory_reason(memory_mb: int | None) -> str:
    return (
        f"ingest needed more than the {memory_mb:,} MiB memory limit "
        "(--max-memory-mb or $STALLSCOPE_INGEST_MAX_MEMORY_MB raise it)"
    )


def group_over_memory(group: int, memory_mb: float) -> bool:
    """Whether process group ``group`` uses more than ``memory_mb`` MiB (:func:`group_memory_mb`).

    The sum of the processes' RSS, read from the ``/proc/PID/stat`` lines the
    group search reads anyway, bounds the PSS sum from above: while it is
    within the limit, so is the PSS, and the costly PSS read is skipped.
    ``smaps_rollup`` walks a process's page tables: ~30 ms of CPU for a
    1.5 GB worker, five times a second, and it holds the worker's memory map
    lock while it walks.
    """
    members = _group_members(group)
    if sum(rss_kb for _, rss_kb in members) / 1024 <= memory_mb:
        return False
    return group_memory_mb(group, members) > memory_mb


def group_memory_mb(group: int, members: list[tuple[str, int]] | None = None) -> float:
    """Memory of process group ``group`` in MiB: the sum of its processes' PSS (Linux; else 0).

    PSS shares each page among the processes that map it, so forked decode
    workers that share the worker's pages are not counted twice.
    """
    total_kb = 0
    for entry, _ in _group_members(group) if members is None else members:
        try:
            with open(f"/proc/{entry}/smaps_rollup", "rb") as fh:
                for line in fh:
                    if line.startswith(b"Pss:"):
                        total_kb += int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            continue
    return total_kb / 1024


_PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


def _group_members(group: int) -> list[tuple[str, int]]:
    """(pid, RSS in kB) of each process in process group ``group`` (Linux ``/proc``; else none)."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) == group:  # pgrp (field 5 of stat; 2 after the name)
                members.append((entry, int(fields[21]) * _PAGE_KB))  # rss (field 24)
        except (OSError, ValueError, IndexError):
            continue
    return members


def _kill_group(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _die_with_parent() -> None:
    """Linux: the worker gets SIGKILL when the supervising process dies (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)


def killed_by_signal(code: int, process: str) -> str:
    """Why a child ``process`` ("the ingest process", ...) that exited with ``code`` < 0 died:
    the signal's name, and the likely cause when it is SIGKILL (the kernel's OOM killer)."""
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    hint = ": it probably ran out of memory" if -code == signal.SIGKILL else ""
    return f"{process} was killed ({name}){hint}"
