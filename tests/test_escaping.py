"""Names from traces and visitors are shown literally: never Markdown images, links or HTML."""

from __future__ import annotations

import re

import pytest

from stallscope.ingest import ingest_paths
from stallscope.pages.text import code_span, finding_text, literal
from stallscope.render import render_markdown
from stallscope.report import build_report
from tests.kineto_builder import KinetoTrace
from tests.test_pages import fresh_caches, page  # noqa: F401 (fixture)

HOSTILE = "<img src=x onerror=alert(1)>![p](http://127.0.0.1:9/p.png)[link](http://127.0.0.1:9/)"
# HOSTILE's image, link or tag where Markdown would act on it (not backslash-escaped).
ACTIVE = re.compile(r"(?<!\\)!(?<!\\)\[p|(?<!\\)\[link|(?<!\\)<img")
# A code span as pages.text.code_span writes it (its content is never parsed).
CODE_SPAN = re.compile(r"(`+) .*? \1(?!`)")


def active(text: str) -> re.Match | None:
    """HOSTILE's image, link or tag where Markdown would act on it: outside code spans."""
    return ACTIVE.search(CODE_SPAN.sub("", text))


def hostile_trace() -> KinetoTrace:
    """A long kernel with a hostile name, idle gaps around short ones: findings name it."""
    t = KinetoTrace()
    t.kernel(HOSTILE, 0, 8_000_000, grid=(1, 1, 1), block=(32, 1, 1), smem=200_000)
    for i in range(40):
        t.kernel("relu", 9_000_000 + i * 100_000, 2_000)
    t.step(0, 0, 13_000_000)
    return t


@pytest.fixture
def hostile_store(store, tmp_path, monkeypatch):
    path = hostile_trace().write(tmp_path / "t.pt.trace.json")
    ingest_paths(store, [str(path)], tags=[HOSTILE], uploaded_by=HOSTILE, notes=HOSTILE)
    monkeypatch.setenv("STALLSCOPE_STORE", str(store.root))
    return store


def test_literal_escapes_markdown_and_html():
    assert not ACTIVE.search(literal(HOSTILE))
    assert literal("a_b*c") == "a\\_b\\*c"


def test_markdown_report_prints_names_as_text(hostile_store):
    report = build_report(hostile_store, [hostile_store.traces()])
    text = render_markdown(report)
    assert "img src" in text or "p.png" in text or report["findings"]  # the name reached the report
    assert not ACTIVE.search(text)


@pytest.mark.parametrize("name", ["overview", "kernels", "occupancy", "library", "timeline"])
def test_pages_show_hostile_names_literally(hostile_store, name):
    job_id = hostile_store.jobs()[0]["job_id"]
    trace = hostile_store.traces(job_id)[0].trace_id
    query = {"event": f"{trace}|gpu|0|7|0"} if name == "timeline" else {}  # the hostile kernel
    at = page(name, job=job_id, **query)
    assert not at.exception
    shown = [m.value for m in at.markdown] + [c.value for c in at.caption]
    shown += (
        [e.label for e in at.expander] + [w.value for w in at.warning] + [e.value for e in at.error]
    )
    shown += [h.value for h in at.subheader]
    assert shown
    for text in shown:
        assert not active(str(text)), text


def test_timeline_names_the_selected_hostile_kernel_literally(hostile_store):
    job_id = hostile_store.jobs()[0]["job_id"]
    trace = hostile_store.traces(job_id)[0].trace_id
    at = page("timeline", job=job_id, event=f"{trace}|gpu|0|7|0")
    assert not at.exception
    (title,) = [h.value for h in at.subheader]
    assert title.startswith("Selected: ") and "[p" in title and not ACTIVE.search(title)


def test_literal_breaks_bare_urls():
    """GFM autolinks bare URLs after parsing (escapes are gone by then): a zero-width space
    inside ``://`` and after ``www`` leaves no URL to link."""
    text = literal("see http://127.0.0.1:9/x and WWW.example.com")
    assert "://" not in text and "WWW." not in text
    assert (
        text.replace("\u200b", "").replace("\\", "")
        == "see http://127.0.0.1:9/x and WWW.example.com"
    )


def test_code_span_is_one_span_whatever_the_backticks():
    """The SQL page's messages: one code span, its fence longer than any backtick run inside."""
    assert code_span("![x](http://h/i.png) <img>") == "` ![x](http://h/i.png) <img> `"
    assert code_span("a `b` ``c``\nd") == "``` a `b` ``c`` d ```"
    assert code_span(ValueError("no `x`")) == "`` no `x` ``"


def test_the_sql_page_has_no_escaper_of_its_own():
    """One function per purpose: the SQL page uses pages.text's code span, not a copy."""
    import stallscope.pages.sql as sql_page

    assert sql_page.code_span is code_span
    assert not hasattr(sql_page, "literal")


def test_finding_text_shows_quoted_names_as_code_and_escapes_the_rest():
    text = finding_text(f"host in `{HOSTILE}` (31 ms), then {HOSTILE}; fix `a_b`")
    assert not active(text)
    spans = [m.group(0) for m in CODE_SPAN.finditer(text)]
    assert spans == [code_span(HOSTILE), code_span("a_b")]  # the quoted names, verbatim
    assert literal(HOSTILE) in text  # the unquoted one, escaped
    assert finding_text("no quotes_here") == literal("no quotes_here")
    assert finding_text("a lone ` backtick") == literal("a lone ` backtick")
