"""ML Metadata on a real MySQL-compatible server: the pipeline runs against it and the lineage reads back.

The server is Debian's MariaDB (`.ci/run` installs the package when it can), started here on a free
localhost port with a scratch data directory. Skipped, with the reason, where no server binary exists;
under CI that fails instead.
"""

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import portpicker
import pytest

from deepseek_tfx.components import mlmd
from deepseek_tfx.pipeline import cli, run_lock
from deepseek_tfx.pipeline.local_runner import mysql_connection
from tests.conftest import skip_outside_ci

pytestmark = pytest.mark.slow

SERVER = next((p for p in (shutil.which("mariadbd"), shutil.which("mysqld"), "/usr/sbin/mariadbd",
                           "/usr/sbin/mysqld") if p and os.path.exists(p)), None)
INSTALL_DB = next((p for p in (shutil.which("mariadb-install-db"), shutil.which("mysql_install_db"))
                   if p), None)


@pytest.fixture(scope="module")
def mysql_server(tmp_path_factory):
    if SERVER is None or INSTALL_DB is None:
        skip_outside_ci("no MySQL-compatible server binary (install Debian's mariadb-server; .ci/run does)")
    root = tmp_path_factory.mktemp("mysql")
    data, port = root / "data", portpicker.pick_unused_port()
    user = ["--user=root"] if os.geteuid() == 0 else []
    subprocess.run([INSTALL_DB, "--no-defaults", f"--datadir={data}", "--auth-root-authentication-method=normal",
                    "--skip-test-db", *user], check=True, capture_output=True, timeout=300)
    log = open(root / "server.log", "w")
    server = subprocess.Popen([SERVER, "--no-defaults", f"--datadir={data}", f"--port={port}",
                               "--bind-address=127.0.0.1", f"--socket={root / 'mysql.sock'}",
                               f"--pid-file={root / 'mysql.pid'}", "--skip-grant-tables", *user],
                              stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert server.poll() is None, (root / "server.log").read_text()[-2000:]
            assert time.time() < deadline, "MariaDB did not accept connections within 120 s"
            time.sleep(0.5)
    yield {"DEEPSEEK_TFX_MYSQL_HOST": "127.0.0.1", "DEEPSEEK_TFX_MYSQL_PORT": str(port),
           "DEEPSEEK_TFX_MYSQL_DATABASE": "deepseek_tfx_mlmd", "DEEPSEEK_TFX_MYSQL_USER": "root"}
    server.terminate()
    server.wait(timeout=60)
    log.close()


def test_pipeline_records_its_lineage_in_mysql(mysql_server, tmp_path, shakespeare, monkeypatch, capsys):
    for key, value in mysql_server.items():
        monkeypatch.setenv(key, value)
    corpus, output = tmp_path / "corpus", tmp_path / "out"
    corpus.mkdir()
    (corpus / "part.txt").write_bytes(shakespeare.read_bytes()[:60_000])
    assert cli.main(["run", "--corpus", str(corpus), "--output", str(output), "--preset", "tiny",
                     "--train-steps", "20", "--vocab-size", "400", "--max-bits-per-byte", "8",
                     "--set", "train.learning_rate=2e-3", "--metadata", "mysql"]) == 0
    printed = capsys.readouterr().out
    assert "ML Metadata:   mysql://127.0.0.1:" in printed
    # The changed field in the summary and in ML Metadata (the Trainer execution's custom_config).
    assert "train.learning_rate=0.002" in printed.split("config:", 1)[1].splitlines()[0]
    assert not (output / "metadata.sqlite").exists()

    store = mlmd.open_store(mysql_connection(dict(os.environ)))
    pushed = mlmd.latest_pushed_model(store)
    assert pushed is not None
    versions = mlmd.pushed_versions(store)
    assert [v["spans"] for v in versions] == [[0]]
    [trainer] = mlmd.node_executions(store, "deepseek-tfx", "Trainer")
    assert json.loads(trainer.custom_properties["custom_config"].string_value)["train"]["learning_rate"] == 0.002

    assert cli.main(["lineage", "--output", str(output), "--metadata", "mysql"]) == 0
    printed = capsys.readouterr().out
    assert f"version {versions[0]['version']}: trained on span 0" in printed
    assert "<- model_blessing: ModelBlessing" in printed and f"<- corpus: {corpus}/*" in printed


HOLD_THE_STORE_LOCK = r"""
import json, sys
from deepseek_tfx.pipeline import run_lock
from deepseek_tfx.pipeline.local_runner import mysql_connection
with run_lock.store_lock(mysql_connection(json.loads(sys.argv[1])).mysql, "deepseek-tfx"):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes stdin (or kills this process)
"""


def _holder(mysql_server):
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_STORE_LOCK, json.dumps(mysql_server)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_shared_store_runs_one_run_of_a_pipeline_at_a_time(mysql_server, caplog):
    store = mysql_connection(mysql_server).mysql
    where, host = f"mysql://127.0.0.1:{store.port}/{store.database}", socket.gethostname()
    processes = [_holder(mysql_server)]
    try:
        holder = processes[0]
        with pytest.raises(run_lock.RunLockedError) as refused:
            with run_lock.store_lock(store, "deepseek-tfx"):
                pass
        assert str(refused.value).startswith(f"pipeline deepseek-tfx in the ML Metadata store {where} is in use by "
                                             f"a run (pid {holder.pid} on {host}, started 20")
        with run_lock.store_lock(store, "another-pipeline"):  # other pipelines on the store are not held up
            pass
        threading.Timer(1.0, holder.stdin.close).start()  # the holder ends cleanly after a second
        started = time.time()
        with run_lock.store_lock(store, "deepseek-tfx", wait=True, poll_seconds=0.2) as me:
            assert me["pid"] == os.getpid() and time.time() - started >= 0.9
        holder.wait(timeout=30)

        processes.append(_holder(mysql_server))
        killed = processes[-1]
        killed.kill()  # dies holding the lock: the server drops the lock with the connection
        killed.wait(timeout=30)
        with caplog.at_level(logging.WARNING, logger=run_lock.log.name):
            with run_lock.store_lock(store, "deepseek-tfx", wait=True, poll_seconds=0.2):
                pass
        [took_over] = [r.getMessage() for r in caplog.records if "Took over" in r.getMessage()]
        assert took_over.startswith(f"Took over the lock deepseek-tfx:deepseek-tfx on {where} of a run that is no "
                                    f"longer running (pid {killed.pid} on {host}, started 20")
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
