"""Dask worker plugins for tests/test_dask.py: kill the worker at a chosen moment.

Sent to the workers by value (``cloudpickle.register_pickle_by_value``), so the
workers need not import the tests package.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

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
        tally = Path(self.tally)
        kills = tally.read_text().count("\n") if tally.exists() else 0
        if kills >= self.times:
            return
        with open(tally, "a") as fh:
            fh.write(f"{key} {os.getpid()}\n")
        os.kill(os.getpid(), signal.SIGKILL)
