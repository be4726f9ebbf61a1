"""Retraining on new spans through `deepseek-tfx retrain`, checked through ML Metadata.

span 1 -> version 1 pushed, the schema frozen; span 2 with `--last-spans 2` -> trained on spans 1 and 2, the
blessed tokenizer reused, warm-started from version 1, compared with it (also on span 1's eval split, the
reference), pushed as version 2; the same command again -> nothing re-executes; a new tokenizer with a one-step
model -> compared on bits per byte and refused; bad spans 3 -> random bytes and Chinese text stopped by the data
checks before training, garbage refused by the absolute bound, repetitive spam (better on its own eval split)
refused on the reference eval set; version 2 stays served throughout; `lineage` names the span of each pushed
version.
"""

import collections
import os
import random

import pytest
import tensorflow_model_analysis as tfma
from ml_metadata.proto import metadata_store_pb2

from deepseek_tfx.components import data_checks, mlmd
from deepseek_tfx.pipeline import cli, local_runner, report
from deepseek_tfx.pipeline.config import PIPELINE_NAME, PipelineConfig

pytestmark = pytest.mark.slow

OPTIONS = ["--preset", "tiny", "--train-steps", "20", "--vocab-size", "400", "--max-bits-per-byte", "6.0"]


def _retrain(corpus, output, *extra, exit_code=0):
    assert cli.main(["retrain", "--corpus", str(corpus), "--output", str(output), *OPTIONS, *extra]) == exit_code
    store = mlmd.open_store(local_runner.sqlite_connection(str(output / "metadata.sqlite")))
    return store, report.run_summary(store, PIPELINE_NAME, mlmd.latest_run_id(store, PIPELINE_NAME))


def _latest(store, node, key):
    return mlmd.latest_outputs(store, PIPELINE_NAME, node)[key][0]


def _states(store):
    found = collections.Counter()
    for context in store.get_contexts_by_type("node"):
        if context.name.startswith(f"{PIPELINE_NAME}."):
            for e in store.get_executions_by_context(context.id):
                found[(context.name.split(".", 1)[1], e.last_known_state, e.id)] += 1
    return found


def _inputs(store, node, key):
    """The ``key`` inputs of the node's latest execution, oldest span first."""
    execution = mlmd.node_executions(store, PIPELINE_NAME, node)[-1]
    return sorted(mlmd.execution_artifacts(store, execution.id, outputs=False)[key],
                  key=lambda a: mlmd.prop(a, "span"))


def _failed(evaluation_uri):
    return {(f.metric_key.name, f.metric_threshold.HasField("change_threshold"))
            for s in tfma.load_validation_result(evaluation_uri).metric_validations_per_slice for f in s.failures}


def test_retrain_on_new_spans(tmp_path, shakespeare, capsys):
    text = shakespeare.read_bytes()
    corpus, output = tmp_path / "corpus", tmp_path / "out"
    serving = output / "serving_model" / "deepseek"
    (corpus / "span-1").mkdir(parents=True)
    (corpus / "span-1" / "part.txt").write_bytes(text[:80_000])

    store, first = _retrain(corpus, output)
    assert (output / "schema" / "schema.pbtxt").exists() and (output / "schema" / "text_schema.pbtxt").exists()
    learned = _latest(store, "TokenizerGen", "tokenizer")
    assert first["span"] == 1 and first["blessed"] and first["warm_start"] == "no base model"
    assert "reused_from_artifact_id" not in learned.custom_properties
    v1 = first["pushed_version"]
    v1_model = _latest(store, "Trainer", "model")

    (corpus / "span-2").mkdir()
    (corpus / "span-2" / "part.txt").write_bytes(text[80_000:160_000])
    store, second = _retrain(corpus, output, "--last-spans", "2")
    reused = _latest(store, "TokenizerGen", "tokenizer")
    assert second["span"] == 2 and second["spans"] == [1, 2] and mlmd.prop(reused, "span") == 2
    for node in ("TokenizerGen", "Evaluator"):
        assert [mlmd.prop(a, "span") for a in _inputs(store, node, "examples")] == [1, 2], node
    # span 1 is the Examples the first run read, not read again
    assert [a.uri for a in _inputs(store, "Transform", "examples")] == [first["examples_uri"], second["examples_uri"]]
    assert mlmd.prop(reused, "reused_from_artifact_id") == learned.id
    assert second["warm_start"] == f"warm-started from {v1_model.uri}/Format-Serving"
    assert mlmd.prop(_latest(store, "Evaluator", "evaluation"), "compared_by") == "Perplexity"
    # from now on the frozen schema is imported, and the new data is checked against the first run's
    assert _inputs(store, "ExampleValidator", "schema")[0].uri.startswith(
        str(output / "pipeline_root" / "ImportSchemaGen"))
    assert _inputs(store, "DataChecks", "text_schema")[0].uri.startswith(
        str(output / "pipeline_root" / "ImportTextSchemaGen"))
    assert [a.id for a in _inputs(store, "DataChecks", "baseline_statistics")] == [
        a.id for a in mlmd.training_statistics(store, v1_model)]
    assert [a.uri for a in _inputs(store, "Evaluator", "reference_examples")] == [first["examples_uri"]]
    assert second["reference_bits_per_byte"] is not None and second["data_checks_passed"]
    assert second["blessed"] and int(second["pushed_version"]) > int(v1)
    assert sorted(os.listdir(serving)) == sorted([v1, second["pushed_version"]])
    v2 = second["pushed_version"]

    before = _states(store)
    store, _ = _retrain(corpus, output, "--last-spans", "2")  # no new span
    new = {(node, state) for node, state, _ in _states(store) - before}
    resolvers = {"span_window_resolver", "blessed_model_tokenizer_resolver", "warm_start_model_resolver",
                 "latest_blessed_model_resolver", "blessed_data_statistics_resolver", "reference_examples_resolver"}
    assert {node for node, state in new if state != metadata_store_pb2.Execution.CACHED} <= resolvers
    # Exactly one new execution of every node: the components cached, the resolvers (MLMD queries) complete.
    components = ("TextExampleGen", "StatisticsGen", "SchemaGen", "ImportSchemaGen", "ImportTextSchemaGen",
                  "ExampleValidator", "TokenizerGen", "Transform", "DataChecks", "Trainer", "Evaluator", "Pusher")
    assert collections.Counter((node, state) for node, state, _ in _states(store) - before) == collections.Counter(
        {**{(node, metadata_store_pb2.Execution.CACHED): 1 for node in components},
         **{(node, metadata_store_pb2.Execution.COMPLETE): 1 for node in resolvers}})
    assert sorted(os.listdir(serving)) == sorted([v1, v2])

    # A new tokenizer and a worse (one-step) model: perplexities over different vocabularies are not
    # comparable, so the gate compares bits per byte with the blessed model, and refuses it.
    store, retrained = _retrain(corpus, output, "--retrain-tokenizer", "--train-steps", "1")
    assert "reused_from_artifact_id" not in _latest(store, "TokenizerGen", "tokenizer").custom_properties
    assert retrained["warm_start"] == "not warm-started: the base model was trained with a different tokenizer"
    evaluation = _latest(store, "Evaluator", "evaluation")
    assert mlmd.prop(evaluation, "compared_by") == "BitsPerByte"
    assert retrained["blessed"] is False and _failed(evaluation.uri) == {("bits_per_byte", True)}
    assert sorted(os.listdir(serving)) == sorted([v1, v2])

    def span_3(data: bytes, *extra, exit_code=0):
        (corpus / "span-3").mkdir(exist_ok=True)
        (corpus / "span-3" / "part.txt").write_bytes(data)
        store, summary = _retrain(corpus, output, *extra, exit_code=exit_code)
        assert summary["span"] == 3 and "pushed_model_path" not in summary
        assert sorted(os.listdir(serving)) == sorted([v1, v2])
        return store, summary

    # Bad data is stopped before training, each reason named: random bytes (ExampleGen replaces the invalid UTF-8
    # with U+FFFD, and their tokens drift). Text in another script (drift alone) is checked on statistics in
    # test_data_checks, and a span past the checks but above the absolute bound in test_e2e: one pipeline run each
    # was not worth its minute here.
    rng = random.Random(0)
    byte_values = [b for b in range(1, 256) if b not in b"\r\n"]
    random_bytes = b"\n\n".join(bytes(rng.choice(byte_values) for _ in range(200)) for _ in range(300))
    trainers = len(mlmd.node_executions(store, PIPELINE_NAME, "Trainer"))
    store, stopped = span_3(random_bytes, exit_code=1)
    assert stopped["data_checks_passed"] is False and "blessed" not in stopped
    assert {reason.split(":")[0] for reason in stopped["data_checks_failed"]} == {"replacement_chars", "token_ids"}
    assert len(mlmd.node_executions(store, PIPELINE_NAME, "Trainer")) == trainers  # nothing trained
    assert "FAILED, nothing trained or pushed" in report.format_summary(stopped)

    # Repetitive spam past the data checks: its model is better on the spam's own eval split, but worse on the
    # reference eval set (span 1's eval split) than version 2 by more than the tolerance: not blessed.
    spam = ["Buy cheap watches now, limited offer!", "Click here to win a free cruise today.",
            "Lose ten pounds in ten days with this one trick.", "Your account has won a prize, reply now."]
    store, spammed = span_3("\n\n".join(" ".join(rng.choice(spam) for _ in range(3)) for _ in range(600)).encode(),
                            "--set", "data_checks.max_token_drift=none")
    evaluation = _latest(store, "Evaluator", "evaluation")
    assert spammed["blessed"] is False and spammed["eval_bits_per_byte"] < 6.0
    assert _failed(evaluation.uri) == {("bits_per_byte", True)}
    assert [r for r in spammed["not_blessed_because"] if "on the reference eval set" in r], spammed
    assert mlmd.prop(evaluation, "reference_candidate_bits_per_byte") > \
        mlmd.prop(evaluation, "reference_baseline_bits_per_byte") + 0.05
    assert mlmd.prop(evaluation, "new_candidate_bits_per_byte") < mlmd.prop(evaluation, "new_baseline_bits_per_byte")

    # the frozen schema on demand: shown, reset (runs infer again), frozen again from the latest pushed model's run
    capsys.readouterr()
    assert cli.main(["schema", "show", "--output", str(output)]) == 0
    shown = capsys.readouterr().out
    assert 'name: "text"' in shown and 'name: "token_ids"' in shown and "value_count" in shown
    assert cli.main(["schema", "reset", "--output", str(output)]) == 0
    assert not (output / "schema" / "text_schema.pbtxt").exists()
    assert cli.main(["schema", "freeze", "--output", str(output)]) == 0
    pushed_model = mlmd.producer_inputs(store, [mlmd.latest_pushed_model(store)], "model")[0]  # version 2's
    expected = data_checks.text_constraints(
        data_checks.load_statistics(mlmd.training_statistics(store, pushed_model)[0].uri), margin=2.0)
    assert data_checks.read_schema(str(output / "schema"), "text_schema.pbtxt") == expected

    capsys.readouterr()
    assert cli.main(["lineage", "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    assert f"version {v1}: trained on span 1 " in printed and f"version {v2}: trained on spans 1, 2 " in printed
    assert "span 3" not in printed


def test_last_spans_backfills_spans_no_run_has_read(tmp_path, shakespeare):
    """`retrain --last-spans 3` on a corpus first seen with three spans reads spans 1 and 2 before the run."""
    text = shakespeare.read_bytes()
    corpus = tmp_path / "corpus"
    for span, size in ((1, 4_000), (2, 10_000), (3, 6_000)):  # sizes tell the spans apart
        (corpus / f"span-{span}").mkdir(parents=True)
        (corpus / f"span-{span}" / "part.txt").write_bytes(text[span * 10_000:span * 10_000 + size])
    metadata = local_runner.sqlite_connection(str(tmp_path / "metadata.sqlite"))
    args = dict(pipeline_name=PIPELINE_NAME, pipeline_root=str(tmp_path / "root"), base=str(corpus),
                pattern="span-{SPAN}/*", metadata=metadata, beam_args=local_runner.default_beam_args(24_000))

    assert local_runner.backfill_spans(config=PipelineConfig(last_spans=1), **args) == []
    assert local_runner.backfill_spans(config=PipelineConfig(last_spans=3), **args) == [1, 2]
    store = mlmd.open_store(metadata)
    assert mlmd.ingested_spans(store, PIPELINE_NAME, "TextExampleGen") == {1, 2}
    examples = {mlmd.prop(a, "span"): a for e in mlmd.node_executions(store, PIPELINE_NAME, "TextExampleGen")
                for a in mlmd.execution_artifacts(store, e.id)["examples"]}
    # each span's own file (document bytes, without the blank lines between documents)
    assert 3_500 < mlmd.prop(examples[1], "corpus_bytes") <= 4_000
    assert 9_000 < mlmd.prop(examples[2], "corpus_bytes") <= 10_000
    described = sorted(mlmd.prop(a, "span") for e in mlmd.node_executions(store, PIPELINE_NAME, "StatisticsGen")
                       for a in mlmd.execution_artifacts(store, e.id, outputs=False)["examples"])
    assert described == [1, 2]  # each backfilled span has its statistics and validation
    assert len(mlmd.node_executions(store, PIPELINE_NAME, "ExampleValidator")) == 2
    assert local_runner.backfill_spans(config=PipelineConfig(last_spans=3), **args) == []  # already read
