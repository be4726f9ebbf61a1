"""InfraValidator before the Pusher: its wiring, the requests it sends, and the export's warmup requests.

No Docker engine runs on the test machines, so TF Serving itself is not started here: the tests check what
TFX would start and send, and answer those requests with the exported model loaded in this process.
"""

import gzip
import logging
import os

import pytest
import tensorflow as tf
from tensorflow_serving.apis import prediction_log_pb2
from tfx.components.infra_validator import request_builder
from tfx.proto import infra_validator_pb2
from tfx.types import standard_artifacts
from tfx.utils import proto_utils

from deepseek_tfx.pipeline import local_runner
from deepseek_tfx.pipeline.config import PipelineConfig
from deepseek_tfx.trainer_module import export
from deepseek_tfx.trainer_module.tokenizer import ByteTokenizer
from tests.export_helpers import TransformOutputStandIn, tiny_model


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    model = tiny_model(32, seed=5)
    path = str(tmp_path_factory.mktemp("model") / "Format-Serving")
    export.export_serving_model(model, TransformOutputStandIn(), ByteTokenizer(), path)
    return path


def _spec(component, name, proto):
    """A proto exec property of ``component`` (stored as JSON)."""
    return proto_utils.json_to_proto(component.exec_properties[name], proto)


def _prepare(tmp_path, monkeypatch, docker):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(f"Paragraph {i} of some text." for i in range(40)))
    monkeypatch.setattr(local_runner, "docker_reachable", lambda: docker)
    return local_runner.prepare(output=str(tmp_path / "out"), config=PipelineConfig(preset="tiny"),
                                corpus=str(corpus))


def test_infra_validator_runs_before_the_pusher_when_docker_answers(tmp_path, monkeypatch):
    local = _prepare(tmp_path, monkeypatch, (True, "Docker engine at unix:///var/run/docker.sock"))
    nodes = {c.id: c for c in local.pipeline.components}
    infra, pusher = nodes["InfraValidator"], nodes["Pusher"]
    assert infra.inputs["model"] is nodes["Trainer"].outputs["model"]
    assert infra.inputs["examples"] is nodes["TextExampleGen"].outputs["examples"]
    assert pusher.inputs["infra_blessing"] is infra.outputs["blessing"]
    ids = [c.id for c in local.pipeline.components]
    assert ids.index("InfraValidator") < ids.index("Pusher")
    serving = _spec(infra, "serving_spec", infra_validator_pb2.ServingSpec())
    assert list(serving.tensorflow_serving.tags) == ["2.16.1"] and serving.HasField("local_docker")
    assert serving.model_name == "deepseek"
    request = _spec(infra, "request_spec", infra_validator_pb2.RequestSpec())
    assert list(request.tensorflow_serving.signature_names) == ["serving_default"]
    assert (request.split_name, request.num_examples) == ("eval", 2)


def test_without_docker_the_infra_validator_is_skipped_with_one_log_line(tmp_path, monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger=local_runner.log.name):
        local = _prepare(tmp_path, monkeypatch, (False, "no Docker engine answers at unix:///x (DockerException)"))
    assert "InfraValidator" not in {c.id for c in local.pipeline.components}
    assert "infra_blessing" not in {c.id: c for c in local.pipeline.components}["Pusher"].inputs
    skips = [r.getMessage() for r in caplog.records if "InfraValidator" in r.getMessage()]
    assert skips == ["InfraValidator skipped: no Docker engine answers at unix:///x (DockerException)"]


def test_docker_reachable_says_why_not_when_no_engine_answers(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    reachable, reason = local_runner.docker_reachable(timeout=2)
    assert not reachable and reason.startswith("no Docker engine answers at unix:///nonexistent/docker.sock")


def _examples_artifact(tmp_path, texts):
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "examples")
    examples.split_names = '["train", "eval"]'
    split = tmp_path / "examples" / "Split-eval"
    split.mkdir(parents=True)
    with tf.io.TFRecordWriter(str(split / "data.gz"), options="GZIP") as writer:
        for text in texts:
            writer.write(tf.train.Example(features=tf.train.Features(feature={"text": tf.train.Feature(
                bytes_list=tf.train.BytesList(value=[text.encode()]))})).SerializeToString())
    assert gzip.open(split / "data.gz").read(1)  # really gzip, as ExampleGen writes
    return examples


def test_the_requests_tfx_builds_for_the_query_step_are_answered_by_the_model(tmp_path, monkeypatch, export_dir):
    local = _prepare(tmp_path, monkeypatch, (True, "docker"))
    request_spec = _spec({c.id: c for c in local.pipeline.components}["InfraValidator"], "request_spec",
                         infra_validator_pb2.RequestSpec())
    model = standard_artifacts.Model()
    model.uri = os.path.dirname(export_dir)
    examples = _examples_artifact(tmp_path, ["First Citizen:\nSpeak.", "All:\nSpeak, speak.", "unused"])
    requests = request_builder.build_requests("deepseek", model, examples, request_spec)
    assert len(requests) == 2
    loaded = tf.saved_model.load(export_dir)
    tokens = []
    for request in requests:
        assert (request.model_spec.name, request.model_spec.signature_name) == ("deepseek", "serving_default")
        inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
        outputs = loaded.signatures["serving_default"](**inputs)
        tokens += outputs["num_tokens"].numpy().tolist()
        assert all(float(v) > 0 for v in outputs["nll_sum"])
    assert sorted(tokens) == sorted([len("First Citizen:\nSpeak."), len("All:\nSpeak, speak.")])  # two read


def test_the_export_writes_warmup_requests_that_the_model_answers(export_dir):
    path = os.path.join(export_dir, "assets.extra", export.WARMUP_FILE)
    logs = [prediction_log_pb2.PredictionLog.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path)]
    requests = [log.predict_log.request for log in logs]
    assert [r.model_spec.signature_name for r in requests] == ["generate", "score"]
    loaded = tf.saved_model.load(export_dir)
    for request in requests:  # as TF Serving replays them at load, before the version is AVAILABLE
        signature = loaded.signatures[request.model_spec.signature_name]
        assert set(request.inputs) == set(signature.structured_input_signature[1])
        outputs = signature(**{k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()})
        assert all(v.shape == (len(export.EXAMPLE_PROMPTS),) for v in outputs.values())
    prompts = tf.make_ndarray(requests[0].inputs["prompt"]).tolist()
    assert [p.decode() for p in prompts] == list(export.EXAMPLE_PROMPTS)


def test_warmup_requests_stay_within_the_smallest_limits(export_dir):
    from deepseek_tfx.trainer_module.config import ServingConfig

    loaded = tf.saved_model.load(export_dir)  # its own limits are the defaults; the requests shrink to any limits
    tight = ServingConfig(max_batch_size=1, max_new_tokens=1, max_text_bytes=1)
    for request in export.warmup_requests(loaded.signatures, tight):
        for tensor in request.inputs.values():
            assert tensor.tensor_shape.dim[0].size == 1
        if request.model_spec.signature_name == "generate":
            assert tf.make_ndarray(request.inputs["max_new_tokens"]).tolist() == [1]
        texts = tf.make_ndarray(request.inputs.get("prompt") or request.inputs["text"]).tolist()
        assert all(len(t) <= 1 for t in texts)
