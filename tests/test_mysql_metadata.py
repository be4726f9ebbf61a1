"""ML Metadata on a real MySQL-compatible server: the pipeline runs against it and the lineage reads back.

The server is Debian's MariaDB (`.ci/run` installs the package when it can), started here on a free
localhost port with a scratch data directory. Skipped, with the reason, where no server binary exists;
under CI that fails instead.
"""

import json
import os
import shutil
import socket
import subprocess
import time

import portpicker
import pytest

from deepseek_tfx.components import mlmd
from deepseek_tfx.pipeline import cli
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
