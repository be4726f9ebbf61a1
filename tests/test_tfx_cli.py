"""TFX's own command line on the root-level runners, as in the TFX templates.

``tfx pipeline create`` / ``tfx run create`` with the local engine run the whole pipeline (tiny preset) from
local_runner.py. The Vertex engine of the tfx CLI refuses to start without the ``kfp`` distribution, which
cannot be installed beside TFX 1.16 on Python 3.10 (protobuf pins: see pipeline/kubeflow_runner.py), so
kubeflow_v2_runner.py is run the way that CLI runs it: as a script with no arguments, settings in the
environment.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2
from ml_metadata.proto import metadata_store_pb2

from deepseek_tfx.components import mlmd
from deepseek_tfx.pipeline import local_runner
from deepseek_tfx.pipeline.config import PIPELINE_NAME

REPO = pathlib.Path(__file__).resolve().parents[1]
NODES = ("TextExampleGen", "StatisticsGen", "SchemaGen", "ExampleValidator", "TokenizerGen", "Transform", "DataChecks",
         "Trainer", "Evaluator", "Pusher")


def _env(**settings) -> dict:
    return {**os.environ, "PYTHONWARNINGS": "ignore", **{k: str(v) for k, v in settings.items()}}


@pytest.mark.slow
def test_tfx_cli_creates_and_runs_the_local_pipeline(tmp_path, shakespeare):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(shakespeare.read_bytes()[:30_000])
    out = tmp_path / "out"
    env = _env(LOCAL_HOME=tmp_path / "tfx_home", DEEPSEEK_TFX_OUTPUT=out, DEEPSEEK_TFX_CORPUS=corpus,
               DEEPSEEK_TFX_PRESET="tiny", DEEPSEEK_TFX_TRAIN_STEPS=5)
    tfx_cli = pathlib.Path(sys.executable).parent / "tfx"

    def tfx(*args):
        return subprocess.run([str(tfx_cli), *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=900)

    created = tfx("pipeline", "create", "--engine", "local", "--pipeline_path", str(REPO / "local_runner.py"))
    assert created.returncode == 0, created.stderr[-3000:]
    assert f'Pipeline "{PIPELINE_NAME}" created successfully.' in created.stdout
    assert not (out / "metadata.sqlite").exists() or not mlmd.node_executions(
        mlmd.open_store(local_runner.sqlite_connection(str(out / "metadata.sqlite"))), PIPELINE_NAME, "Trainer")

    ran = tfx("run", "create", "--engine", "local", "--pipeline_name", PIPELINE_NAME)
    assert ran.returncode == 0, ran.stderr[-3000:]
    store = mlmd.open_store(local_runner.sqlite_connection(str(out / "metadata.sqlite")))
    for node in NODES:
        states = [e.last_known_state for e in mlmd.node_executions(store, PIPELINE_NAME, node)]
        assert states == [metadata_store_pb2.Execution.COMPLETE], node
    model_run = mlmd.latest_outputs(store, PIPELINE_NAME, "Trainer")["model_run"][0]
    training = json.loads((pathlib.Path(model_run.uri) / "training_summary.json").read_text())
    assert training["train_steps"] == 5 and training["model"]["d_model"] == 64  # the tiny preset
    examples = mlmd.latest_outputs(store, PIPELINE_NAME, "TextExampleGen")["examples"][0]
    assert mlmd.prop(examples, "corpus_files") == 1  # the corpus named in the environment
    assert 29_000 < mlmd.prop(examples, "corpus_bytes") <= 30_000  # its documents (blank separator lines aside)


def test_kubeflow_v2_runner_compiles_as_the_tfx_cli_runs_it(tmp_path):
    env = _env(DEEPSEEK_TFX_IMAGE="us-docker.pkg.dev/p/r/deepseek-tfx:1", DEEPSEEK_TFX_PIPELINE_ROOT="gs://b/root",
               DEEPSEEK_TFX_CORPUS="gs://b/corpus", DEEPSEEK_TFX_PRESET="tiny", DEEPSEEK_TFX_TRAIN_STEPS=9)
    result = subprocess.run([sys.executable, str(REPO / "kubeflow_v2_runner.py")], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    job = json.loads((tmp_path / "deepseek-tfx.json").read_text())
    json_format.ParseDict(job, pipeline_spec_pb2.PipelineJob())  # a valid PipelineJob
    spec = json_format.ParseDict(job["pipelineSpec"], pipeline_spec_pb2.PipelineSpec())
    assert set(NODES) <= set(spec.root.dag.tasks)
    train_args = spec.root.dag.tasks["Trainer"].inputs.parameters["train_args"].runtime_value.constant_value
    assert json.loads(train_args.string_value) == {"num_steps": 9}
    pusher = spec.root.dag.tasks["Pusher"].inputs.parameters["push_destination"].runtime_value.constant_value
    assert "gs://b/root/serving_model/deepseek" in pusher.string_value  # RemoteLayout's default

    missing = subprocess.run([sys.executable, str(REPO / "kubeflow_v2_runner.py")],
                             env={k: v for k, v in env.items() if k != "DEEPSEEK_TFX_CORPUS"}, cwd=tmp_path,
                             capture_output=True, text=True, timeout=600)
    assert missing.returncode != 0 and "DEEPSEEK_TFX_CORPUS" in missing.stderr
