"""One run at a time per output directory: an exclusive lock held for the whole local run.

Two runs on one output would both train, both gate against the same baseline and both push; the last push
would win. ``output_lock`` takes an exclusive ``flock`` on ``OUTPUT/.deepseek-tfx.lock`` and writes who holds
it (host, pid, start time) into the file, so a second run can say who is in the way. The kernel releases a
flock when its process dies, however it dies: a lock file whose holder is gone is simply taken over, with a
log line naming the dead holder.

Local directories only: object stores (``gs://``) have no locks, and a flock on a network filesystem is only
as good as that filesystem's lock support.
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

    def __init__(self, path: str, holder: dict):
        self.path, self.holder = path, holder
        who = (f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"
               if holder else "another process")
        super().__init__(f"{os.path.dirname(path)} is in use by a run ({who}; lock {path}): wait for it to end, "
                         "or pass --wait to wait for it")


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
                holder = _holder(f)
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
        me = {"host": socket.gethostname(), "pid": os.getpid(),
              "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
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
