"""Library page: upload traces and browse the store."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import streamlit as st

from stallscope.errors import StallscopeError
from stallscope.pages.state import get_store


def render() -> None:
    st.title("Library")
    store = get_store()
    with st.form("upload", clear_on_submit=True):
        files = st.file_uploader(
            "Drop the trace files of one job (all ranks), or a .zip",
            accept_multiple_files=True,
            type=["json", "gz", "zip"],
        )
        tags = st.text_input("Tags (comma separated)")
        submitted = st.form_submit_button("Ingest")
    if submitted and files:
        _ingest_uploads(store, files, [t.strip() for t in tags.split(",") if t.strip()])
    jobs = store.jobs()
    if not jobs:
        st.info("The store is empty: upload a PyTorch profiler trace above.")
        return
    for job in jobs:
        cols = st.columns([4, 2, 2, 1])
        cols[0].markdown(
            f"**{job.get('name')}**  \n`{job['job_id']}` · {', '.join(job.get('tags', []))}"
        )
        cols[1].write(f"{len(job.get('trace_ids', []))} rank(s)")
        cols[2].write((job.get("uploaded_at") or "")[:16].replace("T", " "))
        cols[3].markdown(f"[Open](overview?job={job['job_id']})")


def _ingest_uploads(store, files, tags: list[str]) -> None:
    from stallscope.ingest import ingest_paths

    folder = Path(tempfile.mkdtemp(prefix="stallscope-upload-"))
    try:
        paths = []
        for upload in files:
            target = folder / Path(upload.name).name
            target.write_bytes(upload.getbuffer())
            paths.append(str(target))
        results = ingest_paths(store, paths, tags=tags, uploaded_by="browser")
    except StallscopeError as exc:
        st.error(str(exc).replace(str(folder) + "/", ""))
        return
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for r in results:
        st.success(
            f"{'Already stored' if r.existed else 'Ingested'}: job {r.job_id} ({len(r.trace_ids)} trace(s))"
        )
