"""The whole DAG on a slice of tinyshakespeare with the tiny preset, checked through ML Metadata.

The module's fixture makes four runs on one pipeline root, in this order, and keeps what each test needs
from each run, so that no test depends on another test or on the order tests run in:
  0. a first run with no baseline and a bits-per-byte bound no model can meet: not blessed, nothing pushed;
  1. the same model (Trainer cached), a reachable bound: blessed on the absolute bound alone, pushed; its
     TFMA metrics equal a NumPy computation over the same eval examples;
  2. the same again: nothing re-executes;
  3. a worse candidate (one training step): compared with run 1's model on perplexity, not blessed,
     not pushed; the served version stays run 1's.
"""

import collections
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import numpy as np
import portpicker
import pytest
import sentencepiece
import tensorflow as tf
import tensorflow_model_analysis as tfma
from ml_metadata.proto import metadata_store_pb2

from deepseek_tfx.components import mlmd
from deepseek_tfx.pipeline import cli, local_runner, report
from deepseek_tfx.pipeline.config import PIPELINE_NAME, PipelineConfig
from deepseek_tfx.serving import client
from deepseek_tfx.trainer_module.config import ModelConfig, TokenizerConfig
from deepseek_tfx.trainer_module import export
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.tokenizer import EOS_ID, MODEL_FILE

pytestmark = pytest.mark.slow

COMPONENTS = ["TextExampleGen", "StatisticsGen", "SchemaGen", "ExampleValidator",
              "blessed_model_tokenizer_resolver", "TokenizerGen", "Transform", "blessed_data_statistics_resolver",
              "DataChecks", "warm_start_model_resolver", "Trainer",
              "latest_blessed_model_resolver", "reference_examples_resolver", "Evaluator", "Pusher"]
RESOLVERS = ("blessed_model_tokenizer_resolver", "warm_start_model_resolver", "latest_blessed_model_resolver",
             "blessed_data_statistics_resolver", "reference_examples_resolver")
FROZEN_SCHEMA = ("ImportSchemaGen", "ImportTextSchemaGen")  # in every run after the first push
SLICE_BYTES = 200_000
# Multi-processing Beam workers, as for large corpora, so the tf.text ops run in worker processes here
# (a corpus this small would otherwise run in memory). Every run uses the same options: they are part of
# the executors' specs, so changing them would defeat the cache.
BEAM = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
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
    unreachable = local_runner.run(output=str(output), config=CONFIG.replace(max_bits_per_byte=1.0),
                                   corpus=str(corpus), beam_args=BEAM)
    store = mlmd.open_store(local_runner.sqlite_connection(str(output / "metadata.sqlite")))
    run0 = {"summary": unreachable, "executions": collections.Counter(_executions(store)),
            "evaluation": mlmd.latest_outputs(store, PIPELINE_NAME, "Evaluator")["evaluation"][0],
            "serving": sorted(os.listdir(output / "serving_model" / "deepseek"))
            if (output / "serving_model" / "deepseek").exists() else []}
    summary = local_runner.run(output=str(output), config=CONFIG, corpus=str(corpus), beam_args=BEAM)
    serving = output / "serving_model" / "deepseek"
    run1 = {"executions": collections.Counter(_executions(store)), "serving": sorted(os.listdir(serving)),
            "evaluation": mlmd.latest_outputs(store, PIPELINE_NAME, "Evaluator")["evaluation"][0],
            "examples": mlmd.latest_outputs(store, PIPELINE_NAME, "TextExampleGen")["examples"][0],
            "tokenizer": mlmd.latest_outputs(store, PIPELINE_NAME, "TokenizerGen")["tokenizer"][0],
            "pushed": mlmd.latest_pushed_model(store)}
    local_runner.run(output=str(output), config=CONFIG, corpus=str(corpus), beam_args=BEAM)
    run2 = {"executions": collections.Counter(_executions(store)), "serving": sorted(os.listdir(serving))}
    worse = local_runner.run(output=str(output), config=CONFIG.replace(train_steps=1), corpus=str(corpus),
                             beam_args=BEAM)
    run3 = {"summary": worse, "serving": sorted(os.listdir(serving)),
            "evaluation": mlmd.latest_outputs(store, PIPELINE_NAME, "Evaluator")["evaluation"][0]}
    return {"output": output, "corpus": corpus, "summary": summary, "store": store, "run0": run0, "run1": run1,
            "run2": run2, "run3": run3}


def _executions(store):
    """(node id, state name) of every execution, from the node contexts."""
    found = []
    for node in (*COMPONENTS, *FROZEN_SCHEMA):
        context = store.get_context_by_type_and_name("node", f"{PIPELINE_NAME}.{node}")
        if context is None:  # not in the pipeline yet
            continue
        for execution in store.get_executions_by_context(context.id):
            found.append((node, metadata_store_pb2.Execution.State.Name(execution.last_known_state)))
    return found


def _failed_thresholds(evaluation_uri):
    """(metric name, 'value' or 'change') of every failed threshold."""
    failed = set()
    for per_slice in tfma.load_validation_result(evaluation_uri).metric_validations_per_slice:
        for failure in per_slice.failures:
            kind = "change" if failure.metric_threshold.HasField("change_threshold") else "value"
            failed.add((failure.metric_key.name, kind))
    return failed


def test_first_run_is_gated_by_the_absolute_bound_alone(first_run):
    run0 = first_run["run0"]
    assert run0["executions"] == collections.Counter({(node, "COMPLETE"): 1 for node in COMPONENTS})
    assert run0["summary"]["blessed"] is False and "pushed_model_path" not in run0["summary"]
    assert run0["serving"] == []
    assert mlmd.prop(run0["evaluation"], "compared_by") == "none (no baseline)"
    assert _failed_thresholds(run0["evaluation"].uri) == {("bits_per_byte", "value")}
    # The summary says why: the failed bound, with the candidate's value.
    assert run0["summary"]["not_blessed_because"] == [
        f"bits_per_byte {run0['summary']['eval_bits_per_byte']:.4f} above the bound 1"]
    assert f"blessed:       no (bits_per_byte {run0['summary']['eval_bits_per_byte']:.4f} above the bound 1)" in \
        report.format_summary(run0["summary"])

    # Run 1 judged the same (cached) model against a reachable bound: blessed, with no baseline.
    new = first_run["run1"]["executions"] - run0["executions"]
    judged_again = {"Evaluator", "Pusher", *RESOLVERS}
    assert new == collections.Counter({(node, "COMPLETE" if node in judged_again else "CACHED"): 1
                                       for node in COMPONENTS})
    assert first_run["summary"]["blessed"] is True
    evaluation = first_run["run1"]["evaluation"]
    assert mlmd.prop(evaluation, "compared_by") == "none (no baseline)"


def test_examples_record_what_was_read(first_run):
    examples = first_run["run1"]["examples"]
    assert mlmd.prop(examples, "corpus_files") == 2
    assert mlmd.prop(examples, "corpus_skipped_files") == 1  # cover.png
    assert mlmd.prop(examples, "corpus_replaced_invalid_utf8") == 2
    assert mlmd.prop(examples, "span") == 0
    summary = first_run["summary"]
    assert summary["documents"] == mlmd.prop(examples, "corpus_documents") > 1000
    assert summary["corpus_tokens"] < 0.6 * summary["bytes"]  # learned subwords: fewer tokens than bytes
    tokenizer = first_run["run1"]["tokenizer"]
    assert mlmd.prop(tokenizer, "tokenizer_type") == "bpe"
    assert mlmd.prop(tokenizer, "vocab_size") == 512 and mlmd.prop(tokenizer, "span") == 0
    assert 1000 < mlmd.prop(tokenizer, "sample_size") <= TokenizerConfig().max_sentences


def test_model_learned_was_blessed_and_pushed(first_run):
    summary = first_run["summary"]
    assert summary["train_steps"] == 60
    assert summary["eval_perplexity"] < 512 / 4  # uniform over the 512-piece vocabulary would be 512
    assert summary["eval_bits_per_byte"] < 4.5
    assert summary["blessed"] is True
    version_dir = summary["pushed_model_path"]
    assert version_dir == os.path.join(first_run["output"], "serving_model", "deepseek", summary["pushed_version"])
    assert os.path.exists(os.path.join(version_dir, "saved_model.pb"))
    serving_base = first_run["output"] / "serving_model"
    assert summary["serving_configs"] == {name: str(serving_base / name)
                                          for name in ("models.config", "batching.config", "kubernetes.yaml")}
    # the whole serving base is mounted: models.config and batching.config sit beside the model directory
    assert f"-v {serving_base}:/models " in summary["serve_command"]
    assert "--model_config_file=/models/models.config" in summary["serve_command"]


def test_lineage_reaches_the_examples_and_the_corpus(first_run, capsys):
    store = first_run["store"]
    pushed, examples = first_run["run1"]["pushed"], first_run["run1"]["examples"]
    assert mlmd.latest_pushed_model(store).id == pushed.id  # no later run pushed
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
    version = first_run["summary"]["pushed_version"]
    assert printed.startswith(f"version {version}: trained on span 0 (")
    assert "\nPushedModel #" in printed
    for needle in ("<- model_blessing: ModelBlessing", "(blessed=1)", "<- transform_graph: TransformGraph",
                   "span=0", f"<- corpus: {first_run['corpus']}/*"):
        assert needle in printed


FRESH_PROCESS = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (custom ops, as TF Serving has them)
model = tf.saved_model.load(sys.argv[1])
out = model.signatures["generate"](
    prompt=tf.constant(["ROMEO:", ""]), max_new_tokens=tf.constant([24, 24]), temperature=tf.constant([0.0, 0.0]),
    top_k=tf.constant([0, 0]), seed=tf.constant([0, 0]))
score = model.signatures["score"](text=tf.constant(["First Citizen:\nSpeak, speak."]))
project = sorted(m for m in sys.modules if m.split(".")[0] in ("deepseek_tfx", "tfx"))
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


def test_second_run_reexecutes_nothing_but_the_checks_against_the_frozen_schema(first_run):
    """Run 1 pushed, so it froze the schema: run 2 imports it, and only the checks that read it run again."""
    run1, run2 = first_run["run1"], first_run["run2"]
    assert (first_run["output"] / "schema" / "schema.pbtxt").exists()
    new = run2["executions"] - run1["executions"]
    checked_again = {"ExampleValidator", "DataChecks", *FROZEN_SCHEMA}
    assert new == collections.Counter(
        {(node, "CACHED"): 1 for node in COMPONENTS if node not in RESOLVERS and node not in checked_again}
        | {(node, "COMPLETE"): 1 for node in (*RESOLVERS, *checked_again)})  # a resolver only queries MLMD
    assert run2["serving"] == run1["serving"] and len(run1["serving"]) == 1


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


def _numpy_metrics(pushed_dir, tokenizer_dir, eval_examples_dir):
    """Perplexity and bits per byte over the eval split: sentencepiece ids, model logits, NumPy NLL."""
    config = ModelConfig.from_dict(export.read_export_config(pushed_dir)["model"])
    model = DeepSeekLM(config)
    model(tf.zeros([1, 8], tf.int64))
    model.set_weights([v.numpy() for v in tf.saved_model.load(pushed_dir).model_variables])
    sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(tokenizer_dir, MODEL_FILE))
    files = glob.glob(os.path.join(eval_examples_dir, "*"))
    texts = [tf.train.Example.FromString(r.numpy()).features.feature["text"].bytes_list.value[0]
             for r in tf.data.TFRecordDataset(files, compression_type="GZIP")]
    t = config.context_len
    nll_sum = tokens = num_bytes = 0.0
    for text in texts:
        ids = np.array(sp.encode(text.decode("utf-8")), np.int64)
        num_bytes += len(text)
        if not len(ids):
            continue
        inputs = np.concatenate([[EOS_ID], ids[:-1]])
        for start in range(0, len(ids), t):  # windows of context_len, each scored on its own
            x, y = inputs[start:start + t], ids[start:start + t]
            logits = model(x[None, :], training=False).numpy()[0].astype(np.float64)
            log_z = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
            nll_sum += float(np.sum(log_z - logits[np.arange(len(y)), y]))
            tokens += len(y)
    return {"perplexity": math.exp(nll_sum / tokens), "bits_per_byte": nll_sum / (math.log(2) * num_bytes),
            "example_count": len(texts)}


def test_evaluator_metrics_equal_numpy_over_the_eval_examples(first_run):
    summary = first_run["summary"]
    examples, tokenizer = first_run["run1"]["examples"], first_run["run1"]["tokenizer"]
    expected = _numpy_metrics(summary["pushed_model_path"], tokenizer.uri,
                              os.path.join(examples.uri, "Split-eval"))
    assert summary["eval_examples"] == expected["example_count"]
    assert summary["eval_perplexity"] == pytest.approx(expected["perplexity"], rel=1e-4)
    assert summary["eval_bits_per_byte"] == pytest.approx(expected["bits_per_byte"], rel=1e-4)


def test_worse_candidate_is_not_blessed_and_not_pushed(first_run):
    blessed, worse, evaluation = first_run["summary"], first_run["run3"]["summary"], first_run["run3"]["evaluation"]
    assert worse["blessed"] is False and "pushed_model_path" not in worse
    assert worse["eval_perplexity"] > blessed["eval_perplexity"]
    assert worse["eval_bits_per_byte"] < CONFIG.max_bits_per_byte  # so only the comparison failed
    assert mlmd.prop(evaluation, "compared_by") == "Perplexity"  # the tokenizer was reused
    assert _failed_thresholds(evaluation.uri) == {("perplexity", "change")}
    [reason] = worse["not_blessed_because"]
    increase = float(reason.split()[1])
    assert reason == (f"perplexity {increase:+.4f} against the last blessed model ({worse['eval_perplexity']:.4f} "
                      f"against {blessed['eval_perplexity']:.4f}), tolerance 0")
    # the increase over the blessed model, both scored on the same eval split
    assert math.isclose(increase, worse["eval_perplexity"] - blessed["eval_perplexity"], rel_tol=1e-3, abs_tol=1e-3)
    assert first_run["run3"]["serving"] == first_run["run1"]["serving"]
