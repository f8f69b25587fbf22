"""``--scheduler``: ingest and analyze on a Dask cluster started as a user starts one.

A scheduler and a worker process with two worker processes (``dask scheduler``,
``dask worker ADDRESS --nworkers 2 --nthreads 1``) on 127.0.0.1, shared by the
tests of this module; the store is in the test's folder, which they all see.
The scheduler allows one worker death per task
(``distributed.scheduler.allowed-failures=1``), so a task whose workers keep
dying fails after two deaths.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stallscope.store import Store

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "kineto" / "ddp_straggler"
DASK = Path(sys.executable).parent / "dask"
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_ranks  # noqa: E402 (the real 2-rank sample made into a job of N ranks)

sys.path.pop(0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    def __init__(self, address: str, client, folder: Path):
        self.address = address
        self.client = client
        self.folder = folder

    def ready(self) -> None:
        """Both workers up (a test may have killed some: their nannies restart them)."""
        self.client.wait_for_workers(2, timeout=60)

    def forget(self, plugin: str) -> None:
        """Remove a worker plugin (from the workers alive, and those started later)."""
        from contextlib import suppress

        with suppress(Exception):  # a worker killed meanwhile cannot answer
            self.client.unregister_worker_plugin(plugin)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    distributed = pytest.importorskip("distributed")
    if not DASK.exists():
        pytest.skip("the dask command is not installed beside this Python")
    folder = tmp_path_factory.mktemp("dask")
    address = f"tcp://127.0.0.1:{_free_port()}"
    env = dict(os.environ, DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="1")
    started = []
    try:
        for args in (
            ["scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1]],
            [
                "worker",
                address,
                "--nworkers",
                "2",
                "--nthreads",
                "1",
                "--host",
                "127.0.0.1",
                "--local-directory",
                str(folder / "workers"),
            ],  # fmt: skip
        ):
            log = open(folder / f"{args[0]}.log", "w")  # noqa: SIM115 (closed with the process)
            started.append(subprocess.Popen(
                [str(DASK), *args, "--no-dashboard"], stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=folder, start_new_session=True,
            ))  # fmt: skip
        client = distributed.Client(address, timeout=60, set_as_default=False)
        client.wait_for_workers(2, timeout=90)
        yield Cluster(address, client, folder)
        client.close()
    finally:
        for process in reversed(started):  # the worker first (its nannies in its session)
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory) -> Path:
    """A 4-rank job made of the real ddp_straggler ranks (rank 1 the straggler)."""
    folder = tmp_path_factory.mktemp("job4") / "ddp4"
    bench_ranks.build_job(bench_ranks.load_sample(), 4, folder)
    return folder


@pytest.fixture(scope="module")
def plain_store(four_ranks, tmp_path_factory) -> Path:
    """``four_ranks`` ingested on this machine alone (no scheduler), in this process."""
    from stallscope.ingest import ingest_paths

    store = Store(tmp_path_factory.mktemp("plain") / "store").ensure()
    ingest_paths(store, [str(four_ranks)])
    return store.root


def stored(store_dir: Path) -> dict:
    """Every stored trace: its catalog row (less upload time and parse time) and tables."""
    import pyarrow.parquet as pq

    store = Store(store_dir)
    out = {}
    for ref in store.traces():
        meta = {k: v for k, v in ref.meta.items() if k not in ("uploaded_at", "ingest_seconds")}
        files = sorted(p.name for p in ref.path.iterdir())
        tables = {p.name: pq.read_table(p) for p in sorted(ref.path.glob("*.parquet"))}
        out[ref.trace_id] = (meta, files, tables)
    return out


def assert_same_store(plain: Path, on_cluster: Path) -> None:
    a, b = stored(plain), stored(on_cluster)
    assert sorted(a) == sorted(b) and a
    for trace_id in a:
        assert a[trace_id][0] == b[trace_id][0]
        assert a[trace_id][1] == b[trace_id][1]  # no lease, no leftover folder
        for name, table in a[trace_id][2].items():
            assert table.equals(b[trace_id][2][name]), (trace_id, name)
    (job_a,), (job_b,) = Store(plain).jobs(), Store(on_cluster).jobs()
    for key in ("job_id", "trace_ids", "world_size", "sources"):
        assert job_a[key] == job_b[key]
    # (the CLI's ingest also stores the job's report: `reports/`, report_store)
    listed = [sorted(set(os.listdir(root / "jobs" / job["job_id"])) - {"reports"})
              for root, job in ((on_cluster, job_b), (plain, job_a))]  # fmt: skip
    assert listed[0] == listed[1]


def leftovers(store_dir: Path) -> list[str]:
    return sorted(os.listdir(store_dir / "staging"))


@pytest.mark.slow
def test_ingest_and_analyze_on_a_cluster_are_those_of_one_machine(
    cli, cluster, four_ranks, plain_store, tmp_path
):
    from stallscope.render import render
    from stallscope.report import build_report

    cluster.ready()
    plain, remote = plain_store, tmp_path / "remote"
    out = cli("ingest", str(four_ranks), "--scheduler", cluster.address, store=remote)
    assert out.returncode == 0, out.stderr
    assert "ingested: job" in out.stdout
    assert_same_store(plain, remote)
    assert leftovers(remote) == []
    (job,) = Store(remote).jobs()
    here = render(build_report(Store(plain), [Store(plain).traces(job["job_id"])]), "json")
    there = cli(  # the folder again: hashed on the workers, found stored, then analyzed there
        "analyze", str(four_ranks), "--format", "json", store=remote,
        env={"STALLSCOPE_SCHEDULER": cluster.address},
    )  # fmt: skip
    assert there.returncode == 0, there.stderr
    assert there.stdout == here
    assert len(Store(remote).uploads(job["job_id"])) == 2  # this upload recorded, nothing re-parsed
    report = json.loads(there.stdout)
    assert len(report["traces"]) == 4
    assert bench_ranks.straggler_named(report) == (3, True)  # ranks 0, 2, 3 wait for rank 1


@pytest.mark.slow
def test_a_worker_killed_mid_rank_is_replaced_and_the_job_is_whole(
    cli, cluster, four_ranks, plain_store, tmp_path
):
    import cloudpickle

    from tests import dask_plugins

    cluster.ready()
    cloudpickle.register_pickle_by_value(dask_plugins)
    tally = tmp_path / "kills"
    plugin = dask_plugins.KillAtTask("ingest_rank-", str(tally), times=1)
    cluster.client.register_plugin(plugin, name="kill-once")
    try:
        out = cli("ingest", str(four_ranks), "--scheduler", cluster.address, store=tmp_path / "s")
    finally:
        cluster.forget("kill-once")
    assert out.returncode == 0, out.stderr
    assert tally.read_text().count("\n") == 1  # one worker died while it held a rank
    assert_same_store(plain_store, tmp_path / "s")
    assert leftovers(tmp_path / "s") == []


@pytest.mark.slow
def test_a_rank_that_kills_its_workers_fails_the_ingest_and_stores_nothing(
    cli, cluster, four_ranks, tmp_path
):
    import cloudpickle

    from tests import dask_plugins

    cluster.ready()
    cloudpickle.register_pickle_by_value(dask_plugins)
    tally = tmp_path / "kills"
    plugin = dask_plugins.KillAtTask("ingest_rank-", str(tally), times=100)
    cluster.client.register_plugin(plugin, name="kill-always")
    try:
        out = cli("ingest", str(four_ranks), "--scheduler", cluster.address, store=tmp_path / "s")
    finally:
        cluster.forget("kill-always")
    assert out.returncode == 4, out.stderr
    (line,) = out.stderr.splitlines()
    assert "rank" in line and "died" in line and "too many times" in line
    # allowed-failures=1: a rank's second death ends it (its worker's other rank died too)
    assert tally.read_text().count("\n") >= 2
    assert Store(tmp_path / "s").jobs() == []
    assert leftovers(tmp_path / "s") == []


@pytest.mark.slow
def test_a_bad_rank_is_named_in_one_line_and_nothing_is_stored(cli, cluster, tmp_path):
    import gzip

    cluster.ready()
    good = SAMPLE / "rank0.pt.trace.json.gz"
    bad = tmp_path / "rank1.pt.trace.json"
    bad.write_bytes(gzip.decompress((SAMPLE / "rank1.pt.trace.json.gz").read_bytes())[:50_000])
    out = cli("ingest", str(good), str(bad), "--scheduler", cluster.address, store=tmp_path / "s")
    assert out.returncode == 3, out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"stallscope: error: {bad}: ") and "truncated" in line
    assert Store(tmp_path / "s").jobs() == []
    deadline = time.monotonic() + 10  # the other rank's task may still be finishing
    while leftovers(tmp_path / "s") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(tmp_path / "s") == []


def test_an_unreachable_scheduler_is_one_line_and_exit_4(cli, tmp_path):
    pytest.importorskip("distributed")
    address = f"tcp://127.0.0.1:{_free_port()}"  # nothing listens there
    started = time.monotonic()
    for command in ("ingest", "analyze"):
        out = cli(command, str(SAMPLE / "rank0.pt.trace.json.gz"), "--scheduler", address)
        assert out.returncode == 4, out.stderr
        (line,) = out.stderr.splitlines()
        assert f"cannot reach the Dask scheduler at {address}" in line
    assert time.monotonic() - started < 60
    assert Store(cli.store_dir).jobs() == []
    bad = cli("ingest", str(SAMPLE), env={"STALLSCOPE_SCHEDULER": "no-port-here"})
    assert bad.returncode == 4 and "not an address like tcp://HOST:PORT" in bad.stderr


def test_scheduler_without_dask_installed_says_how_to_install_it(cli, tmp_path):
    fake = tmp_path / "no_dask" / "distributed"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named distributed')\n")
    env = {"PYTHONPATH": str(fake.parent)}
    out = cli("ingest", str(SAMPLE), "--scheduler", "tcp://127.0.0.1:8786", env=env)
    assert out.returncode == 4
    (line,) = out.stderr.splitlines()
    assert "needs dask.distributed" in line and "pip install 'stallscope[dask]'" in line
    assert cli("ingest", str(SAMPLE), env=env).returncode == 0  # without --scheduler: no dask
