"""Watches, their verdicts and alerts in a database: what a restarted server resumes from.

SQLite (a file) serves one machine and needs no install; a PostgreSQL URL serves several
replicas, which then share one record of every watch (SQLAlchemy Core speaks to both).

Under Ray Serve each watch has an owner, the replica running it, and every replica beats a
heartbeat here; a watch whose owner stopped beating is claimed by a live replica, and only the
claim that finds the old owner still recorded wins.

Each watch's events (window verdicts, alerts, its end) are numbered 1, 2, 3, ... in the order they
happened; the number is the Server-Sent Events id, so a reader that reconnects with
``Last-Event-ID`` gets exactly the events after it. A verdict or alert is stored once per window:
a second write of the same one (a resumed watch judging its window again) is ignored.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from vidsight.errors import ConfigError

RUNNING, DONE, FAILED, STOPPED = "running", "done", "failed", "stopped"

METADATA = sa.MetaData()
WATCHES = sa.Table(
    "watches", METADATA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("spec", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("error", sa.Text),
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("updated", sa.Float, nullable=False),
    sa.Column("owner", sa.String(64)),
)
EVENTS = sa.Table(
    "events", METADATA,
    sa.Column("watch_id", sa.String(64), sa.ForeignKey("watches.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("window", sa.Integer),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("created", sa.Float, nullable=False),
    sa.UniqueConstraint("watch_id", "kind", "window"),
)
REPLICAS = sa.Table(
    "replicas", METADATA,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("streams", sa.Integer, nullable=False),
    sa.Column("heartbeat", sa.Float, nullable=False),
)


def database_url(db: str | Path) -> str:
    """A SQLAlchemy URL: ``db`` itself when it is one, else a SQLite file at that path."""
    text = str(db)
    if "://" in text:
        return text.replace("postgresql://", "postgresql+psycopg://", 1) if text.startswith("postgresql://") else text
    Path(text).parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{text}"


class Store:
    """The server's records, safe to use from any thread and from several processes.

    Args:
        db: A SQLite file path (created, with its directory, if missing) or a database URL
            (``postgresql://user@host/name``).

    Raises:
        ConfigError: the database cannot be opened or is not a vidsight database.
    """

    def __init__(self, db: str | Path):
        self.db = db
        try:
            url = database_url(db)
            self._engine = sa.create_engine(url, pool_pre_ping=True)
            if self._engine.dialect.name == "sqlite":
                sa.event.listen(self._engine, "connect", _sqlite_pragmas)
                # Each transaction takes SQLite's write lock at its start, so two writers cannot
                # both read a watch's last event number (SQLAlchemy's recipe for pysqlite).
                sa.event.listen(self._engine, "begin", lambda db: db.exec_driver_sql("BEGIN IMMEDIATE"))
            METADATA.create_all(self._engine)
            _add_owner_column(self._engine)
        except (OSError, sa.exc.SQLAlchemyError) as exc:
            raise ConfigError(f"{db}: cannot use as the server's database ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0]})") from None
        self._insert = postgresql.insert if self._engine.dialect.name == "postgresql" else sqlite.insert

    def close(self) -> None:
        self._engine.dispose()

    # -- watches ----------------------------------------------------------------------------------
    def add_watch(self, watch_id: str, spec: dict, owner: str | None = None) -> None:
        now = time.time()
        with self._engine.begin() as db:
            db.execute(WATCHES.insert().values(id=watch_id, spec=json.dumps(spec), state=RUNNING, error=None,
                                               created=now, updated=now, owner=owner))

    def claim(self, watch_id: str, previous: str | None, owner: str) -> bool:
        """Make ``owner`` run a running watch if ``previous`` still owns it; whether this claim won."""
        with self._engine.begin() as db:
            result = db.execute(WATCHES.update()
                                .where(WATCHES.c.id == watch_id, WATCHES.c.state == RUNNING,
                                       WATCHES.c.owner.is_(None) if previous is None else WATCHES.c.owner == previous)
                                .values(owner=owner, updated=time.time()))
        return result.rowcount == 1

    def owner(self, watch_id: str) -> str | None:
        with self._engine.connect() as db:
            return db.execute(sa.select(WATCHES.c.owner).where(WATCHES.c.id == watch_id)).scalar_one_or_none()

    def set_state(self, watch_id: str, state: str, error: str | None = None) -> None:
        with self._engine.begin() as db:
            db.execute(WATCHES.update().where(WATCHES.c.id == watch_id).values(state=state, error=error,
                                                                                updated=time.time()))

    def delete_watch(self, watch_id: str) -> None:
        with self._engine.begin() as db:
            db.execute(EVENTS.delete().where(EVENTS.c.watch_id == watch_id))
            db.execute(WATCHES.delete().where(WATCHES.c.id == watch_id))

    def watch(self, watch_id: str) -> dict | None:
        with self._engine.connect() as db:
            row = db.execute(_WATCH_COLUMNS.where(WATCHES.c.id == watch_id)).first()
        return None if row is None else _watch_record(row)

    def watches(self, state: str | None = None) -> list[dict]:
        query = _WATCH_COLUMNS if state is None else _WATCH_COLUMNS.where(WATCHES.c.state == state)
        with self._engine.connect() as db:
            rows = db.execute(query.order_by(WATCHES.c.created)).all()
        return [_watch_record(row) for row in rows]

    # -- replicas ---------------------------------------------------------------------------------
    def beat(self, replica_id: str, streams: int) -> None:
        """Record that ``replica_id`` is alive now, running ``streams`` watches and sessions."""
        values = dict(streams=streams, heartbeat=time.time())
        statement = self._insert(REPLICAS).values(id=replica_id, **values)
        with self._engine.begin() as db:
            db.execute(statement.on_conflict_do_update(index_elements=[REPLICAS.c.id], set_=values))

    def live_replicas(self, timeout_s: float) -> dict[str, int]:
        """Replicas that beat within ``timeout_s``: id -> streams they run."""
        query = sa.select(REPLICAS.c.id, REPLICAS.c.streams).where(REPLICAS.c.heartbeat >= time.time() - timeout_s)
        with self._engine.connect() as db:
            return dict(db.execute(query).all())

    def forget_replica(self, replica_id: str) -> None:
        """A replica that stopped cleanly takes its heartbeat with it."""
        with self._engine.begin() as db:
            db.execute(REPLICAS.delete().where(REPLICAS.c.id == replica_id))

    # -- events -----------------------------------------------------------------------------------
    def append(self, watch_id: str, kind: str, window: int | None, data: dict) -> int | None:
        """Store an event; its number, or None when that window's event of this kind is stored already."""
        with self._engine.begin() as db:
            # The watch's row is locked while its next number is taken (PostgreSQL; SQLite locks
            # the whole file for the transaction), so concurrent writers cannot take the same one.
            db.execute(sa.select(WATCHES.c.id).where(WATCHES.c.id == watch_id).with_for_update())
            seq = db.execute(sa.select(sa.func.coalesce(sa.func.max(EVENTS.c.seq), 0) + 1)
                             .where(EVENTS.c.watch_id == watch_id)).scalar_one()
            statement = self._insert(EVENTS).values(watch_id=watch_id, seq=seq, kind=kind, window=window,
                                                    data=json.dumps(data), created=time.time())
            # RETURNING says whether the row went in (psycopg reports no row count for it).
            inserted = db.execute(statement.on_conflict_do_nothing().returning(EVENTS.c.seq)).first()
        return seq if inserted is not None else None

    def events(self, watch_id: str, after: int = 0, limit: int = 1000) -> list[dict]:
        """Events numbered above ``after``, in order: ``{"id", "event", "data"}``."""
        query = (sa.select(EVENTS.c.seq, EVENTS.c.kind, EVENTS.c.data)
                 .where(EVENTS.c.watch_id == watch_id, EVENTS.c.seq > after).order_by(EVENTS.c.seq).limit(limit))
        with self._engine.connect() as db:
            rows = db.execute(query).all()
        return [{"id": seq, "event": kind, "data": json.loads(data)} for seq, kind, data in rows]

    def verdicts(self, watch_id: str) -> list[dict]:
        query = (sa.select(EVENTS.c.data).where(EVENTS.c.watch_id == watch_id, EVENTS.c.kind == "window")
                 .order_by(EVENTS.c.window))
        with self._engine.connect() as db:
            return [json.loads(data) for (data,) in db.execute(query).all()]

    def resume_point(self, watch_id: str) -> tuple[int, int]:
        """The first window not yet judged, and how many Yes windows in a row end before it."""
        verdicts = self.verdicts(watch_id)
        streak = 0
        for verdict in reversed(verdicts):
            if not verdict["yes"]:
                break
            streak += 1
        return (verdicts[-1]["window"] + 1 if verdicts else 0), streak


_WATCH_COLUMNS = sa.select(WATCHES.c.id, WATCHES.c.spec, WATCHES.c.state, WATCHES.c.error, WATCHES.c.created,
                           WATCHES.c.owner)


def _watch_record(row) -> dict:
    watch_id, spec, state, error, created, owner = row
    return {"id": watch_id, **json.loads(spec), "state": state, "error": error, "created": created, "owner": owner}


def _add_owner_column(engine) -> None:
    """Databases written before watches had owners get the column (empty: no replica runs them)."""
    if "owner" not in {c["name"] for c in sa.inspect(engine).get_columns("watches")}:
        with engine.begin() as db:
            db.exec_driver_sql("ALTER TABLE watches ADD COLUMN owner VARCHAR(64)")


def _sqlite_pragmas(connection, _record) -> None:
    connection.isolation_level = None   # transactions begin in the "begin" hook, not in pysqlite
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()
