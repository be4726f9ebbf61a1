"""One run at a time per output directory: an exclusive lock held for the whole local run.

Two runs on one output would both train, both gate against the same baseline and both push; the last push
would win. ``output_lock`` takes an exclusive ``flock`` on ``OUTPUT/.deepseek-tfx.lock`` and writes who holds
it (host, pid, start time) into the file, so a second run can say who is in the way. The kernel releases a
flock when its process dies, however it dies: a lock file whose holder is gone is simply taken over, with a
log line naming the dead holder.

Local directories only: object stores (``gs://``) have no locks, and a flock on a network filesystem is only
as good as that filesystem's lock support.

A MySQL ML Metadata store can be shared by runs on several machines with different output directories, so
``store_lock`` also takes MySQL's own named lock (``GET_LOCK``) for the pipeline name, on a connection held
for the whole run; the server releases it when that connection ends, however the process ends. The holder's
record sits in a small table beside the metadata (``deepseek_tfx_run_lock``), so a refused run can name it.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)

LOCK_FILE = ".deepseek-tfx.lock"


class RunLockedError(Exception):
    """Another run holds the output directory; the message names it (host, pid, start time)."""

    def __init__(self, path: str, holder: dict, resource: str | None = None):
        self.path, self.holder = path, holder
        who = (f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"
               if holder else "another process")
        super().__init__(f"{resource or os.path.dirname(path)} is in use by a run ({who}; lock {path}): wait for "
                         "it to end, or pass --wait to wait for it")


def _settled(read, seconds: float = 2.0) -> dict:
    """The holder's record; a holder that has just taken the lock writes it a moment later, so an empty record
    is read again for up to ``seconds``."""
    deadline = time.monotonic() + seconds
    record = read()
    while not record and time.monotonic() < deadline:
        time.sleep(0.05)
        record = read()
    return record


def _me() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _holder(f) -> dict:
    f.seek(0)
    text = f.read()
    try:
        return json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {}


@contextlib.contextmanager
def output_lock(output: str, wait: bool = False, poll_seconds: float = 1.0) -> Iterator[dict]:
    """Holds the output directory's lock for the ``with`` block; yields this holder's record.

    Raises:
        RunLockedError: another live process holds the lock and ``wait`` is False.
    """
    os.makedirs(output, exist_ok=True)
    path = os.path.join(output, LOCK_FILE)
    with open(path, "a+", encoding="utf-8") as f:
        waited = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _settled(lambda: _holder(f))
                if not wait:
                    raise RunLockedError(path, holder) from None
                if not waited:
                    log.info("Waiting for the run holding %s (%s)", path, holder or "holder unknown")
                    waited = True
                time.sleep(poll_seconds)
        stale = _holder(f)
        if stale:  # written by a run that died without clearing it (its flock went with it)
            log.warning("Took over the lock %s of a run that is no longer running (pid %s on %s, started %s)",
                        path, stale.get("pid"), stale.get("host"), stale.get("started"))
        me = _me()
        f.seek(0)
        f.truncate()
        f.write(json.dumps(me))
        f.flush()
        try:
            yield me
        finally:
            f.seek(0)
            f.truncate()  # a clean end leaves no holder behind
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)


LOCK_TABLE = "deepseek_tfx_run_lock"


@contextlib.contextmanager
def store_lock(mysql, pipeline_name: str, wait: bool = False, poll_seconds: float = 1.0) -> Iterator[dict]:
    """Holds MySQL's named lock for ``pipeline_name`` on the store ``mysql`` (a MySQLDatabaseConfig) for the
    ``with`` block; yields this holder's record.

    Raises:
        RunLockedError: a run elsewhere holds the pipeline's lock on this store and ``wait`` is False.
    """
    import pymysql  # noqa: PLC0415  (only runs on a MySQL store need it)

    name = f"deepseek-tfx:{pipeline_name}"[:64]  # MySQL's limit on lock names
    table = f"`{mysql.database}`.{LOCK_TABLE}"
    where = f"mysql://{mysql.host}:{mysql.port}/{mysql.database}"
    connection = pymysql.connect(host=mysql.host, port=mysql.port or 3306, user=mysql.user,
                                 password=mysql.password or "", autocommit=True)
    held = False
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION wait_timeout = 31536000")  # the lock lives as long as the connection
            cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{mysql.database}`")
            cursor.execute(f"CREATE TABLE IF NOT EXISTS {table} (lock_name VARCHAR(64) PRIMARY KEY, holder TEXT)")

            def holder() -> dict:
                cursor.execute(f"SELECT holder FROM {table} WHERE lock_name = %s", (name,))
                row = cursor.fetchone()
                return json.loads(row[0]) if row and row[0] else {}

            waited = False
            while True:
                cursor.execute("SELECT GET_LOCK(%s, 0)", (name,))
                if cursor.fetchone()[0] == 1:
                    held = True
                    break
                if not wait:
                    raise RunLockedError(f"{name} on {where}", _settled(holder),
                                         resource=f"pipeline {pipeline_name} in the ML Metadata store {where}")
                if not waited:
                    log.info("Waiting for the run holding %s on %s (%s)", name, where, holder() or "holder unknown")
                    waited = True
                time.sleep(poll_seconds)
            stale = holder()
            if stale:  # left by a run whose connection ended without clearing it
                log.warning("Took over the lock %s on %s of a run that is no longer running (pid %s on %s, "
                            "started %s)", name, where, stale.get("pid"), stale.get("host"), stale.get("started"))
            me = _me()
            cursor.execute(f"REPLACE INTO {table} (lock_name, holder) VALUES (%s, %s)", (name, json.dumps(me)))
        yield me
    finally:
        try:
            if held:
                with connection.cursor() as cursor:
                    cursor.execute(f"DELETE FROM {table} WHERE lock_name = %s", (name,))
                    cursor.execute("SELECT RELEASE_LOCK(%s)", (name,))
        except pymysql.MySQLError as e:  # the run's own outcome matters more; the server frees the lock anyway
            log.warning("Could not release the lock %s on %s cleanly (%s); the server drops it with the "
                        "connection", name, where, e)
        finally:
            connection.close()
