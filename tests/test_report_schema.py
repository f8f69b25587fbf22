"""The report contract's JSON Schema (docs/report-schema.json): generated from the
types, current, and every report we write (goldens, samples) validates against it.

Two validators read each report: ``jsonschema`` (draft 2020-12) against the strict
form of the schema, and msgspec decoding into the Structs of
stallscope/report_types.py with strict types. Both must reject a key the contract
does not know, a missing required key and a value of the wrong type. The shipped
file is the open form: it accepts keys it does not know (the contract grows by
additive keys, and a consumer's older copy must accept a newer report).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import msgspec
import pytest

from stallscope.ingest import ingest_paths
from stallscope.render import render
from stallscope.report import build_report
from stallscope.report_types import CriticalPathStep, decode_report, json_schema
from stallscope.store import Store
from tests.conftest import SAMPLES

REPO = Path(__file__).resolve().parents[1]
SCHEMA_FILE = REPO / "docs" / "report-schema.json"
GOLDEN_REPORTS = sorted((REPO / "tests" / "golden").glob("*.json"))


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json_schema(strict=True)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def shipped() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors(validator, report: dict) -> list[str]:
    """Why ``report`` breaks the contract, per both validators (empty: it holds)."""
    found = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(report)]
    try:
        decoded = decode_report(json.dumps(report))
        for finding in decoded.findings:
            msgspec.convert(finding.evidence.get("critical_path", []), list[CriticalPathStep])
    except msgspec.ValidationError as exc:
        found.append(f"msgspec: {exc}")
    return found


def test_schema_file_is_generated_from_the_types():
    out = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_report_schema.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(SCHEMA_FILE.read_text()) == json_schema()


def test_schema_requires_the_contract_keys():
    defs = json_schema()["$defs"]
    assert defs["Report"]["required"] == ["schema", "traces", "metrics", "findings"]
    finding = defs["FindingEntry"]
    # saving_ns (added 2026-12-01) and the lists with defaults are optional; the rest required
    assert set(finding["required"]) == set(finding["properties"]) - {
        "saving_ns",
        "evidence",
        "windows",
    }
    assert "warnings" not in defs["TraceEntry"]["required"]  # added 2026-11-30
    assert not any("additionalProperties" in d for d in defs.values())  # shipped: open
    strict = json_schema(strict=True)["$defs"]
    assert all(d["additionalProperties"] is False for d in strict.values())


@pytest.mark.parametrize("path", GOLDEN_REPORTS, ids=lambda p: p.name)
def test_golden_reports_validate(validator, shipped, path):
    text = path.read_text()
    report = json.loads(text)
    assert errors(validator, report) == []
    assert list(shipped.iter_errors(report)) == []
    # the typed report writes the same JSON back
    assert render(decode_report(text).to_dict(), "json") == text


def test_golden_reports_were_found():
    assert [p.name for p in GOLDEN_REPORTS] == ["report.json"]


@pytest.fixture
def golden() -> dict:
    return json.loads((REPO / "tests" / "golden" / "report.json").read_text())


def _break(report: dict, how: str) -> dict:
    bad = copy.deepcopy(report)
    finding, trace, metric = bad["findings"][0], bad["traces"][0], bad["metrics"][0]
    if how == "unknown finding key":
        finding["confidence"] = 0.5
    elif how == "unknown top-level key":
        bad["generated_at"] = "today"
    elif how == "unknown device key":
        trace["devices"][0]["memory_bytes"] = 1
    elif how == "missing title":
        del finding["title"]
    elif how == "missing metric unit":
        del metric["unit"]
    elif how == "missing traces":
        del bad["traces"]
    elif how == "impact as text":
        finding["impact_ns"] = "12"
    elif how == "impact as float":
        finding["impact_ns"] = 1.5
    elif how == "unknown severity":
        finding["severity"] = "urgent"
    elif how == "window of three":
        finding["windows"] = [[1, 2, 3]]
    elif how == "metric value as text":
        metric["value"] = "55%"
    elif how == "other schema":
        bad["schema"] = "stallscope.report/2"
    elif how == "bad critical path":
        finding["evidence"]["critical_path"] = [{"step": 0, "time_ns": 5, "segments": [{}]}]
    return bad


@pytest.mark.parametrize(
    "how",
    [
        "unknown finding key",
        "unknown top-level key",
        "unknown device key",
        "missing title",
        "missing metric unit",
        "missing traces",
        "impact as text",
        "impact as float",
        "unknown severity",
        "window of three",
        "metric value as text",
        "other schema",
        "bad critical path",
    ],
)
def test_a_broken_report_fails_both_validators(validator, golden, how):
    bad = _break(golden, how)
    assert list(validator.iter_errors(bad)), how
    found = errors(validator, bad)
    assert any(e.startswith("msgspec:") for e in found), (how, found)


def test_the_shipped_schema_accepts_a_newer_report_with_an_added_key(shipped, golden):
    newer = copy.deepcopy(golden)
    newer["findings"][0]["confidence"] = 0.5  # a key a later /1 might add
    newer["generated_by"] = "stallscope 9.9"
    assert list(shipped.iter_errors(newer)) == []
    # while a wrong type or a missing key still fails it
    del newer["findings"][0]["title"]
    assert list(shipped.iter_errors(newer))


def test_a_report_from_before_the_additive_keys_validates(validator, golden):
    """Reports written before `warnings` and `saving_ns` were added still hold the contract."""
    old = copy.deepcopy(golden)
    for trace in old["traces"]:
        del trace["warnings"]
    for finding in old["findings"]:
        del finding["saving_ns"]
    assert errors(validator, old) == []


def _sample_report(tmp_path: Path, scenarios: list[str]) -> dict:
    store = Store(tmp_path / "store").ensure()
    jobs = []
    for scenario in scenarios:
        files = sorted(str(p) for p in (SAMPLES / "kineto" / scenario).glob("*.pt.trace.json.gz"))
        (res,) = ingest_paths(store, files)
        jobs.append(store.traces(res.job_id))
    return json.loads(render(build_report(store, jobs), "json"))


def test_a_two_rank_report_with_its_critical_path_validates(validator, tmp_path):
    if not (SAMPLES / "kineto" / "ddp_straggler").is_dir():
        pytest.skip("sample_traces/kineto/ddp_straggler is absent")
    report = _sample_report(tmp_path, ["ddp_straggler"])
    assert errors(validator, report) == []
    paths = [
        f["evidence"]["critical_path"]
        for f in report["findings"]
        if "critical_path" in f["evidence"]
    ]
    assert paths and paths[0] and paths[0][0]["segments"]  # the typed table is really there
    # and the schema reads it: a segment without its rank fails
    del paths[0][0]["segments"][0]["rank"]
    assert list(validator.iter_errors(report))


@pytest.mark.slow
def test_every_sample_report_validates(validator, tmp_path):
    scenarios = sorted(p.name for p in (SAMPLES / "kineto").iterdir() if p.is_dir())
    if not scenarios:
        pytest.skip("sample_traces/kineto is absent")
    report = _sample_report(tmp_path, scenarios)
    assert len({t["job"] for t in report["traces"]}) == len(scenarios)
    assert errors(validator, report) == []
