"""The store's sharing contract, with real processes.

* two ingests may run at the same time;
* a reader (what the dashboard does) sees only complete jobs while an ingest runs;
* a process killed mid-ingest leaves nothing visible, and the next ingest cleans up.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from stallscope.store import Store
from tests.kineto_builder import KinetoTrace


def big_trace(path: Path, kernels: int, rank: int) -> Path:
    t = KinetoTrace(rank=rank, world_size=2)
    for i in range(kernels):
        t.kernel(f"kernel_{i % 97}", i * 2_000, 1_500, stream=7 + i % 3)
    return t.write(path)


def spawn(*args: str, store: Path) -> subprocess.Popen:
    env = dict(os.environ, STALLSCOPE_STORE=str(store))
    return subprocess.Popen(
        [sys.executable, "-m", "stallscope.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def test_two_ingests_at_once(tmp_path):
    store_dir = tmp_path / "store"
    a = big_trace(tmp_path / "a.json", 40_000, 0)
    b = big_trace(tmp_path / "b.json", 40_000, 1)
    procs = [spawn("ingest", str(p), store=store_dir) for p in (a, b)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    refs = Store(store_dir).traces()
    assert len(refs) == 2 and all(r.meta["kernel_count"] == 40_000 for r in refs)
    assert not list((store_dir / "staging").iterdir())


READER = textwrap.dedent(
    """
    import json, sys, time
    from stallscope.store import Store
    from stallscope.jobdata import JobData
    store, deadline, seen, bad = Store(sys.argv[1]), time.time() + float(sys.argv[2]), set(), []
    while time.time() < deadline:
        for job in store.jobs():
            refs = store.traces(job["job_id"])
            if len(refs) != len(job["trace_ids"]):
                bad.append(("ranks", job["job_id"], len(refs)))
            data = JobData(store, refs)
            for ref in refs:
                n = data.sql("SELECT count(*) FROM gpu WHERE trace_id = ? AND kind = 'kernel'", [ref.trace_id]).fetchone()[0]
                if n != ref.meta["kernel_count"]:
                    bad.append(("rows", ref.trace_id, n))
                seen.add(ref.trace_id)
            data.close()
        if len(seen) >= int(sys.argv[3]):
            break
        time.sleep(0.01)
    print(json.dumps({"seen": sorted(seen), "bad": bad}))
    """
)


def test_reader_sees_only_complete_jobs_while_ingest_runs(tmp_path):
    store_dir = tmp_path / "store"
    Store(store_dir).ensure()
    job = tmp_path / "job"
    job.mkdir()
    for rank in range(2):
        big_trace(job / f"rank{rank}.json", 30_000, rank)
    single = big_trace(tmp_path / "single.json", 30_000, 0)
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(store_dir), "240", "3"],
        stdout=subprocess.PIPE,
        text=True,
    )
    ingests = [
        spawn("ingest", str(job), store=store_dir),
        spawn("ingest", str(single), store=store_dir),
    ]
    for proc in ingests:
        proc.communicate(timeout=300)
        assert proc.returncode == 0
    out, _ = reader.communicate(timeout=300)
    result = json.loads(out)
    assert result["bad"] == []
    assert len(result["seen"]) == 3


def test_killed_ingest_leaves_nothing_visible(tmp_path):
    store_dir = tmp_path / "store"
    trace = big_trace(tmp_path / "big.json", 150_000, 0)
    proc = spawn("ingest", str(trace), store=store_dir)
    staging = store_dir / "staging"
    deadline = time.time() + 120
    while time.time() < deadline and not (staging.is_dir() and any(staging.iterdir())):
        time.sleep(0.005)
    if proc.poll() is not None:
        pytest.fail("ingest finished before it could be killed; make the trace bigger")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    store = Store(store_dir)
    assert store.traces() == [] and store.jobs() == []
    assert any(staging.iterdir())  # the dead process's leftovers are still there...
    small = KinetoTrace()
    small.kernel("k", 0, 10)
    done = spawn("ingest", str(small.write(tmp_path / "small.json")), store=store_dir)
    done.communicate(timeout=120)
    assert done.returncode == 0
    assert not any(staging.iterdir())  # ...until the next ingest removes them
    assert len(store.traces()) == 1


def _lease(folder: Path, host: str, pid: int, age_s: float) -> None:
    folder.mkdir(parents=True)
    beat = time.time() - age_s
    (folder / ".lease").write_text(json.dumps({"host": host, "pid": pid, "heartbeat": beat}))
    os.utime(folder / ".lease", (beat, beat))


def test_staging_ownership_is_a_lease_not_a_local_pid(tmp_path, monkeypatch):
    """Another host's ingest is never removed while its heartbeat is fresh, whatever its pid."""
    from stallscope.store import host_id

    monkeypatch.setenv("STALLSCOPE_STAGING_STALE_S", "60")
    store = Store(tmp_path / "store").ensure()
    dead_pid = 2**22 + 12345  # above pid_max on common systems: surely not running here
    other_fresh = store.staging_dir / f"{dead_pid}-other-fresh"
    other_stale = store.staging_dir / f"{dead_pid}-other-stale"
    mine_dead = store.staging_dir / f"{dead_pid}-mine-dead"
    mine_alive = store.staging_dir / f"{os.getpid()}-mine-alive"
    _lease(other_fresh, "other-host|boot|pid:[1]", dead_pid, age_s=5)
    _lease(other_stale, "other-host|boot|pid:[1]", dead_pid, age_s=120)
    _lease(mine_dead, host_id(), dead_pid, age_s=5)
    _lease(mine_alive, host_id(), os.getpid(), age_s=5)
    store.clean_stale()
    left = sorted(p.name for p in store.staging_dir.iterdir())
    assert left == sorted([other_fresh.name, mine_alive.name])


def test_lease_heartbeat_is_refreshed_while_ingesting(tmp_path, monkeypatch):
    from stallscope import store as store_module

    monkeypatch.setattr(store_module, "HEARTBEAT_S", 0.05)
    store = Store(tmp_path / "store")
    staging = store.new_staging()
    first = json.loads((staging / ".lease").read_text())["heartbeat"]
    time.sleep(0.3)
    later = json.loads((staging / ".lease").read_text())["heartbeat"]
    assert later > first
    store.discard(staging)
    assert not staging.exists()


def test_repeatedly_killed_ingests_leave_a_consistent_store_and_no_temp_files(tmp_path):
    """SIGKILL nsys ingests (whose temporary SQLite copy lies in staging) at several points."""
    from stallscope.store import pid_alive

    sample = Path(__file__).resolve().parents[1] / "sample_traces/nsys/ddp_overlap.sqlite.gz"
    store_dir = tmp_path / "store"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = dict(os.environ, STALLSCOPE_STORE=str(store_dir), TMPDIR=str(tmpdir))
    staging = store_dir / "staging"
    for delay in (0.05, 0.3, 0.6, 1.0, 1.5):
        proc = subprocess.Popen([sys.executable, "-m", "stallscope.cli", "ingest", str(sample)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)  # fmt: skip
        deadline = time.time() + 120
        while time.time() < deadline and not (staging.is_dir() and any(staging.iterdir())):
            time.sleep(0.005)
        time.sleep(delay)
        proc.kill()
        proc.wait(timeout=30)
        owners = [json.loads(p.read_text())["pid"] for p in staging.glob("*/.lease")]
        end = time.time() + 30
        while any(pid_alive(pid) for pid in owners) and time.time() < end:
            time.sleep(0.05)  # the worker dies with its parent (PR_SET_PDEATHSIG)
        store = Store(store_dir)
        for job in store.jobs():  # whatever was published is complete
            assert len(store.traces(job["job_id"])) == len(job["trace_ids"])
        if store.jobs():
            shutil.rmtree(store_dir / "jobs")  # published before the kill: ingest it again
    small = KinetoTrace()
    small.kernel("k", 0, 10)
    done = spawn("ingest", str(small.write(tmp_path / "small.json")), store=store_dir)
    out = done.communicate(timeout=120)
    assert done.returncode == 0, out
    assert list(staging.iterdir()) == []
    assert [p for p in store_dir.rglob("*") if ".tmp" in p.name] == []
    assert list(tmpdir.iterdir()) == []


def test_a_zombie_owner_is_dead():
    """An exited but unreaped process (an orphaned worker whose init never reaps it) owns
    nothing: its staging folder is stale."""
    import subprocess

    from stallscope.store import pid_alive

    child = subprocess.Popen(["true"])
    deadline = time.time() + 10
    while time.time() < deadline:  # exited, not yet waited for: a zombie
        if Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
            break
        time.sleep(0.01)
    try:
        assert not pid_alive(child.pid)
    finally:
        child.wait()
    assert pid_alive(os.getpid())
