"""Inference iterations from input shapes: hand-built loops (every number known) and the H200
captures of an unannotated GPT-like decoder (sample_traces/kineto/shapes_*), against their truth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallscope import job_settings
from stallscope.analyzers import inference
from stallscope.errors import UsageError
from stallscope.ingest import ingest_paths
from stallscope.iterations import classify, classify_indices, find_iterations, has_shapes
from stallscope.jobdata import JobData
from tests.kineto_builder import KinetoTrace

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces" / "kineto"
MS = 1_000_000
VOCAB = [32000, 512]  # token embedding weight
POSITIONS = [1024, 512]  # a learned position embedding: fewer rows, called as often


def forward(t: KinetoTrace, base: int, ids: list[int], gpu_ns: int, shapes: bool = True) -> None:
    """One model forward at ``base``: token and position embeddings, one launch, one kernel.

    The token embedding's indices are ``ids``; the kernel runs [base + 50 µs, + ``gpu_ns``).
    """
    for weight, index in ((VOCAB, ids), (POSITIONS, ids[-1:])):
        args = {"External id": t.next_corr()}
        if shapes:
            args |= {"Input Dims": [weight, index, [], [], []],
                     "Input type": ["c10::BFloat16", "long int", "Scalar", "Scalar", "Scalar"]}  # fmt: skip
        t.cpu_op("aten::embedding", base + (0 if weight is VOCAB else 5_000), 4_000, args=args)
    corr = t.next_corr()
    t.runtime("cudaLaunchKernel", base + 20_000, 10_000, corr=corr, ext=corr)
    t.kernel("decoder_forward_kernel", base + 50_000, gpu_ns, corr=corr)


def decode_loop(n: int = 10, batch: int = 4, shapes: bool = True) -> KinetoTrace:
    """``n`` decode forwards of ``[batch, 1]`` every 2 ms, 1.5 ms of GPU work each: TPOT 2 ms."""
    t = KinetoTrace()
    for i in range(n):
        forward(t, 2 * MS * i, [batch, 1], 1_500_000, shapes)
    return t


def generate_loop(calls: int = 2, decodes: int = 5, prefill_batch: int = 4) -> KinetoTrace:
    """``calls`` generate() calls, one ProfilerStep each: a prefill of ``[prefill_batch, 64]``
    (6 ms GPU), then ``decodes`` decodes of ``[4, 1]`` every 2 ms (1.5 ms GPU)."""
    t = KinetoTrace()
    base = 0
    for call in range(calls):
        t.step(call, base, 6 * MS + 100_000 + 2 * MS * decodes)  # ends 0.9 ms before the next
        forward(t, base, [prefill_batch, 64], 6 * MS)
        base += 6 * MS + 100_000
        for _ in range(decodes):
            forward(t, base, [4, 1], 1_500_000)
            base += 2 * MS
        base += MS - 100_000
    return t


def analyze(store, tmp_path, trace: KinetoTrace, overrides: dict | None = None, **params):
    (res,) = ingest_paths(store, [str(trace.write(tmp_path / "t.pt.trace.json"))])
    job = JobData(store, store.traces(res.job_id))
    job_settings.apply(job, overrides)
    try:
        result = inference.run(job, inference.SPEC.params(params))
        its = find_iterations(job, job.traces[0].trace_id, 0, inference.iteration_range(job))
    finally:
        job.close()
    metrics = {m.name: m.value for m in result.metrics}
    return metrics, {f.evidence["key"]: f for f in result.findings}, its


def test_decode_forwards_are_found_from_the_embedding_shapes(store, tmp_path):
    metrics, findings, its = analyze(store, tmp_path, decode_loop())
    assert its.source == "shapes" and len(its) == 10
    assert set(its.phases) == {"decode"} and set(its.batch) == {4} and set(its.tokens) == {4}
    assert its.names[0] == "forward [4, 1]"  # the token embedding, not the position one
    assert metrics["decode_iterations"] == 10 and metrics["decode_iter_ms_median"] == 2.0
    assert metrics["tokens_per_s"] == 2000.0  # 4 tokens every 2 ms
    f = findings["iterations"]
    assert f.evidence["source"] == "shapes" and "input shapes" in f.detail


def test_named_iterations_take_their_batch_from_the_shapes(store, tmp_path):
    t = decode_loop()
    for i in range(10):
        t.cpu_op("decode_step", 2 * MS * i, 100_000, cat="user_annotation")
    metrics, _, its = analyze(store, tmp_path, t)
    assert its.source == "annotation" and set(its.batch) == {4} and set(its.tokens) == {4}
    assert metrics["tokens_per_s"] == 2000.0  # no decode_batch threshold needed


def test_without_shapes_nothing_is_guessed(store, tmp_path):
    metrics, findings, its = analyze(store, tmp_path, decode_loop(shapes=False))
    assert its is None and metrics == {} and findings == {}


def test_a_trace_with_a_backward_pass_is_training(store, tmp_path):
    t = decode_loop()
    t.cpu_op("autograd::engine::evaluate_function: EmbeddingBackward0", 21 * MS, 100_000)
    metrics, findings, its = analyze(store, tmp_path, t)
    assert its is None and metrics == {} and findings == {}


def test_generate_calls_prefill_then_decode_and_a_new_batch_is_no_stall(store, tmp_path):
    metrics, findings, its = analyze(store, tmp_path, generate_loop())
    assert list(its.phases) == (["prefill"] + ["decode"] * 5) * 2
    assert its.tokens[0] == 4 * 64 and its.batch[0] == 4
    assert metrics["prefill_iterations"] == 2 and metrics["prefill_ms_median"] == 6.0
    # 8 periods of 2 ms; the one across the second call's prefill starts a new batch: left out
    assert metrics["decode_iter_ms_max"] == 2.0 and metrics["tokens_per_s"] == 2000.0
    assert "prefill_interference" not in findings
    # an iteration runs to the next forward, cut at its profiler step's end (16.1 ms)
    assert its.host_end[4] - its.host_start[0] == 14_100_000  # the next decode's start
    assert its.host_end[5] - its.host_start[0] == 16_100_000  # not call 1's prefill at 17 ms
    assert its.host_start[6] - its.host_start[0] == 17 * MS


def test_a_prefill_of_other_requests_stalls_the_running_batch(store, tmp_path):
    """Continuous batching: a prefill of 2 new requests between decodes of the running 4."""
    metrics, findings, _ = analyze(store, tmp_path, generate_loop(prefill_batch=2))
    assert metrics["decode_iter_ms_max"] > 7.0  # the 6 ms prefill held a token back
    assert findings["prefill_interference"].evidence["with_prefill"] == 1


@pytest.mark.parametrize(
    "ids, expected",
    [
        ([128, 1], ("decode", 128, 128)),
        ([8, 1024], ("prefill", 8192, 8)),
        ([4096], ("unknown", 4096, -1)),
        ([0, 1], ("unknown", -1, -1)),
    ],
)
def test_classify_indices(ids, expected):
    assert classify_indices(ids) == expected


@pytest.mark.parametrize(
    "name, expected",
    [
        ("[Executor] _forward_step 12587: 0 ctx reqs, 18 gen reqs", ("decode", 18, 18)),
        (
            "[Executor] _forward_step 7: 2 ctx reqs, 4096 ctx tokens, 8 gen reqs",
            ("mixed", 4104, 10),
        ),
        ("[Executor] _forward_step: 3 ctx reqs, 0 gen reqs", ("prefill", -1, 3)),
    ],
)
def test_classify_tensorrt_llm_executor_steps(name, expected):
    assert classify(name) == expected


def test_iteration_range_setting_wins_and_is_recorded(store, tmp_path, monkeypatch):
    t = generate_loop()
    t.cpu_op("decode_step", 6 * MS + 100_000, 100_000, cat="user_annotation")
    monkeypatch.setenv(inference.ITERATION_RANGE_ENV, "^nothing$")  # the setting comes first
    overrides = {"inference": {"iteration_range": "^decode_step$"}}
    _, findings, its = analyze(store, tmp_path, t, overrides)
    assert its.source == "option" and its.names == ["decode_step"]
    evidence = findings["iterations"].evidence
    assert evidence["source"] == "option" and evidence["iteration_range"] == "^decode_step$"
    assert "`^decode_step$`" in findings["iterations"].detail
    with pytest.raises(UsageError, match="--iteration-range='decode_step\\(' is not a regular"):
        job_settings.check_iteration_range("decode_step(")


def test_cli_iteration_range_flag(cli, tmp_path):
    path = generate_loop().write(tmp_path / "g.pt.trace.json")
    done = cli("analyze", str(path), "--format", "json", "--iteration-range", "^nothing$")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert not [f for f in report["findings"] if f["analyzer"] == "inference"]  # nothing matched
    bad = cli("analyze", str(path), "--iteration-range", "(")
    assert bad.returncode != 0 and "--iteration-range='(' is not a regular expression" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_shapes_are_stored_as_json_text_and_old_key_is_read(store, tmp_path):
    t = decode_loop(n=2)
    t.cpu_op("aten::mm", 5 * MS, 1000, args={"Input dims": [[2, 3], [3, 4]]})  # 2021 spelling
    t.cpu_op("aten::relu", 6 * MS, 1000, args={"Input Dims": None})  # JSON null: absent
    (res,) = ingest_paths(store, [str(t.write(tmp_path / "s.pt.trace.json"))])
    job = JobData(store, store.traces(res.job_id))
    try:
        assert has_shapes(job)
        rows = dict(
            job.sql(
                "SELECT n.name, h.input_dims FROM host h JOIN names n USING (trace_id, name_id) "
                "WHERE h.kind = 'cpu_op' ORDER BY h.start_ns"
            ).fetchall()
        )
        types = job.sql(
            "SELECT DISTINCT input_types FROM host WHERE input_types IS NOT NULL"
        ).fetchall()
    finally:
        job.close()
    assert json.loads(rows["aten::mm"]) == [[2, 3], [3, 4]] and rows["aten::relu"] is None
    assert json.loads(rows["aten::embedding"])[:2] == [POSITIONS, [1]]  # the last one: positions
    assert [json.loads(t)[1] for (t,) in types] == ["long int"]


# --- the H200 captures (tools/capture/shapes_generate.py), against their truth files -----------


def sample(store, name: str):
    truth = json.loads((SAMPLES / name / f"{name}.truth.json").read_text())
    (res,) = ingest_paths(store, [str(SAMPLES / name / f"{name}.pt.trace.json.gz")])
    job = JobData(store, store.traces(res.job_id))
    try:
        result = inference.run(job, inference.SPEC.params({}))
        its = find_iterations(job, job.traces[0].trace_id, 0)
    finally:
        job.close()
    metrics = {m.name: m.value for m in result.metrics}
    return metrics, {f.evidence["key"]: f for f in result.findings}, its, truth


def within(value: float, truth: float, tolerance: float = 0.10) -> bool:
    return abs(value - truth) <= tolerance * truth


@pytest.mark.parametrize("name", ["shapes_decode", "shapes_generate"])
def test_unannotated_captures_against_truth(store, name):
    metrics, findings, its, truth = sample(store, name)
    expected = truth["expected_iterations"]
    assert its.source == "shapes"
    assert metrics["decode_iterations"] == expected["decode"]
    assert metrics["prefill_iterations"] == expected["prefill"]
    assert set(its.batch) == {expected["batch"]}
    decode = its.of_phase("decode")
    assert set(its.tokens[decode]) == {expected["decode_tokens_per_iteration"]}
    tpot = truth["measured"]["tpot"]["median_ns"]  # CUDA events, unprofiled
    assert within(metrics["decode_iter_ms_median"] * MS, tpot)
    assert within(metrics["tokens_per_s"], truth["measured"]["tokens_per_s"])
    if expected["prefill"]:
        prefill = its.of_phase("prefill")
        assert set(its.tokens[prefill]) == {expected["prefill_tokens_per_iteration"]}
        assert within(
            metrics["prefill_ms_median"] * MS, truth["measured"]["prefill_gpu"]["median_ns"]
        )
    assert metrics["decode_gpu_busy_pct"] >= 90  # GPU-bound, as the trace read-back says
    assert set(findings) == {"iterations"}  # static batching: nothing holds the decode back
