"""Library page: upload a job's traces, browse, search, tag and delete jobs.

Each job's worst finding, step time, GPU busy and time per token come from its stored report
(``stallscope.report_store``): a job without one says "not analyzed yet" and is analyzed
when it is first opened (never by this page)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pandas as pd
import streamlit as st

from stallscope.errors import StallscopeError
from stallscope.humanize import MISSING, significant
from stallscope.pages.spec import PageSpec
from stallscope.pages.state import get_store, jobs, max_upload_mb, stored_summaries
from stallscope.pages.text import literal
from stallscope.targets import upload_extensions

# Each registered format's endings (json, sqlite, nsys-rep, csv, ncu-rep, pickle...) plus gz
# and zip; reports need nsys/ncu on the server; pickles (CUDA memory snapshots) are read
# as plain data.
ACCEPTED = upload_extensions()


PAGE = PageSpec("Library", "", order=10, needs=())


def render() -> None:
    st.title("Library")
    _upload_form()
    _job_list()


def _upload_form() -> None:
    with st.expander("Upload traces", expanded=not jobs()):
        # A fresh form after a success; after an error the same one, fields kept.
        form = f"upload_{st.session_state.get('upload_form', 0)}"
        with st.form(form, clear_on_submit=False):
            files = st.file_uploader(
                f"Drop the trace files of one job (all its ranks), or one .zip — up to {max_upload_mb()} MB per file",
                accept_multiple_files=True,
                type=ACCEPTED,
            )
            cols = st.columns([2, 2, 2, 2])
            name = cols[0].text_input(
                "Job name", placeholder="default: the files' common name or the zip's"
            )
            user = cols[1].text_input("Your name", value=st.session_state.get("uploader", ""))
            tags = cols[2].text_input("Tags (comma separated)")
            each = cols[3].checkbox("Unrelated files (one job each)")
            notes = st.text_area("Notes", height=70)
            submitted = st.form_submit_button("Ingest", type="primary")
        _quota_caption()
        if submitted:
            st.session_state["uploader"] = user
            if not files:
                st.warning("Choose at least one file first.")
            elif each and name.strip() and len(files) > 1:
                st.warning("A job name names one job: leave it empty for unrelated files.")
            else:
                tag_list = [t.strip() for t in tags.split(",") if t.strip()]
                if _ingest(files, user, tag_list, notes, each, name.strip()):
                    st.session_state["upload_form"] = st.session_state.get("upload_form", 0) + 1


def _quota_caption() -> None:
    """This user's upload quota (the gate's accounting) and why their last upload was refused,
    when the server runs the gate."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    from stallscope.access import MB
    from stallscope.pages import gate
    from stallscope.pages.main import session_cookie

    keeper, ctx = gate.current(), get_script_run_ctx()
    if keeper is None or ctx is None:
        return
    user = keeper.upload_user(keeper.session(session_cookie()), ctx.session_id)
    quota = keeper.quota
    refusal = keeper.last_refusal(user, time.time())
    if refusal:
        st.warning(refusal)
    st.caption(
        f"Your upload quota: {quota.used_bytes(user) / MB:,.0f} of {quota.limit_bytes / MB:,.0f} MB "
        f"used in the last {quota.window_s // 60} min; at most {quota.max_files} files held at once."
    )


def _save_uploads(files, folder: Path) -> list[str]:
    """Write each upload into a folder of its own: same-named files never overwrite each other."""
    paths = []
    for index, upload in enumerate(files):
        target = folder / str(index) / Path(upload.name).name
        target.parent.mkdir()
        target.write_bytes(upload.getbuffer())
        paths.append(str(target))
    return paths


def _ingest(files, user: str, tags: list[str], notes: str, each: bool, name: str) -> bool:
    """Ingest the uploads in a child process; True when every job is stored."""
    from stallscope.ingest_child import ingest_in_child

    folder = Path(tempfile.mkdtemp(prefix="stallscope-upload-"))
    error = None
    with st.status(f"Ingesting {len(files)} file(s)…", expanded=True) as status:
        try:
            paths = _save_uploads(files, folder)

            def progress(label: str, done: int, total: int) -> None:
                status.update(label=f"{literal(label)} ({done + 1}/{total})")

            results = ingest_in_child(  # a child process: a huge file cannot take the server down
                str(get_store().root),
                paths,
                each=each,
                uploaded_by=user or "browser",
                tags=tags,
                notes=notes,
                name=name or None,
                upload_root=str(folder),
                progress=progress,
            )
        except StallscopeError as exc:
            status.update(label="Upload refused: the store is unchanged", state="error")
            error = str(exc).replace(str(folder) + "/", "")
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        if error is None:
            status.update(label="Done", state="complete")
    if error is not None:
        st.error(literal(error))
        return False
    for r in results:
        verb = "Already stored; your upload was recorded" if r.existed else "Ingested"
        st.success(f"{verb}: {literal(r.job_name)} — job `{r.job_id}`, {len(r.trace_ids)} rank(s)")
        _link("overview", "Open its overview", {"job": r.job_id})
        for warning in r.warnings:
            st.caption(f"⚠ {literal(warning)}")
    return True


def _job_list() -> None:
    all_jobs = jobs()
    if not all_jobs:
        st.info("The store is empty: upload a PyTorch profiler trace above.")
        return
    cols = st.columns([3, 2])
    query = cols[0].text_input("Search", placeholder="name, id, uploader, tag, note", key="search")
    every_tag = sorted({t for j in all_jobs for t in j.get("tags", [])})
    wanted_tags = cols[1].multiselect("Tags", every_tag)
    shown = [j for j in all_jobs if _matches(j, query, wanted_tags)]
    summaries = stored_summaries(shown)  # stored reports only: never an analysis here
    table = pd.DataFrame(
        [
            {
                "open": f"overview?job={j['job_id']}",
                "name": j.get("name"),
                "job": j["job_id"],
                **_report_columns(summaries.get(j["job_id"])),
                "ranks": len(j.get("trace_ids", [])),
                "source": ", ".join(j.get("sources", [])),
                "uploaded by": ", ".join(j.get("uploaders") or [j.get("uploaded_by") or ""]),
                "uploaded": (j.get("uploaded_at") or "")[:16].replace("T", " "),
                "tags": ", ".join(j.get("tags", [])),
            }
            for j in shown
        ]
    )
    # numbers (NaN when missing): sorted as numbers, shown as —; Streamlit's default number
    # format prints up to 4 decimals, trailing zeros trimmed ("plain" prints float noise)
    for column in NUMBER_COLUMNS:
        if column in table:
            table[column] = significant(table[column].tolist())
    st.caption(f"{len(shown)} of {len(all_jobs)} jobs")
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        placeholder=MISSING,
        column_config={
            "open": st.column_config.LinkColumn("open", display_text="overview"),
            "step ms": st.column_config.NumberColumn(
                "step ms",
                help="Median step time of the slowest rank (as on its Overview)",
            ),
            "GPU busy %": st.column_config.NumberColumn(
                "GPU busy %", help="Over every rank and GPU, span-weighted"
            ),
            "ms/token": st.column_config.NumberColumn(
                "ms/token", help="Inference jobs: median time per output token"
            ),
        },
    )
    if message := st.session_state.pop("deleted", None):
        st.success(message)
    _manage(shown)


NOT_ANALYZED = "not analyzed yet"
# From the stored report's summary, to 3 significant digits; — where a job has none.
NUMBER_COLUMNS = ("step ms", "GPU busy %", "ms/token")


def _report_columns(summary: dict | None) -> dict:
    """The Library's report columns from a stored report's summary (None: not analyzed yet)."""
    if summary is None:
        return {"worst": NOT_ANALYZED, "step ms": None, "GPU busy %": None, "ms/token": None}
    worst = summary.get("worst_severity")
    return {
        "worst": f"{worst} ({summary.get('worst_count', 0)})" if worst else "no findings",
        "step ms": summary.get("step_ms_median"),
        "GPU busy %": summary.get("gpu_busy_pct"),
        "ms/token": summary.get("tpot_ms"),
    }


def _matches(job: dict, query: str, tags: list[str]) -> bool:
    if tags and not set(tags) <= set(job.get("tags", [])):
        return False
    if not query:
        return True
    haystack = " ".join(
        [str(job.get(k, "")) for k in ("name", "job_id", "uploaded_by", "notes")]
        + job.get("tags", [])
        + job.get("uploaders", [])
    )
    return query.lower() in haystack.lower()


def _manage(shown: list[dict]) -> None:
    if not shown:
        return
    with st.expander("Edit or delete a job"):
        names = {j["job_id"]: f"{j.get('name')} · {j['job_id']}" for j in shown}
        job_id = st.selectbox("Job", list(names), format_func=names.get, key="manage_job")
        job = next(j for j in shown if j["job_id"] == job_id)
        new_name = st.text_input("Name", value=job.get("name") or "", key=f"name_{job_id}")
        tags = st.text_input("Tags", value=", ".join(job.get("tags", [])), key=f"tags_{job_id}")
        notes = st.text_area("Notes", value=job.get("notes", ""), key=f"notes_{job_id}", height=70)
        if st.button("Save name, tags and notes"):
            get_store().annotate(job_id, tags=tags.split(","), notes=notes, name=new_name)
            st.rerun()
        _delete(job)


def _delete(job: dict) -> None:
    """Remove this user's upload of a job (its data goes with its last upload), or the job
    for everyone."""
    job_id, uploaders = job["job_id"], job.get("uploaders", [])
    st.caption(f"Uploaded by {literal(', '.join(uploaders))}")
    user = st.text_input(
        "Your name (whose upload to remove)",
        value=st.session_state.get("uploader", "") or "browser",
        key=f"remover_{job_id}",
    ).strip()
    everyone = st.checkbox(
        f"Delete job {job_id} for everyone ({len(uploaders)} uploader(s)), not just my upload",
        key=f"everyone_{job_id}",
    )
    confirm = st.checkbox(
        f"Yes, delete job {job_id} and all its ranks"
        if everyone or uploaders == [user]
        else f"Yes, remove {literal(user)}'s upload of job {job_id}",
        key=f"confirm_{job_id}",
    )
    if st.button("Delete", disabled=not confirm, type="secondary"):
        try:
            if everyone:
                get_store().delete_job(job_id)
                gone = True
            else:
                gone = get_store().remove_upload(job_id, user)
        except StallscopeError as exc:
            st.error(literal(str(exc)))
            return
        st.session_state["deleted"] = (
            f"Deleted job {job_id}."
            if gone
            else f"Removed {literal(user)}'s upload of job {job_id}."
        )
        st.rerun()


def _link(page: str, label: str, query: dict[str, str]) -> None:
    """A same-tab link to another page of the app (a plain link outside st.navigation)."""
    from stallscope.pages.main import page_for

    target = page_for(page)
    if isinstance(target, str):
        st.markdown(f"[{label}]({page}?{'&'.join(f'{k}={v}' for k, v in query.items())})")
    else:
        st.page_link(target, label=label, query_params=query)
