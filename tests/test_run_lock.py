"""One run at a time per output directory (pipeline.run_lock), and two real `run` processes on one output."""

import json
import logging
import os
import subprocess
import sys
import threading
import time

import pytest

from deepseek_tfx.pipeline import run_lock


def test_a_second_holder_is_refused_with_the_first_ones_name(tmp_path):
    with run_lock.output_lock(str(tmp_path)) as me:
        assert me["pid"] == os.getpid()
        with pytest.raises(run_lock.RunLockedError) as refused:
            with run_lock.output_lock(str(tmp_path)):
                pytest.fail("two holders at once")
        assert refused.value.holder == me
        message = str(refused.value)
        assert f"pid {os.getpid()} on {me['host']}, started {me['started']}" in message and "--wait" in message
    with run_lock.output_lock(str(tmp_path)):  # released at the end of the block
        pass
    assert (tmp_path / run_lock.LOCK_FILE).read_text() == ""  # a clean end leaves no holder behind


def test_a_holder_that_has_not_written_its_record_yet_is_still_named(tmp_path):
    """The holder writes its record just after taking the lock: a refusal in that moment waits for it."""
    import fcntl

    path = tmp_path / run_lock.LOCK_FILE
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the lock is taken, the record not written yet
        record = {"host": "h", "pid": 4242, "started": "2026-12-01T00:00:00+00:00"}

        def write_record():
            f.write(json.dumps(record))
            f.flush()

        timer = threading.Timer(0.3, write_record)
        timer.start()
        with pytest.raises(run_lock.RunLockedError) as refused:
            with run_lock.output_lock(str(tmp_path)):
                pytest.fail("two holders at once")
        timer.join()
    assert refused.value.holder == record and "pid 4242 on h" in str(refused.value)


def test_wait_takes_the_lock_when_the_holder_ends(tmp_path):
    released, order = threading.Event(), []

    def holder():
        with run_lock.output_lock(str(tmp_path)):
            order.append("first")
            released.wait(10)
            order.append("released")  # inside the block: the waiter cannot get in before this

    thread = threading.Thread(target=holder)
    thread.start()
    while not order:
        time.sleep(0.01)
    threading.Timer(0.3, released.set).start()
    with run_lock.output_lock(str(tmp_path), wait=True, poll_seconds=0.05):
        order.append("second")
    thread.join(10)
    assert order == ["first", "released", "second"]


def test_the_lock_of_a_dead_process_is_taken_over_with_a_log_line(tmp_path, caplog):
    # A killed holder: its record stays in the file, its flock died with it.
    killed = subprocess.run(
        [sys.executable, "-c", "import os, sys; from deepseek_tfx.pipeline import run_lock\n"
         "with run_lock.output_lock(sys.argv[1]):\n    os._exit(9)", str(tmp_path)], timeout=120)
    assert killed.returncode == 9
    dead = json.loads((tmp_path / run_lock.LOCK_FILE).read_text())
    with caplog.at_level(logging.WARNING, logger="deepseek_tfx.pipeline.run_lock"):
        with run_lock.output_lock(str(tmp_path)) as me:
            assert me["pid"] == os.getpid() != dead["pid"]
    assert f"no longer running (pid {dead['pid']} on {dead['host']}, started {dead['started']})" in caplog.text


@pytest.mark.slow
def test_two_runs_on_one_output_one_is_refused_and_one_pushes(tmp_path, shakespeare):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(shakespeare.read_bytes()[:40_000])
    output = tmp_path / "out"
    command = [sys.executable, "-m", "deepseek_tfx.pipeline.cli", "run", "--corpus", str(corpus), "--output",
               str(output), "--preset", "tiny", "--train-steps", "5", "--max-bits-per-byte", "8"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = []
    for p in procs:  # communicate, not wait: a full pipe would block the run
        out, err = p.communicate(timeout=900)
        results.append((p.returncode, out, err))
    codes = sorted(code for code, _, _ in results)
    assert codes == [0, 2], [err[-2000:] for _, _, err in results]
    refused = next(err for code, _, err in results if code == 2)
    winner = next(p for p, (code, _, _) in zip(procs, results, strict=True) if code == 0)
    assert f"is in use by a run (pid {winner.pid} on " in refused
    assert len(os.listdir(output / "serving_model" / "deepseek")) == 1  # exactly one pushed version
