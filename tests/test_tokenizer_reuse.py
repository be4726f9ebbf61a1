"""Retraining on a new span reuses the blessed model's tokenizer; --retrain-tokenizer learns a new one."""

import os

import pytest
import tensorflow_model_analysis as tfma
from ml_metadata.proto import metadata_store_pb2

from pipeline import local_runner, report
from pipeline.config import PIPELINE_NAME, PipelineConfig
from trainer_module.config import TokenizerConfig

pytestmark = pytest.mark.slow

CONFIG = PipelineConfig(preset="tiny", train_steps=20, max_bits_per_byte=8.0,
                        tokenizer=TokenizerConfig(vocab_size=400))


def _tokenizer(store):
    return report.latest_outputs(store, PIPELINE_NAME, "TokenizerGen")["tokenizer"][0]


def _tokenizer_gen_states(store):
    return [e.last_known_state for e in report.node_executions(store, PIPELINE_NAME, "TokenizerGen")]


def test_new_span_reuses_the_blessed_tokenizer(tmp_path, shakespeare):
    text = shakespeare.read_bytes()
    corpus, output = tmp_path / "corpus", tmp_path / "out"
    (corpus / "span-1").mkdir(parents=True)
    (corpus / "span-1" / "part.txt").write_bytes(text[:80_000])
    first = local_runner.run(output=str(output), config=CONFIG, corpus=str(corpus))
    store = report.open_store(local_runner.sqlite_connection(str(output / "metadata.sqlite")))
    learned = _tokenizer(store)
    assert first["blessed"] and first["span"] == 1
    assert "reused_from_artifact_id" not in learned.custom_properties

    (corpus / "span-2").mkdir()
    (corpus / "span-2" / "part.txt").write_bytes(text[80_000:160_000])
    second = local_runner.run(output=str(output), config=CONFIG, corpus=str(corpus))
    reused = _tokenizer(store)
    assert second["span"] == 2 and reused.id != learned.id
    assert report.prop(reused, "reused_from_artifact_id") == learned.id
    assert report.prop(reused, "span") == 2
    span_1_model = report.node_executions(store, PIPELINE_NAME, "Trainer")[0]
    span_1_model = report.execution_artifacts(store, span_1_model.id)["model"][0]
    assert first["warm_start"] == "no base model"
    assert second["warm_start"] == f"warm-started from {span_1_model.uri}/Format-Serving"

    executions = len(_tokenizer_gen_states(store))
    local_runner.run(output=str(output), config=CONFIG, corpus=str(corpus))  # nothing new: all cached
    assert len(_tokenizer_gen_states(store)) == executions + 1
    assert _tokenizer_gen_states(store)[-1] == metadata_store_pb2.Execution.CACHED
    trainer_states = [e.last_known_state for e in report.node_executions(store, PIPELINE_NAME, "Trainer")]
    assert trainer_states[-1] == metadata_store_pb2.Execution.CACHED  # no retraining on its own output

    # A new tokenizer and a worse (one-step) model: perplexities over different vocabularies are not
    # comparable, so the gate compares bits per byte with the blessed model, and refuses it.
    served = sorted(os.listdir(output / "serving_model" / "deepseek"))
    retrained = local_runner.run(output=str(output), config=CONFIG.replace(retrain_tokenizer=True, train_steps=1),
                                 corpus=str(corpus))
    relearned = _tokenizer(store)
    assert relearned.id not in (learned.id, reused.id)
    assert "reused_from_artifact_id" not in relearned.custom_properties
    evaluation = report.latest_outputs(store, PIPELINE_NAME, "Evaluator")["evaluation"][0]
    assert report.prop(evaluation, "compared_by") == "BitsPerByte"
    assert retrained["warm_start"] == "not warm-started: the base model was trained with a different tokenizer"
    assert retrained["eval_bits_per_byte"] < CONFIG.max_bits_per_byte and retrained["blessed"] is False
    failed = {(f.metric_key.name, f.metric_threshold.HasField("change_threshold"))
              for s in tfma.load_validation_result(evaluation.uri).metric_validations_per_slice for f in s.failures}
    assert failed == {("bits_per_byte", True)}
    assert sorted(os.listdir(output / "serving_model" / "deepseek")) == served
