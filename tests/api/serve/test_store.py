"""The store on SQLite and on a real local PostgreSQL server: numbering, once per window, resume."""

import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

from vidsight.api.serve.store import DONE, RUNNING, Store

PG_BIN = "/usr/lib/postgresql/15/bin"


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of the test's own on a loopback port (Debian's postgresql package)."""
    if not os.path.exists(f"{PG_BIN}/initdb") or (os.geteuid() == 0 and shutil.which("runuser") is None):
        pytest.skip("needs Debian's postgresql package")
    # Not under pytest's temporary root: the server's own user must be able to reach its directory.
    root = Path(tempfile.mkdtemp(prefix="vidsight-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run([*as_postgres, f"{PG_BIN}/initdb", "-D", str(data), "-A", "trust", "-U", "vidsight"],
                   check=True, capture_output=True)
    for attempt in range(5):
        # A port the system just had free (a port derived from the pid was sometimes a client
        # socket's of an earlier test: "could not bind ... Address already in use").
        with socket.socket() as probe_socket:
            probe_socket.bind(("127.0.0.1", 0))
            port = probe_socket.getsockname()[1]
        started = subprocess.run([*as_postgres, f"{PG_BIN}/pg_ctl", "-D", str(data), "-l", str(root / "log"), "-w",
                                  "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1", "start"],
                                 capture_output=True)
        if started.returncode == 0:
            break
    else:
        raise RuntimeError(f"PostgreSQL would not start: {(root / 'log').read_text()[-500:]}")
    try:
        yield f"postgresql://vidsight@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_postgres, f"{PG_BIN}/pg_ctl", "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    db = tmp_path / "serve.db" if request.param == "sqlite" else request.getfixturevalue("postgres")
    store = Store(db)
    yield store
    for watch in store.watches():
        store.delete_watch(watch["id"])
    store.close()


def verdict(window: int, yes: bool) -> dict:
    return {"type": "window", "window": window, "yes": yes}


def test_events_are_numbered_in_order_and_stored_once_per_window(store):
    store.add_watch("w1", {"source": "cam.mp4", "query": "q"})
    assert store.watch("w1")["state"] == RUNNING and store.watch("w1")["source"] == "cam.mp4"
    assert [store.append("w1", "window", k, verdict(k, k >= 1)) for k in range(3)] == [1, 2, 3]
    assert store.append("w1", "alert", 2, {"type": "alert", "window": 2}) == 4
    assert store.append("w1", "window", 2, verdict(2, True)) is None        # judged again after a restart
    assert [e["id"] for e in store.events("w1", after=2)] == [3, 4]
    assert store.resume_point("w1") == (3, 2)
    store.set_state("w1", DONE)
    assert store.watches(RUNNING) == [] and [w["id"] for w in store.watches()] == ["w1"]


def test_concurrent_writers_never_share_a_number(store, tmp_path):
    store.add_watch("w2", {"source": "cam.mp4", "query": "q"})
    # Two handles on one database, as two replicas have.
    other = Store(store.db)

    def write(handle, windows):
        for k in windows:
            handle.append("w2", "window", k, verdict(k, False))

    threads = [threading.Thread(target=write, args=(h, range(start, 60, 2))) for h, start in ((store, 0), (other, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    other.close()
    events = store.events("w2")
    assert [e["id"] for e in events] == list(range(1, 61))
    assert sorted(e["data"]["window"] for e in events) == list(range(60))


def test_a_watch_changes_owner_only_by_a_claim_on_its_recorded_owner(store):
    store.add_watch("w3", {"source": "cam.mp4", "query": "q"}, owner="a")
    assert store.watch("w3")["owner"] == "a" and "owner" not in store.watch("w3")["source"]
    assert not store.claim("w3", "b", "c")           # b does not own it
    assert store.claim("w3", "a", "b") and store.owner("w3") == "b"
    assert not store.claim("w3", "a", "c")           # a second claim on the dead owner loses
    store.add_watch("w4", {"source": "cam.mp4", "query": "q"})
    assert store.claim("w4", None, "c") and store.owner("w4") == "c"
    store.set_state("w4", DONE)
    assert not store.claim("w4", "c", "a")           # only running watches move


def test_replicas_are_live_while_they_beat(store, monkeypatch):
    import time

    store.beat("r1", 2)
    store.beat("r2", 0)
    store.beat("r1", 3)
    assert store.live_replicas(timeout_s=60) == {"r1": 3, "r2": 0}
    later = time.time() + 120
    monkeypatch.setattr(time, "time", lambda: later)
    store.beat("r2", 1)
    assert store.live_replicas(timeout_s=60) == {"r2": 1}
    store.forget_replica("r2")
    store.forget_replica("r1")
    assert store.live_replicas(timeout_s=1e9) == {}


def test_a_database_from_before_owners_gets_the_column(tmp_path):
    import sqlalchemy as sa

    path = tmp_path / "old.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    with engine.begin() as db:
        db.exec_driver_sql("CREATE TABLE watches (id VARCHAR(64) PRIMARY KEY, spec TEXT NOT NULL, state VARCHAR(16) "
                           "NOT NULL, error TEXT, created FLOAT NOT NULL, updated FLOAT NOT NULL)")
        db.exec_driver_sql("""INSERT INTO watches VALUES ('old', '{"source": "a.mp4"}', 'running', NULL, 1, 1)""")
    engine.dispose()
    store = Store(path)
    assert store.watch("old")["owner"] is None and store.claim("old", None, "r1")
    store.close()
