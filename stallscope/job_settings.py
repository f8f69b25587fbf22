"""Job-level settings: one value per job that several analyzers and views read.

* ``skew_tolerance_ns``: clock offsets between ranks below this are taken as one
  shared clock, above it (when steady) corrected (:mod:`stallscope.collectives`).
  ``nccl_wait``, ``overlap`` (its waiting share of exposed communication) and the
  Distributed page's wait matrix (:func:`stallscope.views.wait_matrix`) all match
  collectives with it, so one report or page shows one clock correction.

* ``iteration_range``: a regular expression naming the host ranges that are the
  inference iterations (the ``inference`` analyzer, the Inference page), or None
  to let :mod:`stallscope.iterations` find them. Set with ``stallscope analyze
  --iteration-range REGEX`` or the Inference page's input; it travels in the
  overrides dict as ``overrides["inference"]["iteration_range"]`` (a string
  among the analyzer's numbers, so every path that carries thresholds carries it).

A threshold sets a setting for every reader: the ``nccl_wait`` threshold
``skew_tolerance_us`` (``--nccl-wait-skew-tolerance-us``, the dashboard's
threshold panel) is the job's skew tolerance. :func:`apply` puts the values of
a threshold-overrides dict on a :class:`~stallscope.jobdata.JobData` before
anything reads them; :func:`of` reads them (defaults when none were applied).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from stallscope.errors import UsageError

SKEW_TOLERANCE_US = 100.0  # the default of nccl_wait's skew_tolerance_us threshold
_KEY = ("job_settings",)


@dataclass(frozen=True)
class JobSettings:
    """The job's settings; times in integer ns."""

    skew_tolerance_ns: int = int(SKEW_TOLERANCE_US * 1000)
    iteration_range: str | None = None


ITERATION_RANGE = ("inference", "iteration_range")  # where the overrides dict holds it


def settings_from(overrides: dict[str, dict[str, Any]] | None) -> JobSettings:
    """The settings a threshold-overrides dict (``overrides[analyzer][threshold]``) implies."""
    us = ((overrides or {}).get("nccl_wait") or {}).get("skew_tolerance_us")
    regex = ((overrides or {}).get(ITERATION_RANGE[0]) or {}).get(ITERATION_RANGE[1])
    settings = JobSettings(iteration_range=str(regex).strip() or None if regex else None)
    return settings if us is None else replace(settings, skew_tolerance_ns=int(float(us) * 1000))


def apply(job: Any, overrides: dict[str, dict[str, float]] | None) -> JobSettings:
    """Set ``job``'s settings from ``overrides``; returns them."""
    settings = settings_from(overrides)
    job.cache[_KEY] = settings
    return settings


def set_skew_tolerance_us(job: Any, us: float) -> int:
    """Set ``job``'s skew tolerance (µs); returns it in ns."""
    settings = replace(of(job), skew_tolerance_ns=int(float(us) * 1000))
    job.cache[_KEY] = settings
    return settings.skew_tolerance_ns


def of(job: Any) -> JobSettings:
    """``job``'s settings: those applied, else the defaults."""
    return job.cache.get(_KEY) or JobSettings()


def check_iteration_range(value: str, where: str = "--iteration-range") -> None:
    """Raise :class:`~stallscope.errors.UsageError` unless ``value`` is a regular expression."""
    try:
        re.compile(value)
    except re.error as error:
        raise UsageError(f"{where}={value!r} is not a regular expression: {error}") from None
