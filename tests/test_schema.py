"""The declared schema (stallscope/schema.py) is the one the parsers write, the store shows and
docs/schema.md documents; the format registry agrees with it."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections import defaultdict

import pyarrow.parquet as pq
import pytest

from stallscope import schema
from stallscope.ingest import ingest_paths
from stallscope.ingest.canonical import CanonicalTrace, conform
from stallscope.ingest.formats import PROVIDES
from stallscope.ingest.registry import FORMATS
from tests.conftest import REPO, SAMPLES


def test_docs_column_tables_are_generated_from_the_schema():
    out = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_schema_docs.py"), "--check"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr


def test_the_docs_check_fails_on_drift(tmp_path):
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import gen_schema_docs
    finally:
        sys.path.pop(0)
    text = (REPO / "docs" / "schema.md").read_text()
    assert gen_schema_docs.render(text) == text
    drifted = text.replace("| sm_count | int32 |", "| sm_count | int64 |")
    assert drifted != text and gen_schema_docs.render(drifted) == text
    with pytest.raises(SystemExit, match="none for \\['threads'\\]"):
        gen_schema_docs.render(text.replace("<!-- columns: threads -->", "<!-- gone -->"))


@pytest.mark.parametrize("doc", ["api.md", "security.md", "dashboard.md"])
def test_documents_that_list_the_tables_list_every_one(doc):
    text = (REPO / "docs" / doc).read_text()
    missing = [name for name in schema.TABLE_NAMES if f"`{name}`" not in text]
    assert not missing, f"docs/{doc} does not list {missing}"


def test_the_declaration_is_well_formed():
    formats = {f.source for f in FORMATS}
    for table in schema.TABLES:
        names = table.column_names
        assert len(set(names)) == len(names), table.name
        assert names[0] == "trace_id", table.name
        assert set(table.formats) <= formats, table.name
        for column in table.columns:
            assert column.type in schema.TYPES, (table.name, column.name)
            assert column.meaning.strip(), (table.name, column.name)
            assert set(table.filled_by(column)) <= set(table.formats), (table.name, column.name)


def test_canonical_trace_holds_every_declared_table_and_no_other():
    """Tables by declared name (attributes and keywords); an undeclared one is an error."""
    assert list(CanonicalTrace().tables()) == list(schema.TABLE_NAMES)
    with pytest.raises(TypeError, match="no declared table"):
        CanonicalTrace(not_a_table=None)
    trace = CanonicalTrace()
    with pytest.raises(AttributeError):
        trace.not_a_table  # noqa: B018
    empty = CanonicalTrace().tables()
    assert {name: t.schema for name, t in empty.items()} == {
        name: schema.arrow_schema(name) for name in schema.TABLE_NAMES
    }


def test_each_format_provides_what_the_schema_says_it_fills():
    """``provides`` of each registered format: a timeline for the timeline formats, and the
    tables the schema says it fills (added from the schema, never declared twice)."""
    assert PROVIDES == ("timeline",)
    for fmt in FORMATS:
        assert ("timeline" in fmt.provides) == (fmt.source in schema.TIMELINE), fmt.name
        for table in schema.TABLES:
            assert (table.name in fmt.provides) == (fmt.source in table.formats), fmt.name


def test_the_uploader_offers_every_formats_file_endings():
    from stallscope.targets import upload_extensions

    offered = upload_extensions()
    for fmt in FORMATS:
        assert fmt.extensions and set(fmt.extensions) <= set(offered), fmt.name
    assert {"gz", "zip"} <= set(offered) and len(offered) == len(set(offered))


def test_the_kineto_sql_writes_exactly_the_declared_columns():
    """Kineto's SQL is written column by column in the declared order (no conform needed)."""
    from stallscope.ingest.kineto.canonical import to_canonical
    from stallscope.ingest.kineto.decode import empty_decoded

    tables = to_canonical(empty_decoded(), "reference", 0).tables()
    assert {name: t.schema for name, t in tables.items()} == {
        name: schema.arrow_schema(name) for name in schema.TABLE_NAMES
    }


def test_conform_orders_fills_and_casts_to_the_declaration():
    import pyarrow as pa

    table = pa.table({"name": ["k"], "extra": [1], "name_id": pa.array([7], pa.int64())})
    out = conform("names", table)
    assert out.column_names == ["trace_id", "name_id", "name", "extra"]
    assert out.schema.field("name_id").type == pa.int32()
    assert out["trace_id"].to_pylist() == [None]


def test_empty_views_have_every_declared_column(store):
    con = store.ensure().connect()
    for table in schema.TABLES:
        described = con.execute(f"DESCRIBE {table.name}").fetchall()
        assert [(row[0], row[1]) for row in described] == [
            (c.name, schema.TYPES[c.type][0]) for c in table.columns
        ], table.name


@pytest.fixture(scope="module")
def sample_store(tmp_path_factory):
    """One trace or job of every format: Kineto (with memory events), nsys (one with memory
    usage events), ncu with its timeline, and a memory snapshot built in code."""
    from stallscope.store import Store
    from tests.test_memory import snapshot

    tmp = tmp_path_factory.mktemp("formats")
    store = Store(tmp / "store").ensure()
    snap = tmp / "snapshot.pickle"
    snap.write_bytes(pickle.dumps(snapshot()))
    for paths in (
        [SAMPLES / "kineto" / "ddp_overlap"],
        [SAMPLES / "kineto" / "memory_gpt" / "memory_gpt.pt.trace.json.gz"],
        [SAMPLES / "nsys" / "ddp_overlap.sqlite.gz"],
        [SAMPLES / "nsys" / "nsys_mem_churn.sqlite.gz"],  # CUDA memory usage events
        [SAMPLES / "kineto" / "occupancy" / "occupancy.pt.trace.json.gz",
         SAMPLES / "ncu" / "occupancy.raw.csv", SAMPLES / "ncu" / "occupancy.details.csv"],
        [snap],
    ):  # fmt: skip
        ingest_paths(store, [str(p) for p in paths])
    return store


def test_every_format_writes_the_declared_schema(sample_store):
    refs = sample_store.traces()
    assert {r.meta["source"] for r in refs} == {f.source for f in FORMATS}
    for ref in refs:
        for name in schema.TABLE_NAMES:
            written = pq.read_schema(ref.table_path(name)).remove_metadata()
            assert written.equals(schema.arrow_schema(name)), (ref.meta["source"], name)


def test_formats_fill_only_the_columns_declared_for_them(sample_store):
    """A value in a column the schema does not say a format fills fails (declare it there)."""
    con = sample_store.connect()
    seen = defaultdict(set)
    for table in schema.TABLES:
        for column in table.columns:
            rows = con.execute(
                f"SELECT DISTINCT c.source FROM {table.name} t JOIN catalog c USING (trace_id) "
                f'WHERE t."{column.name}" IS NOT NULL'
            ).fetchall()
            for (source,) in rows:
                seen[source].add(table.name)
                assert source in table.filled_by(column), (table.name, column.name, source)
    # and the samples do exercise every format's tables
    assert seen["kineto"] >= {"gpu", "host", "ranges", "collectives", "names", "memory"}
    assert seen["nsys"] >= {"gpu", "host", "ranges", "collectives", "devices", "memory"}
    assert seen["ncu"] >= {"kernel_metrics", "names", "devices"}
    assert seen["memory-snapshot"] == {"memory"}


# -- the catalog (meta.json fields, the ``catalog`` table) -------------------------------------
def test_the_store_catalog_table_is_the_declared_one(sample_store):
    con = sample_store.connect()
    try:
        described = [(row[0], row[1]) for row in con.execute("DESCRIBE catalog").fetchall()]
        rows = con.execute("SELECT * FROM catalog ORDER BY trace_id").fetchall()
    finally:
        con.close()
    assert described == list(schema.CATALOG_COLUMNS)
    metas = sorted((r.meta for r in sample_store.traces()), key=lambda m: m["trace_id"])
    names = [name for name, _ in schema.CATALOG_COLUMNS]
    assert [dict(zip(names, row, strict=True)) for row in rows] == [
        {name: meta.get(name) for name in names} for meta in metas
    ]


_PY_TYPES = {"string": str, "int32": int, "int64": int, "double": (int, float), "bool": bool,
             "list": list}  # fmt: skip


def test_every_meta_json_field_is_declared_with_its_type(sample_store):
    """What ingest writes into meta.json and the declared catalog agree, both ways."""
    declared = {f.name: f for f in schema.CATALOG if not f.job}
    for ref in sample_store.traces():
        meta = json.loads((ref.path / "meta.json").read_text())
        assert set(meta) == set(declared), (ref.meta["source"], set(meta) ^ set(declared))
        for name, value in meta.items():
            wanted = _PY_TYPES[declared[name].type]
            assert value is None or isinstance(value, wanted), (name, value)


def test_the_catalog_docs_are_generated_and_checked(tmp_path):
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import gen_schema_docs
    finally:
        sys.path.pop(0)
    text = (REPO / "docs" / "schema.md").read_text()
    drifted = text.replace("| span_ns | int64 | yes |", "| span_ns | int32 | yes |")
    assert drifted != text and gen_schema_docs.render(drifted) == text
    with pytest.raises(SystemExit, match="catalog"):
        gen_schema_docs.render(text.replace("<!-- catalog -->", "<!-- gone -->"))
