"""Watches, their verdicts and alerts in SQLite: what a restarted server resumes from.

Each watch's events (window verdicts, alerts, its end) are numbered 1, 2, 3, ... in the order they
happened; the number is the Server-Sent Events id, so a reader that reconnects with
``Last-Event-ID`` gets exactly the events after it. A verdict or alert is stored once per window:
a second write of the same one (a resumed watch judging its window again) is ignored.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

from vidsight.errors import ConfigError

SCHEMA = """
CREATE TABLE IF NOT EXISTS watches (
    id TEXT PRIMARY KEY, spec TEXT NOT NULL, state TEXT NOT NULL, error TEXT,
    created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    watch_id TEXT NOT NULL REFERENCES watches(id) ON DELETE CASCADE, seq INTEGER NOT NULL,
    kind TEXT NOT NULL, window INTEGER, data TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (watch_id, seq), UNIQUE (watch_id, kind, window));
"""
RUNNING, DONE, FAILED, STOPPED = "running", "done", "failed", "stopped"


class Store:
    """The server's records, safe to use from any thread.

    Args:
        path: The SQLite file (created, with its directory, if missing).

    Raises:
        ConfigError: the file cannot be opened or is not a vidsight database.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"{self.path}: cannot use as the server's database ({exc})") from None
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- watches ----------------------------------------------------------------------------------
    def add_watch(self, watch_id: str, spec: dict) -> None:
        now = time.time()
        with self._lock:
            self._db.execute("INSERT INTO watches VALUES (?, ?, ?, NULL, ?, ?)",
                             (watch_id, json.dumps(spec), RUNNING, now, now))

    def set_state(self, watch_id: str, state: str, error: str | None = None) -> None:
        with self._lock:
            self._db.execute("UPDATE watches SET state = ?, error = ?, updated = ? WHERE id = ?",
                             (state, error, time.time(), watch_id))

    def delete_watch(self, watch_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM watches WHERE id = ?", (watch_id,))

    def watch(self, watch_id: str) -> dict | None:
        with self._lock:
            row = self._db.execute("SELECT id, spec, state, error, created FROM watches WHERE id = ?",
                                   (watch_id,)).fetchone()
        return None if row is None else _watch_record(row)

    def watches(self, state: str | None = None) -> list[dict]:
        query, args = "SELECT id, spec, state, error, created FROM watches", ()
        if state is not None:
            query, args = query + " WHERE state = ?", (state,)
        with self._lock:
            rows = self._db.execute(query + " ORDER BY created", args).fetchall()
        return [_watch_record(row) for row in rows]

    # -- events -----------------------------------------------------------------------------------
    def append(self, watch_id: str, kind: str, window: int | None, data: dict) -> int | None:
        """Store an event; its number, or None when that window's event of this kind is stored already."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                seq = self._db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE watch_id = ?",
                                       (watch_id,)).fetchone()[0]
                cursor = self._db.execute("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?)",
                                          (watch_id, seq, kind, window, json.dumps(data), time.time()))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return seq if cursor.rowcount else None

    def events(self, watch_id: str, after: int = 0, limit: int = 1000) -> list[dict]:
        """Events numbered above ``after``, in order: ``{"id", "event", "data"}``."""
        with self._lock:
            rows = self._db.execute("SELECT seq, kind, data FROM events WHERE watch_id = ? AND seq > ? "
                                    "ORDER BY seq LIMIT ?", (watch_id, after, limit)).fetchall()
        return [{"id": seq, "event": kind, "data": json.loads(data)} for seq, kind, data in rows]

    def verdicts(self, watch_id: str) -> list[dict]:
        with self._lock:
            rows = self._db.execute("SELECT data FROM events WHERE watch_id = ? AND kind = 'window' ORDER BY window",
                                    (watch_id,)).fetchall()
        return [json.loads(data) for (data,) in rows]

    def resume_point(self, watch_id: str) -> tuple[int, int]:
        """The first window not yet judged, and how many Yes windows in a row end before it."""
        verdicts = self.verdicts(watch_id)
        streak = 0
        for verdict in reversed(verdicts):
            if not verdict["yes"]:
                break
            streak += 1
        return (verdicts[-1]["window"] + 1 if verdicts else 0), streak


def _watch_record(row) -> dict:
    watch_id, spec, state, error, created = row
    return {"id": watch_id, **json.loads(spec), "state": state, "error": error, "created": created}
