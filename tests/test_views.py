"""Dashboard views built from reports: findings grouped across ranks."""

from __future__ import annotations


def test_the_same_finding_on_several_ranks_is_one_group():
    from stallscope.views import grouped_findings

    def finding(rank, severity, impact, cause="cpu", analyzer="gpu_idle"):
        return {"rank": rank, "device": rank, "severity": severity, "impact_ns": impact,
                "analyzer": analyzer, "evidence": {"key": cause, "cause": cause}}  # fmt: skip

    fs = [
        finding(0, "high", 5), finding(1, "high", 9), finding(2, "medium", 4),
        finding(1, "critical", 1, "dataloader"), finding(0, "info", 0, None, "utilization"),
        finding(1, "info", 0, None, "utilization"),
    ]  # fmt: skip
    groups = grouped_findings(fs)
    assert [[(g["rank"], g["severity"]) for g in group] for group in groups] == [
        [(1, "critical")],  # worst first
        [(1, "high"), (0, "high")],  # same analyzer, severity and kind: one group, worst first
        [(2, "medium")],  # another severity: its own group
        [(0, "info")],  # info findings are never grouped
        [(1, "info")],
    ]
