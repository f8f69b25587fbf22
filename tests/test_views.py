"""Dashboard views built from reports: findings grouped across ranks."""

from __future__ import annotations


def test_the_same_finding_on_several_ranks_is_one_group():
    from stallscope.views import grouped_findings

    def finding(rank, severity, impact, cause="cpu", analyzer="gpu_idle"):
        return {"rank": rank, "device": rank, "severity": severity, "impact_ns": impact,
                "analyzer": analyzer, "evidence": {"key": cause, "cause": cause}}  # fmt: skip

    fs = [
        finding(0, "high", 5), finding(1, "high", 9), finding(2, "medium", 4),
        finding(1, "critical", 1, "dataloader"), finding(1, "info", 0, None, "utilization"),
        finding(0, "info", 0, None, "utilization"),
    ]  # fmt: skip
    groups = grouped_findings(fs)
    assert [[(g["rank"], g["severity"]) for g in group] for group in groups] == [
        [(1, "critical")],  # worst first
        [(1, "high"), (0, "high"), (2, "medium")],  # same analyzer and kind: one group, worst first
        [
            (0, "info"),
            (1, "info"),
        ],  # per-device facts group with each other (ties: lowest rank first)
    ]


def test_an_info_finding_never_joins_a_problem_of_the_same_kind_nor_another_job():
    from stallscope.views import grouped_findings

    def finding(trace, severity, impact):
        return {"trace": trace, "rank": 0, "device": 0, "severity": severity,
                "impact_ns": impact, "analyzer": "nccl_wait", "evidence": {}}  # fmt: skip

    fs = [finding("a", "high", 9), finding("b", "info", 0), finding("c", "high", 3)]
    assert [len(g) for g in grouped_findings(fs)] == [2, 1]
    groups = grouped_findings(fs, jobs={"a": "job1", "b": "job1", "c": "job2"})
    assert [[f["trace"] for f in g] for g in groups] == [["a"], ["c"], ["b"]]
