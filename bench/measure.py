"""Runs a command and prints its wall time and peak memory over its whole process tree.

Beam's multi-processing workers are separate processes, so a single process's
max RSS (what `time -v` reports) under-counts; this samples the sum of RSS of
the command and all its descendants every 0.2 s.

    python -m bench.measure -- make run
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def main(argv: list[str]) -> int:
    if "--" in argv:
        argv = argv[argv.index("--") + 1:]
    if not argv:
        print(__doc__)
        return 2
    start = time.perf_counter()
    child = subprocess.Popen(argv)
    proc, peak = psutil.Process(child.pid), 0
    while child.poll() is None:
        try:
            peak = max(peak, tree_rss(proc))
        except psutil.Error:
            pass
        time.sleep(0.2)
    wall = time.perf_counter() - start
    print(f"measure: command {' '.join(argv)!r} exit {child.returncode}; "
          f"wall {wall:.1f} s; peak RSS of the process tree {peak / 2**30:.2f} GiB", flush=True)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
