"""What a *synchronize call* is: the one definition idle attribution and ``host_sync`` share.

A synchronize call is a runtime or driver API call that returns only once the
GPU has finished earlier work. Names are compared after stripping version
suffixes (``_v2``) and the per-thread-stream variants (``_ptds``/``_ptsz``):

* :data:`SYNC_API_REGEX`: ``cuda``/``hip`` ``{Device,Stream,Event,Ctx,Thread}Synchronize``
  (``hipThreadSynchronize`` does not exist; the pattern allows it harmlessly) and the
  driver's ``cu{Ctx,Stream,Event}Synchronize``. ``cudaStreamWaitEvent`` is a GPU-side
  wait and ``cudaEventQuery`` does not block: neither is one;
* copies (:data:`COPY_API_REGEX`) block when synchronous (no ``Async``), except
  host-to-device copies of at most :data:`SMALL_H2D_BYTES` (they return once staged,
  nsys's rule), and when asynchronous device-to-host into pageable memory.

Where their cost goes (each idle nanosecond has one cause, stallscope/idle.py):
the idle a synchronize call or a blocking device-to-host copy drains is
``host_sync`` (the ``host_sync`` analyzer charges it, capped at that time); the
idle of other blocking copies is ``memcpy`` (the ``memcpy`` analyzer owns the
copies), so ``host_sync`` counts those calls but charges them nothing.
"""

from __future__ import annotations

import re

API_SUFFIX_REGEX = r"(_v[0-9]+)?(_ptds|_ptsz)?(_v[0-9]+)?$"
SYNC_API_REGEX = (
    r"^(cuda|hip)(Device|Stream|Event|Ctx|Thread)Synchronize$|^cu(Ctx|Stream|Event)Synchronize$"
)
COPY_API_REGEX = r"^(cuda|hip|cu)Memcpy"
SMALL_H2D_BYTES = 64 * 1024  # synchronous H2D copies up to this size return once staged


def api_name_sql(column: str = "n.name") -> str:
    """SQL expression: the API name in ``column`` without version / per-thread suffixes."""
    return f"regexp_replace({column}, '{API_SUFFIX_REGEX}', '')"


API_SQL = api_name_sql("n.name")


def api_name(name: str) -> str:
    """The API name without version / per-thread suffixes (``cudaMemcpy_v2`` -> ``cudaMemcpy``)."""
    return re.sub(API_SUFFIX_REGEX, "", name, count=1)


def is_sync_api(name: str) -> bool:
    """Whether ``name`` (a runtime or driver API call) is a synchronize call."""
    return re.search(SYNC_API_REGEX, api_name(name)) is not None
