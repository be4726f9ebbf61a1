"""A quiet console for ``run`` and ``retrain``: what matters on the terminal, everything else in the run's log.

While a run lasts, file descriptors 1 and 2 point at ``OUTPUT/logs/<run id>.log``, so every library's output
lands there: Python logging and warnings, TensorFlow's C++ logs, the output of Beam's worker processes. The
terminal (the descriptors as they were) gets:

* one line per component as it ends: ``[4/11] Transform          ran      12.3 s`` (``cached``, ``skipped``
  when a condition kept it from running, ``failed``), resolvers left out;
* the Trainer's progress lines, thinned to at most ``PROGRESS_LINES`` per training (plus its first and last;
  the eval-loss lines of the curve stay in the log, TensorBoard and the report);
* warnings of this project's own loggers;
* the run summary (printed by the caller through ``print``).

``--verbose`` leaves every output where it was (the log file is not written).
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

PROGRESS_LINES = 4
_COMPONENT = re.compile(r"^Component (\S+) is (running|finished)")
_STEP = re.compile(r"^step (\d+)/(\d+) ")
_EVAL_STEP = re.compile(r"^step \d+ eval loss ")


def new_run_id() -> str:
    """A run id: TFX's own format (the start time) with the host and process, so it is unique across machines."""
    return f"{datetime.datetime.now().isoformat()}@{socket.gethostname()}:{os.getpid()}"


def file_name(run_id: str) -> str:
    """The run id with the characters that are unsafe in file names replaced."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", run_id)


def log_path(output: str, run_id: str) -> str:
    """Where a quiet run's log goes: ``OUTPUT/logs/<run id>.log`` (a local directory for a remote output)."""
    base = output if "://" not in output else os.path.join(tempfile.gettempdir(), "deepseek-tfx")
    return os.path.join(base, "logs", file_name(run_id) + ".log")


class _ComponentLines(logging.Handler):
    """Turns TFX's "Component X is running/finished" records into one line per finished component."""

    def __init__(self, console: QuietConsole):
        super().__init__(logging.INFO)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        match = _COMPONENT.match(record.getMessage())
        if match:
            self.console.component_event(match.group(1), match.group(2))


class _TrainerLines(logging.Handler):
    """The Trainer's progress lines (thinned) and this project's warnings, to the terminal."""

    def __init__(self, console: QuietConsole):
        super().__init__(logging.INFO)
        self.console = console
        self.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.levelno >= logging.WARNING:
            self.console.write(self.format(record))
            return
        if not record.name.startswith("deepseek_tfx.trainer_module"):
            return
        if _EVAL_STEP.match(message):
            return
        step = _STEP.match(message)
        if step:
            done, total = int(step.group(1)), int(step.group(2))
            bucket = done * PROGRESS_LINES // max(total, 1)
            if bucket == self.console.progress_bucket and done != total:
                return
            self.console.progress_bucket = bucket
        self.console.write(self.format(record))


class QuietConsole:
    """Redirects the run's output to ``log_path`` and shows the terminal only what matters (module docstring).

    Args:
        log_path: the run's log file (its directory is created).
        state_of: ``state_of(node_id)`` -> "ran" / "cached" / "skipped" for a node that just finished (from ML
            Metadata); called when TFX says the node finished.
        stream: where the terminal lines go (default: the process's stdout as it was on entry).
    """

    def __init__(self, log_path: str, state_of: Callable[[str], str], stream=None):
        self.log_path = log_path
        self.state_of = state_of
        self._stream = stream
        self.nodes: list[str] = []
        self.progress_bucket = -1
        self._started: dict[str, float] = {}
        self._running: str | None = None
        self._handlers: list[tuple[logging.Logger, logging.Handler]] = []
        self._saved: list[int] = []

    def expect(self, nodes: Sequence[str]) -> None:
        """The pipeline's components in order (numbered [k/N] as they end)."""
        self.nodes = list(nodes)

    def write(self, line: str) -> None:
        self._stream.write(line + "\n")
        self._stream.flush()

    def component_event(self, node: str, event: str) -> None:
        if event == "running":
            self._started[node] = time.monotonic()
            self._running = node
            if node == "Trainer":
                self.progress_bucket = -1
            return
        self._running = None
        if node not in self.nodes:  # a resolver, or a node of a backfill run
            return
        seconds = time.monotonic() - self._started.pop(node, time.monotonic())
        state = self.state_of(node)
        width, count = max(len(n) for n in self.nodes), len(self.nodes)
        timing = f"{seconds:6.1f} s" if state == "ran" else ""
        number = f"{self.nodes.index(node) + 1:>{len(str(count))}}"
        self.write(f"[{number}/{count}] {node:<{width}}  {state:<8} {timing}".rstrip())

    def failed(self) -> None:
        """Marks the component that was running when the run failed."""
        node = self._running
        if node in self.nodes:
            seconds = time.monotonic() - self._started.get(node, time.monotonic())
            self.write(f"[{self.nodes.index(node) + 1}/{len(self.nodes)}] {node}  failed   {seconds:6.1f} s")

    def __enter__(self) -> QuietConsole:
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = [os.dup(1), os.dup(2)]
        if self._stream is None:
            self._stream = os.fdopen(os.dup(self._saved[0]), "w", buffering=1, encoding="utf-8")
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(log_fd)
        for name, handler in (("absl", _ComponentLines(self)), ("deepseek_tfx", _TrainerLines(self))):
            logger = logging.getLogger(name)
            logger.addHandler(handler)
            self._handlers.append((logger, handler))
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            self.failed()
        for logger, handler in self._handlers:
            logger.removeHandler(handler)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
