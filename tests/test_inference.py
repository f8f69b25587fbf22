"""inference: decode loops built by hand (every number known), and the H200 decode captures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallscope.analyzers import inference
from stallscope.errors import UsageError
from stallscope.ingest import ingest_paths
from stallscope.iterations import classify, find_iterations
from stallscope.jobdata import JobData
from tests.conftest import CORPUS
from tests.kineto_builder import KinetoTrace

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces" / "kineto"
MS = 1_000_000


def annotate(t: KinetoTrace, name: str, start: int, dur: int) -> None:
    t.cpu_op(name, start, dur, cat="user_annotation")


def item_python_loop(n: int = 10) -> KinetoTrace:
    """A graph-replayed decode loop that reads the token with .item() and then runs Python.

    Iteration i (base 4i ms): ``decode_step`` [base, base+3.4 ms) holding a
    ``cudaGraphLaunch`` [base+10, base+60) µs whose kernel runs [base+0.1, base+1.1) ms,
    and ``sample_and_schedule`` [base+0.1, base+3.4) ms: ``aten::item``
    [base+0.1, base+1.15) ms with its ``cudaStreamSynchronize``, then unrecorded Python.
    Per 4 ms period the GPU idles 3 ms: sync 50 µs (item after the kernel), Python in
    sample_and_schedule 2.25 ms, nothing recorded 600 µs, graph launch 50 µs, the next
    decode_step's own issue path 50 µs.
    """
    t = KinetoTrace()
    for i in range(n):
        base = 4 * MS * i
        annotate(t, "decode_step", base, 3_400_000)
        corr = t.next_corr()
        t.runtime("cudaGraphLaunch", base + 10_000, 50_000, corr=corr, ext=corr)
        t.kernel("decode_graph_kernel", base + 100_000, 1_000_000, corr=corr)
        annotate(t, "sample_and_schedule", base + 100_000, 3_300_000)
        t.cpu_op("aten::item", base + 100_000, 1_050_000)
        t.runtime("cudaStreamSynchronize", base + 110_000, 1_030_000)
    return t


def prefill_loop(n: int = 10, prefill_before: int = 5) -> KinetoTrace:
    """Decode iterations of 1.15 ms GPU work every 1.2 ms; a 9 ms prefill before iteration 5.

    Decode iteration i: ``decode_step`` [b, b+100 µs) launches a kernel [b+50 µs, b+1.2 ms).
    The prefill (``prefill`` range at 6 ms) launches a 9 ms kernel at 6.05 ms; the GPU waits
    50 µs for it (its own launch path). Periods: 8 of 1.2 ms, one of 10.2 ms.
    """
    t = KinetoTrace()
    base = 0
    for i in range(n):
        if i == prefill_before:
            annotate(t, "prefill", base, 100_000)
            corr = t.next_corr()
            t.runtime("cudaLaunchKernel", base + 10_000, 10_000, corr=corr, ext=corr)
            t.kernel("prefill_attention_kernel", base + 50_000, 9_000_000, corr=corr)
            base += 9_000_000
        annotate(t, "decode_step", base, 100_000)
        corr = t.next_corr()
        t.runtime("cudaLaunchKernel", base + 10_000, 10_000, corr=corr, ext=corr)
        t.kernel("decode_kernel", base + 50_000, 1_150_000, corr=corr)
        base += 1_200_000
    return t


def eager_loop(n: int = 10, ops: int = 10) -> KinetoTrace:
    """Eager decode: each 1 ms ``decode_step`` runs 10 operators of 90 µs, each launching a 10 µs kernel."""
    t = KinetoTrace()
    for i in range(n):
        base = MS * i
        annotate(t, "decode_step", base, MS)
        for j in range(ops):
            start = base + 100_000 * j
            ext = t.next_corr()
            t.cpu_op("aten::add", start, 90_000, args={"External id": ext})
            corr = t.next_corr()
            t.runtime("cudaLaunchKernel", start + 10_000, 10_000, corr=corr, ext=ext)
            t.kernel("elementwise_kernel", start + 80_000, 10_000, corr=corr)
    return t


def analyze(store, tmp_path, trace: KinetoTrace, **params):
    (res,) = ingest_paths(store, [str(trace.write(tmp_path / "t.json"))])
    job = JobData(store, store.traces(res.job_id))
    result = inference.run(job, inference.SPEC.params(params))
    job.close()
    metrics = {m.name: m.value for m in result.metrics}
    findings = {f.evidence["key"]: f for f in result.findings}
    return metrics, findings


def test_item_and_python_between_tokens_is_named_from_its_range(store, tmp_path):
    metrics, findings = analyze(store, tmp_path, item_python_loop(), decode_batch=16)
    assert metrics["decode_iterations"] == 10
    assert metrics["decode_iter_ms_median"] == 4.0 and metrics["decode_iter_ms_max"] == 4.0
    assert metrics["decode_gpu_busy_pct"] == 25.0
    assert metrics["tokens_per_s"] == 4000.0  # 16 sequences / 4 ms
    host = findings["host_overhead"]
    assert host.severity == "critical"  # 26.1 of 36 ms
    assert host.impact_ns == 9 * 2_900_000  # sync 50 µs + Python 2.25 ms + unrecorded 600 µs
    assert host.saving_ns == 10 * 2_900_000  # the median per token x 10 decode iterations
    assert host.evidence["sync_ns"] == 9 * 50_000
    assert host.evidence["cpu_ns"] == 9 * 2_250_000
    assert host.evidence["graph_launch_ns"] == 9 * 50_000
    assert host.evidence["sync_calls_per_token"] == 1
    assert host.evidence["ranges"] == [{"name": "sample_and_schedule", "idle_ns": 9 * 2_300_000}]
    assert "`sample_and_schedule`" in host.title and ".item()" in host.title
    assert "launch_bound" not in findings and "prefill_interference" not in findings


def test_prefill_interference_names_the_prefill(store, tmp_path):
    metrics, findings = analyze(store, tmp_path, prefill_loop())
    assert metrics["prefill_iterations"] == 1 and metrics["prefill_ms_median"] == 9.0
    assert metrics["decode_iter_ms_median"] == 1.2 and metrics["decode_iter_ms_max"] == 10.2
    assert metrics["tokens_per_s"] is None  # the names do not give the batch
    f = findings["prefill_interference"]
    assert f.severity == "high"  # 9 ms of 19.8 ms
    assert f.impact_ns == 9_000_000  # 10.2 - 1.2 ms
    assert f.saving_ns == 9_000_000 - 50_000  # less the prefill's own launch wait
    assert f.evidence["stalled_tokens"] == 1 and f.evidence["prefills"][0]["name"] == "prefill"
    assert f.windows == [[6_000_000, 16_200_000]]
    assert set(findings) == {"iterations", "prefill_interference"}


def test_eager_decode_is_launch_bound(store, tmp_path):
    metrics, findings = analyze(store, tmp_path, eager_loop())
    assert metrics["decode_iter_ms_median"] == 1.0 and metrics["decode_gpu_busy_pct"] == 10.0
    f = findings["launch_bound"]
    assert f.severity == "critical" and f.impact_ns == 9 * 900_000
    assert f.evidence["launch_call_ns"] == 9 * 800_000  # inside the launching operators
    assert f.evidence["issue_ns"] == 9 * 100_000  # unrecorded Python between them
    assert f.saving_ns is None  # the profiled speed says nothing exact about the unprofiled one
    assert len(f.windows) == 9 and all(b - a == MS for a, b in f.windows)
    assert "CUDA graph" in f.recommendation and "capture sizes" in f.recommendation
    assert "host_overhead" not in findings


def comm_and_copy_loop(n: int = 10) -> KinetoTrace:
    """Each 1.6 ms iteration: 1 ms of compute, then a 0.5 ms NCCL all-reduce (tensor parallel)
    with nothing beside it; every iteration also copies a 2 MiB KV block in (a 0.3 ms HtoD
    copy on a side stream, beside the compute: not exposed)."""
    t = KinetoTrace()
    for i in range(n):
        base = 1_600_000 * i
        annotate(t, "decode_step", base, 100_000)
        for offset, name, start, dur in (
            (10_000, "gemm_kernel", 50_000, 1_000_000),
            (30_000, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 1_050_000, 500_000),
        ):
            corr = t.next_corr()
            t.runtime("cudaLaunchKernel", base + offset, 10_000, corr=corr, ext=corr)
            t.kernel(name, base + start, dur, corr=corr)
        corr = t.next_corr()
        t.runtime("cudaMemcpyAsync", base + 40_000, 10_000, corr=corr, ext=corr)
        t.memcpy("HtoD", "Pinned", "Device", base + 100_000, 300_000, 2 << 20, corr=corr, stream=9)
    return t


def test_exposed_tensor_parallel_communication(store, tmp_path):
    metrics, findings = analyze(store, tmp_path, comm_and_copy_loop())
    assert metrics["decode_iter_ms_median"] == 1.6
    f = findings["tp_comm"]
    assert f.severity == "high"  # 9 x 0.5 ms of 14.4 ms: 31 %
    assert f.impact_ns == 9 * 500_000
    assert "custom" in f.recommendation and "NCCL" in f.recommendation
    assert "kv_copies" not in findings  # the KV copies ran beside compute


def test_exposed_kv_copies(store, tmp_path):
    t = comm_and_copy_loop()
    for i in range(10):  # a 90 µs swap-out after the all-reduce, before the next compute
        base = 1_600_000 * i
        corr = t.next_corr()
        t.runtime("cudaMemcpyAsync", base + 60_000, 10_000, corr=corr, ext=corr)
        t.memcpy("DtoH", "Device", "Pinned", base + 1_550_000, 90_000, 4 << 20, corr=corr, stream=9)
    metrics, findings = analyze(store, tmp_path, t, min_impact_ms=0)
    f = findings["kv_copies"]
    assert f.impact_ns == 9 * 90_000 and f.severity == "low"  # 0.81 of 14.4 ms: 5.6 %


def test_training_step_is_not_inference(store, tmp_path):
    t = KinetoTrace()
    t.step(1, 0, 2 * MS)
    annotate(t, "Optimizer.step#AdamW.step", 100_000, 500_000)
    t.runtime("cudaLaunchKernel", 10_000, 10_000, corr=5, ext=5)
    t.kernel("gemm", 50_000, MS, corr=5)
    metrics, findings = analyze(store, tmp_path, t)
    assert metrics == {} and findings == {}


def graph_replays(kernel: str, n: int = 6) -> KinetoTrace:
    """Unannotated graph replays every 2 ms, each 1 ms of GPU work named ``kernel``."""
    t = KinetoTrace()
    for i in range(n):
        corr = t.next_corr()
        t.runtime("cudaGraphLaunch", 2 * MS * i, 20_000, corr=corr, ext=corr)
        t.kernel(kernel, 2 * MS * i + 50_000, MS, corr=corr)
    return t


def test_graph_replays_are_iterations_only_beside_an_inference_marker(store, tmp_path):
    metrics, _ = analyze(store, tmp_path, graph_replays("paged_attention_v2_kernel"))
    assert metrics["decode_iterations"] == 6 and metrics["decode_iter_ms_median"] == 2.0
    (tmp_path / "b").mkdir()
    metrics, findings = analyze(store, tmp_path / "b", graph_replays("gemm_bias_relu"))
    assert metrics == {} and findings == {}  # a training step in a graph replays the same way


def test_a_training_step_replayed_as_a_graph_is_not_decode(store, tmp_path):
    """cuDNN's attention kernels are named 'cudnn_generated_...' (not an HF 'generate'), and a
    graph that runs a backward kernel is a training step (the train_small_graph sample)."""
    fwd = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7"
    metrics, findings = analyze(store, tmp_path, graph_replays(fwd))
    assert metrics == {} and findings == {}
    t = graph_replays("paged_attention_v2_kernel")  # an inference marker...
    corr = t.next_corr()
    t.kernel("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma", 13 * MS, MS, corr=corr)
    (tmp_path / "b").mkdir()
    metrics, findings = analyze(store, tmp_path / "b", t)  # ...beside a backward kernel
    assert metrics == {} and findings == {}


def test_the_inference_marker_reads_generate_as_a_word():
    import re

    from stallscope.iterations import INFERENCE_MARKER_REGEX

    assert re.search(INFERENCE_MARKER_REGEX, "GenerationMixin.generate")
    assert re.search(INFERENCE_MARKER_REGEX, "model.generate (step 3)")
    assert not re.search(INFERENCE_MARKER_REGEX, "cudnn_generated_fort_native_sdpa_sm90")


def test_wrapper_range_is_dropped(store, tmp_path):
    t = prefill_loop(n=4, prefill_before=99)
    annotate(t, "generate", 0, 5 * MS)  # HF generate around every decode step
    (res,) = ingest_paths(store, [str(t.write(tmp_path / "w.json"))])
    job = JobData(store, store.traces(res.job_id))
    its = find_iterations(job, job.traces[0].trace_id, 0)
    assert its.names == ["decode_step"] * 4 and its.source == "annotation"
    job.close()


def test_iteration_range_option_names_the_iterations(store, tmp_path, monkeypatch):
    monkeypatch.setenv("STALLSCOPE_ITERATION_RANGE", "^decode_step$")
    metrics, findings = analyze(store, tmp_path, prefill_loop())
    assert metrics["prefill_iterations"] == 0 and metrics["decode_iterations"] == 10
    assert findings["iterations"].evidence["source"] == "option"
    monkeypatch.setenv("STALLSCOPE_ITERATION_RANGE", "decode_step(")
    with pytest.raises(
        UsageError, match="STALLSCOPE_ITERATION_RANGE='decode_step\\(' is not a regular"
    ):
        inference.iteration_range()


@pytest.mark.parametrize(
    "name, expected",
    [
        ("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086)", ("decode", 32, 32)),
        ("execute_8192_context_9(sq8155sk8430)_generation_37(sq37sk34489)", ("mixed", 8192, 46)),
        ("execute_2048_context_2(sq2048sk2048)_generation_0(sq0sk0)", ("prefill", 2048, 2)),
        ("execute_context_1(888_788544)_generation_0(0)", ("prefill", -1, 1)),
        ("step[DECODE bs=32]", ("decode", 32, 32)),
        ("step[EXTEND bs=4]", ("prefill", -1, 4)),
        ("decode_step", ("decode", -1, -1)),
        ("execute_model", ("unknown", -1, -1)),
    ],
)
def test_classify_from_engine_names(name, expected):
    assert classify(name) == expected


# --- the H200 decode captures, against their truth files -------------------------------


def sample(store, name: str, **params):
    path = SAMPLES / name / f"{name}.pt.trace.json.gz"
    truth = json.loads((SAMPLES / name / f"{name}.truth.json").read_text())
    (res,) = ingest_paths(store, [str(path)])
    job = JobData(store, store.traces(res.job_id))
    result = inference.run(job, inference.SPEC.params(params))
    job.close()
    metrics = {m.name: m.value for m in result.metrics}
    return metrics, {f.evidence["key"]: f for f in result.findings}, truth


def within(value: float, truth: float, tolerance: float = 0.10) -> bool:
    return abs(value - truth) <= tolerance * truth


def test_capture_graph_item_python(store):
    metrics, findings, truth = sample(store, "decode_graph_item_python")
    assert metrics["decode_iterations"] == 40
    f = findings["host_overhead"]
    assert f.severity == "critical"
    assert "`sample_and_schedule`" in f.title and ".item()" in f.title
    assert f.evidence["sync_calls_per_token"] == 16  # 16 tok[b, 0].item() per iteration
    assert f.evidence["ranges"][0]["name"] == "sample_and_schedule"
    assert within(f.saving_ns, truth["expected_saving"]["saving_ns_over_profiled_steps"])
    per_token = truth["expected_saving"]["saving_ns_per_iteration"]
    assert within(f.evidence["per_token_ns"], per_token)
    assert "launch_bound" not in findings


def test_capture_prefill_interference(store):
    metrics, findings, truth = sample(store, "decode_prefill_interference")
    per = truth["per_iteration_truth"]
    assert metrics["prefill_iterations"] == 2
    prefill = truth["planted"][0]["prefill_ns"]["median_ns"]  # timed unprofiled, synced
    assert within(metrics["prefill_ms_median"] * MS, prefill)
    assert within(metrics["decode_iter_ms_median"] * MS, per["decode_iteration_ns_median"])
    assert within(metrics["decode_iter_ms_max"] * MS, per["stalled_iteration_ns_median"])
    f = findings["prefill_interference"]
    assert f.evidence["stalled_tokens"] == 2 and f.evidence["with_prefill"] == 2
    assert [p["name"] for p in f.evidence["prefills"]] == ["prefill", "prefill"]
    assert within(f.saving_ns, truth["expected_saving"]["saving_ns_over_profiled_steps"])
    assert set(findings) == {"iterations", "prefill_interference"}


def test_capture_graph_is_clean(store):
    metrics, findings, truth = sample(store, "decode_graph", decode_batch=16)
    assert set(findings) == {"iterations"}
    assert "ran ahead of the GPU" in findings["iterations"].detail  # graphs queued early
    iteration = truth["measured"]["iteration_wall_ns_synced_each"]["median_ns"]
    assert within(metrics["decode_iter_ms_median"] * MS, iteration)
    assert within(metrics["tokens_per_s"], 16 / (iteration / 1e9))


def test_capture_eager_is_launch_bound_and_says_the_profiler_inflates_it(store):
    metrics, findings, truth = sample(store, "decode_eager")
    f = findings["launch_bound"]
    assert f.severity == "critical" and f.saving_ns is None
    assert "profiled speed" in f.detail
    replay = truth["measured"]["decode_graph_replay_ns_synced"]["median_ns"]
    assert within(f.evidence["gpu_ns_per_token"], replay, 0.15)  # the graph's floor, eager kernels
    assert "host_overhead" not in findings and "prefill_interference" not in findings


# --- public serving traces (skipped without the corpus) ------------------------------

TRACELENS = CORPUS / "tracelens" / "traces"


@pytest.mark.parametrize(
    "path, phase, tokens, batch",
    [
        ("inference/vllm_decode_full/graph_execution.json.gz", "decode", 32, 32),
        ("inference/vllm_prefilldecode_piecewise/graph_execution.json.gz", "mixed", 8192, 46),
        ("inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz", "decode", 32, 32),
        ("b200/eager_trace.json.gz", "prefill", -1, 1),
    ],
)
def test_engine_captures_are_classified_from_their_ranges(store, path, phase, tokens, batch):
    file = TRACELENS / path
    if not file.is_file():
        pytest.skip("corpus not present")
    (res,) = ingest_paths(store, [str(file)])
    job = JobData(store, store.traces(res.job_id))
    trace = job.traces[0].trace_id
    (its,) = [i for d in job.devices(trace) if (i := find_iterations(job, trace, int(d)))]
    job.close()
    assert (its.phases, list(its.tokens), list(its.batch)) == ([phase], [tokens], [batch])
