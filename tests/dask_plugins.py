"""Dask worker plugins for tests/test_dask.py: kill the worker at a chosen moment.

Sent to the workers by value (``cloudpickle.register_pickle_by_value``), so the
workers need not import the tests package.
"""

from __future__ import annotations

import fcntl
import os
import signal

from distributed import WorkerPlugin


class KillAtTask(WorkerPlugin):
    """SIGKILL the worker process when a task whose key starts with ``prefix`` starts executing,
    ``times`` times in all (counted in the file ``tally``, shared by every worker)."""

    def __init__(self, prefix: str, tally: str, times: int):
        self.prefix = prefix
        self.tally = tally
        self.times = times

    def transition(self, key, start, finish, **kwargs) -> None:
        if finish != "executing" or not str(key).startswith(self.prefix):
            return
        with open(self.tally, "a+") as fh:
            # count and claim under one lock: workers start their tasks at the same moment
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            if fh.read().count("\n") >= self.times:
                return
            fh.write(f"{key} {os.getpid()}\n")
            fh.flush()
        os.kill(os.getpid(), signal.SIGKILL)
