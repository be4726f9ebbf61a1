"""The whole DAG on a slice of tinyshakespeare with the tiny preset, checked through ML Metadata."""

import collections
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import portpicker
import pytest
from ml_metadata.proto import metadata_store_pb2

from pipeline import cli, local_runner, report
from pipeline.config import PIPELINE_NAME, PipelineConfig
from serving import client
from trainer_module.config import TokenizerConfig

pytestmark = pytest.mark.slow

COMPONENTS = ["TextExampleGen", "StatisticsGen", "SchemaGen", "ExampleValidator",
              "blessed_model_tokenizer_resolver", "TokenizerGen", "Transform", "Trainer",
              "latest_blessed_model_resolver", "Evaluator", "Pusher"]
RESOLVERS = ("blessed_model_tokenizer_resolver", "latest_blessed_model_resolver")
SLICE_BYTES = 200_000
CONFIG = PipelineConfig(preset="tiny", train_steps=60, max_bits_per_byte=6.0,
                        tokenizer=TokenizerConfig(vocab_size=512))


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, shakespeare):
    root = tmp_path_factory.mktemp("e2e")
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / "shakespeare.txt").write_bytes(shakespeare.read_bytes()[:SLICE_BYTES])
    (corpus / "latin1_notes.txt").write_bytes("Caf\xe9 au lait.\n\nNa\xefve art.\n".encode("latin-1"))
    (corpus / "cover.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    output = root / "out"
    summary = local_runner.run(output=str(output), config=CONFIG, corpus=str(corpus))
    connection = local_runner.sqlite_connection(str(output / "metadata.sqlite"))
    return {"output": output, "corpus": corpus, "summary": summary, "store": report.open_store(connection)}


def _executions(store):
    """(node id, state name) of every execution, from the node contexts."""
    found = []
    for node in COMPONENTS:
        context = store.get_context_by_type_and_name("node", f"{PIPELINE_NAME}.{node}")
        for execution in store.get_executions_by_context(context.id):
            found.append((node, metadata_store_pb2.Execution.State.Name(execution.last_known_state)))
    return found


def test_every_component_ran_once_successfully(first_run):
    counts = collections.Counter(_executions(first_run["store"]))
    assert counts == collections.Counter({(node, "COMPLETE"): 1 for node in COMPONENTS})


def test_examples_record_what_was_read(first_run):
    store = first_run["store"]
    examples = report.latest_outputs(store, PIPELINE_NAME, "TextExampleGen")["examples"][0]
    assert report.prop(examples, "corpus_files") == 2
    assert report.prop(examples, "corpus_skipped_files") == 1  # cover.png
    assert report.prop(examples, "corpus_replaced_invalid_utf8") == 2
    assert report.prop(examples, "span") == 0
    summary = first_run["summary"]
    assert summary["documents"] == report.prop(examples, "corpus_documents") > 1000
    assert summary["corpus_tokens"] < 0.6 * summary["bytes"]  # learned subwords: fewer tokens than bytes
    tokenizer = report.latest_outputs(store, PIPELINE_NAME, "TokenizerGen")["tokenizer"][0]
    assert report.prop(tokenizer, "tokenizer_type") == "bpe"
    assert report.prop(tokenizer, "vocab_size") == 512 and report.prop(tokenizer, "span") == 0
    assert 1000 < report.prop(tokenizer, "sample_size") <= TokenizerConfig().max_sentences


def test_model_learned_was_blessed_and_pushed(first_run):
    summary = first_run["summary"]
    assert summary["train_steps"] == 60
    assert summary["eval_perplexity"] < 512 / 4  # uniform over the 512-piece vocabulary would be 512
    assert summary["eval_bits_per_byte"] < 4.5
    assert summary["blessed"] is True
    version_dir = summary["pushed_model_path"]
    assert version_dir == os.path.join(first_run["output"], "serving_model", "deepseek", summary["pushed_version"])
    assert os.path.exists(os.path.join(version_dir, "saved_model.pb"))


def test_lineage_reaches_the_examples_and_the_corpus(first_run, capsys):
    store = first_run["store"]
    pushed = report.latest_pushed_model(store)
    examples = report.latest_outputs(store, PIPELINE_NAME, "TextExampleGen")["examples"][0]
    # Walk MLMD events upstream from the pushed model, independently of the report module.
    frontier, seen = [pushed.id], set()
    while frontier:
        artifact_id = frontier.pop()
        seen.add(artifact_id)
        events = store.get_events_by_artifact_ids([artifact_id])
        producers = [e.execution_id for e in events if e.type == metadata_store_pb2.Event.OUTPUT]
        for event in store.get_events_by_execution_ids(producers):
            if event.type == metadata_store_pb2.Event.INPUT and event.artifact_id not in seen:
                frontier.append(event.artifact_id)
    assert examples.id in seen

    assert cli.main(["lineage", "--output", str(first_run["output"])]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("PushedModel")
    for needle in ("<- model_blessing: ModelBlessing", "(blessed=1)", "<- transform_graph: TransformGraph",
                   "span=0", f"<- corpus: {first_run['corpus']}/*"):
        assert needle in printed


FRESH_PROCESS = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (custom ops, as TF Serving has them)
model = tf.saved_model.load(sys.argv[1])
out = model.signatures["generate"](
    prompt=tf.constant(["ROMEO:", ""]), max_new_tokens=tf.constant(24), temperature=tf.constant(0.0),
    top_k=tf.constant(0), seed=tf.constant(0))
score = model.signatures["score"](text=tf.constant(["First Citizen:\nSpeak, speak."]))
project = sorted(m for m in sys.modules if m.split(".")[0] in ("trainer_module", "pipeline", "components", "tfx"))
print(json.dumps({"texts": [t.decode("utf-8") for t in out["text"].numpy()],
                  "perplexity": float(score["perplexity"][0]), "project_modules": project}))
"""


def test_pushed_model_generates_in_a_fresh_process(first_run):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", FRESH_PROCESS, first_run["summary"]["pushed_model_path"]],
                            capture_output=True, text=True, env=env, cwd="/", timeout=300, check=True)
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["project_modules"] == []
    assert len(answer["texts"]) == 2 and all(len(t) > 0 for t in answer["texts"])
    assert 1.0 < answer["perplexity"] < 512


def test_second_run_reexecutes_nothing(first_run):
    store = first_run["store"]
    before = collections.Counter(_executions(store))
    versions = sorted(os.listdir(first_run["output"] / "serving_model" / "deepseek"))
    local_runner.run(output=str(first_run["output"]), config=CONFIG, corpus=str(first_run["corpus"]))
    new = collections.Counter(_executions(store)) - before
    assert new == collections.Counter(
        {(node, "CACHED"): 1 for node in COMPONENTS if node not in RESOLVERS}
        | {(node, "COMPLETE"): 1 for node in RESOLVERS})  # a resolver only queries MLMD
    assert sorted(os.listdir(first_run["output"] / "serving_model" / "deepseek")) == versions


REST_BODY_IN_FRESH_PROCESS = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401
model = tf.saved_model.load(sys.argv[1])
body = json.loads(sys.argv[2])
signature = model.signatures[body["signature_name"]]
specs = signature.structured_input_signature[1]
inputs = {name: tf.constant(value, dtype=specs[name].dtype) for name, value in body["inputs"].items()}
outputs = signature(**inputs)
# TF Serving's columnar response: a single named output maps "outputs" straight to its value.
print(json.dumps({"outputs": [t.decode("utf-8") for t in outputs["text"].numpy()]}))
"""


def test_pushed_model_answers_the_clients_exact_rest_body(first_run):
    body = client.generate_request(["ROMEO:", "JULIET: O", ""], max_new_tokens=16, temperature=0.7, top_k=20,
                                   seed=3)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", REST_BODY_IN_FRESH_PROCESS, first_run["summary"]["pushed_model_path"], json.dumps(body)],
        capture_output=True, text=True, env=env, cwd="/", timeout=300, check=True)
    texts = client.parse_generate_response(json.loads(result.stdout.strip().splitlines()[-1]))
    assert len(texts) == 3 and all(isinstance(t, str) and t for t in texts)


@pytest.mark.skipif(shutil.which("tensorflow_model_server") is None,
                    reason="tensorflow_model_server is not on PATH (no TF Serving binary on this machine)")
def test_real_tensorflow_model_server_answers_rest_and_grpc(first_run):
    base = os.path.dirname(first_run["summary"]["pushed_model_path"])
    rest_port, grpc_port = portpicker.pick_unused_port(), portpicker.pick_unused_port()
    server = subprocess.Popen(["tensorflow_model_server", f"--port={grpc_port}", f"--rest_api_port={rest_port}",
                               "--model_name=deepseek", f"--model_base_path={base}"])
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/v1/models/deepseek", timeout=2) as r:
                    if b"AVAILABLE" in r.read():
                        break
            except OSError:
                pass
            assert time.time() < deadline, "TF Serving did not load the model within 120 s"
            time.sleep(1)
        texts = client.rest_generate(f"http://127.0.0.1:{rest_port}", "deepseek", ["ROMEO:"], max_new_tokens=8)
        assert len(texts) == 1 and texts[0]
        texts = client.grpc_generate(f"127.0.0.1:{grpc_port}", "deepseek", ["ROMEO:"], max_new_tokens=8)
        assert len(texts) == 1 and texts[0]
    finally:
        server.terminate()
        server.wait(timeout=30)
