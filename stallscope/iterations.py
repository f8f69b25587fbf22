"""Inference iterations: find the model-runner iterations of a serving trace and classify them.

An *iteration* is one pass of the serving loop that runs the model once over
the batch: a prefill (prompt tokens), a decode (one new token per sequence)
or a mixed one (chunked prefill beside decodes). :func:`find_iterations`
looks, in this order, for

1. a host range whose name is given (the analyzer's ``iteration_range``
   option, a regular expression);
2. host ranges named by an engine or by the user: vLLM V1 ``execute_model``
   and its layerwise ``execute_<tokens>_context_<n>(…)_generation_<m>(…)``
   ranges, SGLang ``forward_batch``/``run_batch``/``step[DECODE bs=…]``,
   TensorRT-LLM ``[Executor] _forward_step N: c ctx reqs, g gen reqs`` (its
   PyTorch executor) and ``_forward_step``/``forward_step``, and user ranges whose
   names say prefill, decode, generate, extend or iteration;
3. CUDA/HIP graph replays (``cudaGraphLaunch``), one replay per iteration,
   when the trace also shows an inference marker (a range or kernel named for
   KV caches, paged or decode attention, sampling, or an engine) and no
   backward or optimizer kernel (a training step captured in a graph replays
   the same way);
4. input shapes (a Kineto trace profiled with ``record_shapes=True``, the host
   table's ``input_dims``): each call of the token embedding (``aten::embedding``
   whose indices are integer tensors) starts one model forward, and the
   indices' shape says what it is: ``[batch, 1]`` a decode of ``batch`` tokens,
   ``[batch, seq]`` a prefill of ``batch * seq`` tokens, a flat ``[tokens]``
   (engines that pack the batch) a forward of unknown phase. The embedding
   called at least twice with the most rows (the vocabulary; a learned
   position embedding has fewer) is the token embedding. A trace that runs
   a backward pass or an optimizer is training, not inference: no iterations.
   An iteration runs from its forward's embedding call to the next one (its
   sampling included), cut at the end of the ``ProfilerStep`` that holds it.

Of named ranges, a range that holds two or more others is a wrapper (HF
``generate``, a serving request) and is dropped; of the rest the outermost
count.

Each iteration gets its GPU window: first start to last end of the GPU
operations its host range launched (correlation id -> launch call inside the
range, any thread of the range's process). Times are int64 ns on the trace's
clock. Phase, tokens and batch size come from the name where it carries them,
else from the input shapes: a named iteration whose name does not say its
batch takes tokens and batch (and, when the name says no phase, the phase)
from the first token-embedding call inside its range.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np

from stallscope import intervals
from stallscope.jobdata import JobData

PHASES = ("prefill", "decode", "mixed", "unknown")

ITERATION_NAME_REGEX = (
    r"(?i)(prefill|decode|generat|extend|execute_model|model_runner|forward_batch|run_batch"
    r"|execute_(\d+_)?context|forward_step|executor_step|iteration|^step\[)"
)
NOT_ITERATION_REGEX = r"(?i)(ProfilerStep#|optimizer|zero_grad|backward|autograd)"
INFERENCE_MARKER_REGEX = (
    r"(?i)(kv_?cache|paged_?attention|decode|flash_fwd_splitkv|flashinfer|sampl|logits|vllm|sglang"
    r"|tensorrt_llm|trtllm|reshape_and_cache|(^|[^a-z])generate([^a-z]|$))"
)  # ('generate' as a word, RE2 has no lookaround: cuDNN's kernels are 'cudnn_generated_...')
GRAPH_LAUNCH_NAMES = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")
TOKEN_EMBEDDING_OP = (
    "aten::embedding"  # inputs: weight [rows, dim], indices [batch, seq] or [tokens]
)
TRAINING_REGEX = r"(?i)(backward|autograd::engine|^Optimizer\.)"
# GPU kernels that only a training step runs: backward (cuDNN 'bprop', '_bwd', data and
# weight gradients) and fused optimizers. A step replayed as one CUDA graph shows no host
# operators, only these kernels.
TRAINING_KERNEL_REGEX = r"(?i)(backward|bprop|_bwd|dgrad|wgrad|multi_tensor_apply|fused_adam)"
_INDEX_TYPES = ("long int", "long", "int", "int64", "int32", "c10::Long", "c10::Int")

_VLLM_LAYERWISE = re.compile(r"execute_(?:(\d+)_)?context_(\d+)\(.*?\)_generation_(\d+)")
# TensorRT-LLM's PyTorch executor: "[Executor] _forward_step 12: 2 ctx reqs, 8 gen reqs"
# (newer: "..., 2 ctx reqs, 4096 ctx tokens, 8 gen reqs").
_TRTLLM_STEP = re.compile(
    r"_forward_step(?: \d+)?: (\d+) ctx reqs(?:, (\d+) ctx tokens)?, (\d+) gen reqs"
)
_BATCH_SIZE = re.compile(r"(?i)\bbs\s*=\s*(\d+)")
_PREFILL_WORDS = re.compile(r"(?i)(prefill|extend|context|prompt|encode)")
_DECODE_WORDS = re.compile(r"(?i)(decode|generat|sampl|next_token)")


@dataclass
class Iterations:
    """Iterations of one trace and device, sorted by host start (columnar, int64 ns).

    ``gpu_start``/``gpu_end`` are the GPU window of each iteration's launched
    work, ``gpu_busy`` the union of that work (the window less its gaps); ``tokens`` and ``batch`` are -1 when the name does not say them.
    ``source`` says how they were found: ``option``, ``annotation``, ``graph`` or ``shapes``.
    """

    source: str
    names: list[str]
    phases: list[str]
    host_start: np.ndarray
    host_end: np.ndarray
    gpu_start: np.ndarray
    gpu_end: np.ndarray
    gpu_busy: np.ndarray
    tokens: np.ndarray
    batch: np.ndarray

    def __len__(self) -> int:
        return len(self.names)

    def of_phase(self, phase: str) -> np.ndarray:
        """Indices of the iterations of ``phase``, in time order."""
        return np.flatnonzero(np.asarray(self.phases) == phase)

    def token_steps(self) -> np.ndarray:
        """Indices of the iterations that each produce a token: the decode ones, or, when
        fewer than two are named decode, those of unknown phase (an unnamed loop)."""
        decode, unknown = self.of_phase("decode"), self.of_phase("unknown")
        return unknown if decode.size < 2 <= unknown.size else decode


def classify(name: str) -> tuple[str, int, int]:
    """(phase, tokens, batch) from an iteration range's name (-1 where unknown).

    vLLM's layerwise names carry the token count and the numbers of prefill
    (``context``) and decode (``generation``) requests, as TensorRT-LLM's
    ``[Executor] _forward_step N: c ctx reqs[, t ctx tokens], g gen reqs`` do
    (a decode request adds one token); SGLang's carry ``bs=``.
    """
    match = _TRTLLM_STEP.search(name)
    if match:
        context, context_tokens, generation = (int(g) if g else None for g in match.groups())
        phase = "mixed" if context and generation else "prefill" if context else "decode"
        tokens = (
            context_tokens + generation
            if context_tokens is not None
            else generation
            if not context
            else -1
        )
        return phase, tokens, context + generation
    match = _VLLM_LAYERWISE.search(name)
    if match:
        tokens, context, generation = (int(g) if g else -1 for g in match.groups())
        phase = "mixed" if context and generation else "prefill" if context else "decode"
        return phase, tokens, context + generation
    batch_match = _BATCH_SIZE.search(name)
    batch = int(batch_match.group(1)) if batch_match else -1
    prefill, decode = bool(_PREFILL_WORDS.search(name)), bool(_DECODE_WORDS.search(name))
    phase = (
        "mixed"
        if prefill and decode
        else "prefill"
        if prefill
        else "decode"
        if decode
        else "unknown"
    )
    tokens = batch if phase == "decode" else -1
    return phase, tokens, batch


def find_iterations(
    job: JobData, trace_id: str, device: int, name_regex: str | None = None
) -> Iterations | None:
    """The device's iterations (see the module docstring), or None when none are found."""
    if name_regex:
        ranges = _named_ranges(job, trace_id, name_regex, NOT_ITERATION_REGEX)
        source = "option"
    else:
        ranges = _outermost(_named_ranges(job, trace_id, ITERATION_NAME_REGEX, NOT_ITERATION_REGEX))
        source = "annotation"
    if (
        not ranges
        and not name_regex
        and _has_inference_marker(job, trace_id)
        and not _runs_training_kernels(job, trace_id)
    ):
        ranges, source = _graph_replays(job, trace_id), "graph"
    if not ranges and not name_regex:
        return shape_iterations(job, trace_id, device)
    if not ranges:
        return None
    its = _with_gpu_windows(job, trace_id, device, ranges, source)
    if its is not None and source != "graph":
        _fill_from_shapes(job, trace_id, its)
    return its


def _fill_from_shapes(job: JobData, trace_id: str, its: Iterations) -> None:
    """Tokens and batch (and an unknown phase) of named iterations from the token
    embedding's index shape of the first forward inside each range, where the name
    did not say them; a phase the name gives is kept."""
    if not (its.batch < 0).any() and "unknown" not in its.phases:
        return
    calls = _embedding_calls(job, trace_id, min_calls=1)
    if not calls:
        return
    starts = np.array([c[0] for c in calls], dtype=np.int64)
    first = np.searchsorted(starts, its.host_start, side="left")
    for i, k in enumerate(first.tolist()):
        if k >= len(calls) or calls[k][0] >= its.host_end[i]:
            continue
        phase, tokens, batch = classify_indices(calls[k][4])
        if its.batch[i] < 0:
            its.tokens[i], its.batch[i] = tokens, batch
        if its.phases[i] == "unknown":
            its.phases[i] = phase


def shape_iterations(job: JobData, trace_id: str, device: int) -> Iterations | None:
    """The model forwards found from the token embedding's input shapes (step 4 of the
    module docstring), or None: no shapes recorded, a training trace, or fewer than two."""
    calls = _embedding_calls(job, trace_id)
    if len(calls) < 2 or _is_training(job, trace_id):
        return None
    starts = np.array([c[0] for c in calls], dtype=np.int64)
    ends = _forward_ends(job, trace_id, calls, starts)
    ranges, labels = [], []
    for (start, _, pid, _, ids), end in zip(calls, ends.tolist(), strict=True):
        phase, tokens, batch = classify_indices(ids)
        ranges.append((start, end, pid, f"forward {ids}"))
        labels.append((phase, tokens, batch))
    return _with_gpu_windows(job, trace_id, device, ranges, "shapes", labels)


def classify_indices(ids: list[int]) -> tuple[str, int, int]:
    """(phase, tokens, batch) of a forward from its token indices' shape (-1 where unknown).

    ``[batch, 1]``: decode; ``[batch, seq > 1]``: prefill of ``batch * seq``
    tokens; ``[tokens]`` (a packed batch): unknown phase, ``tokens`` tokens.
    """
    if len(ids) == 2 and ids[0] >= 1 and ids[1] >= 1:
        return ("decode" if ids[1] == 1 else "prefill"), ids[0] * ids[1], ids[0]
    if len(ids) == 1 and ids[0] >= 1:
        return "unknown", ids[0], -1
    return "unknown", -1, -1


def has_shapes(job: JobData) -> bool:
    """Whether the job's host table has the ``input_dims`` column (stores older than it don't)."""
    columns = job.columns("host")
    return "input_dims" in columns and "input_types" in columns


def _embedding_calls(job: JobData, trace_id: str, min_calls: int = 2) -> list[tuple]:
    """(start, end, pid, tid, index shape) of the token embedding's calls, in time order.

    Calls are grouped by (weight shape, thread); a group needs ``min_calls`` calls
    or more and integer indices of one or two dimensions. The group with 2-D indices
    (``[batch, seq]``) and the most weight rows wins, else the one with the most rows.
    """
    if not has_shapes(job):
        return []
    rows = job.sql(
        """SELECT h.start_ns, h.end_ns, h.pid, h.tid, h.input_dims, h.input_types FROM host h
           JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
           WHERE h.trace_id = ? AND h.kind = 'cpu_op' AND n.name = ? AND h.input_dims IS NOT NULL
           ORDER BY h.start_ns""",
        [trace_id, TOKEN_EMBEDDING_OP],
    ).fetchall()
    groups: dict[tuple, list[tuple]] = {}
    for start, end, pid, tid, dims_text, types_text in rows:
        shapes = _embedding_inputs(dims_text, types_text)
        if shapes is not None:
            weight, ids = shapes
            groups.setdefault((weight, int(pid or 0), int(tid or 0)), []).append(
                (int(start), int(end), int(pid or 0), int(tid or 0), ids)
            )
    candidates = [(key, calls) for key, calls in groups.items() if len(calls) >= min_calls]
    if not candidates:
        return []
    best = max(
        candidates,
        key=lambda kc: (any(len(c[4]) == 2 for c in kc[1]), kc[0][0][0], len(kc[1])),
    )
    return best[1]


def _embedding_inputs(dims_text: str, types_text: str | None) -> tuple[tuple, list[int]] | None:
    """(weight shape, indices shape) of one ``aten::embedding`` call, or None when the shapes
    are not a 2-D weight and integer indices of one or two dimensions."""
    try:
        dims = json.loads(dims_text)
        types = json.loads(types_text) if types_text else None
    except ValueError:
        return None
    if not isinstance(dims, list) or len(dims) < 2:
        return None
    weight, ids = dims[0], dims[1]
    if not (_int_list(weight) and len(weight) == 2 and _int_list(ids) and 1 <= len(ids) <= 2):
        return None
    if isinstance(types, list) and len(types) >= 2 and str(types[1]) not in _INDEX_TYPES:
        return None
    return tuple(weight), list(ids)


def _int_list(value) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    )


def _is_training(job: JobData, trace_id: str) -> bool:
    """Whether a host operator or range says backward, autograd engine or optimizer."""
    row = job.sql(
        """SELECT count(*) FROM names n WHERE n.trace_id = ? AND regexp_matches(n.name, ?)
             AND n.name_id IN (SELECT name_id FROM host WHERE trace_id = ?
                               AND kind IN ('cpu_op', 'annotation', 'python'))""",
        [trace_id, TRAINING_REGEX, trace_id],
    ).fetchone()
    return bool(row[0])


def _runs_training_kernels(job: JobData, trace_id: str) -> bool:
    """Whether a GPU kernel's name is a backward or optimizer kernel (TRAINING_KERNEL_REGEX)."""
    row = job.sql(
        """SELECT count(*) FROM names n WHERE n.trace_id = ? AND regexp_matches(n.name, ?)
             AND n.name_id IN (SELECT name_id FROM gpu WHERE trace_id = ? AND kind = 'kernel')""",
        [trace_id, TRAINING_KERNEL_REGEX, trace_id],
    ).fetchone()
    return bool(row[0])


def _forward_ends(
    job: JobData, trace_id: str, calls: list[tuple], starts: np.ndarray
) -> np.ndarray:
    """Each forward's host end: the next forward's start, cut at the end of the profiler
    step that holds the forward; the last one (outside a step) at its thread's last activity."""
    pid, tid = calls[-1][2], calls[-1][3]
    last = job.sql(
        "SELECT max(end_ns) FROM host WHERE trace_id = ? AND pid = ? AND tid = ? "
        "AND kind IN ('cpu_op', 'python', 'runtime', 'driver')",
        [trace_id, pid, tid],
    ).fetchone()[0]
    ends = np.append(starts[1:], np.int64(last if last is not None else calls[-1][1]))
    steps = job.numpy(
        """SELECT start_ns, end_ns FROM ranges WHERE trace_id = ? AND kind = 'step'
           ORDER BY start_ns""",
        [trace_id],
    )
    if steps["start_ns"].size:
        holder = np.searchsorted(steps["start_ns"], starts, side="right") - 1
        inside = (holder >= 0) & (starts < steps["end_ns"][np.maximum(holder, 0)])
        cut = steps["end_ns"][np.maximum(holder, 0)]
        ends = np.where(inside, np.minimum(ends, cut), ends)
    return np.maximum(ends, np.array([c[1] for c in calls], dtype=np.int64))


def _named_ranges(job: JobData, trace_id: str, regex: str, exclude: str) -> list[tuple]:
    """(start, end, pid, name) of the host ranges whose name matches ``regex``."""
    rows = job.sql(
        """SELECT r.start_ns, r.end_ns, r.pid, n.name FROM ranges r
           JOIN names n ON n.trace_id = r.trace_id AND n.name_id = r.name_id
           WHERE r.trace_id = ? AND r.kind IN ('annotation', 'nvtx')
             AND regexp_matches(n.name, ?) AND NOT regexp_matches(n.name, ?)
           ORDER BY r.start_ns, r.end_ns DESC""",
        [trace_id, regex, exclude],
    ).fetchall()
    return [(int(s), int(e), int(p or 0), str(n)) for s, e, p, n in rows if e > s]


def _outermost(ranges: list[tuple]) -> list[tuple]:
    """Drop wrappers (a range holding two or more others), then ranges inside another."""
    starts = np.array([r[0] for r in ranges], dtype=np.int64)
    ends = np.array([r[1] for r in ranges], dtype=np.int64)
    # Sorted by start, longest first: the ranges that start inside range i (and come after
    # it) are the ones it holds, for ranges that nest as host ranges do.
    held = np.searchsorted(starts, ends, side="left") - np.arange(starts.size) - 1
    kept = [i for i in range(len(ranges)) if held[i] < 2]
    out, last_end = [], -1
    for i in kept:  # sorted by start, longest first: a range inside the previous kept one is nested
        if ranges[i][1] <= last_end:
            continue
        out.append(ranges[i])
        last_end = ranges[i][1]
    return out


def _has_inference_marker(job: JobData, trace_id: str) -> bool:
    row = job.sql(
        "SELECT count(*) FROM names WHERE trace_id = ? AND regexp_matches(name, ?)",
        [trace_id, INFERENCE_MARKER_REGEX],
    ).fetchone()
    return bool(row[0])


def _graph_replays(job: JobData, trace_id: str) -> list[tuple]:
    rows = job.sql(
        """SELECT h.start_ns, h.end_ns, h.pid FROM host h
           JOIN names n ON n.trace_id = h.trace_id AND n.name_id = h.name_id
           WHERE h.trace_id = ? AND h.kind IN ('runtime', 'driver') AND n.name IN ?
           ORDER BY h.start_ns""",
        [trace_id, list(GRAPH_LAUNCH_NAMES)],
    ).fetchall()
    return [(int(s), int(e), int(p), "graph replay") for s, e, p in rows]


def _with_gpu_windows(
    job: JobData,
    trace_id: str,
    device: int,
    ranges: list[tuple],
    source: str,
    labels: list[tuple[str, int, int]] | None = None,
) -> Iterations | None:
    """Attach each range's GPU window; ranges that launched nothing on ``device`` are dropped.

    ``labels`` (phase, tokens, batch) per range; by default from the range's name."""
    launches = job.numpy(
        """SELECT h.start_ns AS launch_ns, h.pid, g.start_ns, g.end_ns FROM gpu g
           JOIN host h ON h.trace_id = g.trace_id AND h.correlation = g.correlation
             AND h.kind IN ('runtime', 'driver')
           WHERE g.trace_id = ? AND g.device = ? AND g.kind IN ('kernel', 'memcpy', 'memset')
           ORDER BY h.start_ns""",
        [trace_id, device],
    )
    launch_ns = launches["launch_ns"]
    keep, gpu_s, gpu_e, busy = [], [], [], []
    for index, (start, end, pid, _) in enumerate(ranges):
        lo, hi = np.searchsorted(launch_ns, [start, end], side="left")
        mine = np.arange(lo, hi)
        mine = mine[launches["pid"][mine] == pid] if pid else mine
        if mine.size == 0:
            continue
        keep.append(index)
        gpu_s.append(int(launches["start_ns"][mine].min()))
        gpu_e.append(int(launches["end_ns"][mine].max()))
        busy.append(intervals.total(launches["start_ns"][mine], launches["end_ns"][mine]))
    if not keep:
        return None
    picked = [ranges[i] for i in keep]
    if labels is not None:
        labels = [labels[i] for i in keep]
    else:
        labels = [classify(r[3]) if source != "graph" else ("decode", -1, -1) for r in picked]
    return Iterations(
        source=source,
        names=[r[3] for r in picked],
        phases=[label[0] for label in labels],
        host_start=np.array([r[0] for r in picked], dtype=np.int64),
        host_end=np.array([r[1] for r in picked], dtype=np.int64),
        gpu_start=np.array(gpu_s, dtype=np.int64),
        gpu_end=np.array(gpu_e, dtype=np.int64),
        gpu_busy=np.array(busy, dtype=np.int64),
        tokens=np.array([label[1] for label in labels], dtype=np.int64),
        batch=np.array([label[2] for label in labels], dtype=np.int64),
    )
