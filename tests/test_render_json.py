"""render_json: the same text as json.dumps(indent=2), by a faster route."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from stallscope.render import render, render_json

GOLDEN = Path(__file__).parent / "golden" / "report.json"

CASES = [
    {"a": 1e-05, "b": 1e16, "c": 0.1, "d": -0.0, "e": 2**63 + 1},
    {"text": 'é ✓ "quoted" back\\slash\nnew line\ttab \u0001', "ключ": "значение"},
    {"empty_list": [], "empty_dict": {}, "nested": [1, {"x": None, "y": [[], {}]}], "t": True},
    [1, 2.5, "three", None, False],
    {"nan": math.nan, "inf": math.inf, "ninf": -math.inf},  # json.dumps' own path
]


@pytest.mark.parametrize("value", CASES)
def test_same_text_as_json_dumps(value):
    assert render_json(value) == json.dumps(value, indent=2) + "\n"


def test_the_golden_report_byte_for_byte():
    report = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert render(report, "json") == json.dumps(report, indent=2) + "\n"
