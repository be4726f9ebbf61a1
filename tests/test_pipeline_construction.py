"""The DAG's components and wiring, without running it."""

import json

import pytest
from tfx.dsl.compiler import compiler
from tfx.types import standard_artifacts

from deepseek_tfx.pipeline.config import ConfigError, PipelineConfig
from deepseek_tfx.trainer_module.config import get_preset
from deepseek_tfx.pipeline.pipeline import create_pipeline


def build(tmp_path, frozen_schema_dir=None, eval_corpus=None, **config):
    return create_pipeline(
        pipeline_name="p", pipeline_root=str(tmp_path / "root"), corpus_base="/data",
        corpus_pattern="span-{SPAN}/*", serving_model_dir=str(tmp_path / "serving"),
        config=PipelineConfig(preset="tiny", **config), beam_pipeline_args=["--direct_num_workers=2"],
        frozen_schema_dir=frozen_schema_dir, eval_corpus=eval_corpus)


def test_components_and_wiring(tmp_path):
    pipeline = build(tmp_path, train_steps=5, max_perplexity=50.0)
    nodes = {c.id: c for c in pipeline.components}
    assert set(nodes) == {"TextExampleGen", "StatisticsGen", "SchemaGen", "ExampleValidator",
                          "blessed_model_tokenizer_resolver", "TokenizerGen", "Transform",
                          "blessed_data_statistics_resolver", "DataChecks", "Trainer",
                          "warm_start_model_resolver", "latest_blessed_model_resolver", "reference_examples_resolver",
                          "Evaluator", "Pusher"}
    examples = nodes["TextExampleGen"].outputs["examples"]
    assert nodes["StatisticsGen"].inputs["examples"] is examples
    assert nodes["Transform"].inputs["examples"] is examples
    assert nodes["TokenizerGen"].inputs["examples"] is examples
    tokenizer = nodes["TokenizerGen"].outputs["tokenizer"]
    assert nodes["Transform"].inputs["tokenizer"] is tokenizer
    assert nodes["Trainer"].inputs["tokenizer"] is tokenizer
    assert nodes["TokenizerGen"].inputs["base_tokenizer"] is \
        nodes["blessed_model_tokenizer_resolver"].outputs["tokenizer"]
    assert nodes["Trainer"].inputs["examples"] is nodes["Transform"].outputs["transformed_examples"]
    assert nodes["Trainer"].inputs["transform_graph"] is nodes["Transform"].outputs["transform_graph"]
    assert nodes["Evaluator"].inputs["examples"] is examples
    assert nodes["Evaluator"].inputs["model"] is nodes["Trainer"].outputs["model"]
    assert nodes["Pusher"].inputs["model_blessing"] is nodes["Evaluator"].outputs["blessing"]
    assert nodes["Pusher"].inputs["model"] is nodes["Trainer"].outputs["model"]
    assert nodes["Evaluator"].inputs["baseline_model"].type is standard_artifacts.Model
    assert nodes["Trainer"].inputs["base_model"] is nodes["warm_start_model_resolver"].outputs["model"]
    transformed = nodes["Transform"].outputs["transformed_examples"]
    assert nodes["warm_start_model_resolver"].raw_inputs["examples"] is transformed
    post_stats = nodes["Transform"].outputs["post_transform_stats"]
    assert nodes["DataChecks"].inputs["statistics"] is post_stats
    assert nodes["DataChecks"].inputs["raw_anomalies"] is nodes["ExampleValidator"].outputs["anomalies"]
    assert nodes["DataChecks"].inputs["baseline_statistics"] is \
        nodes["blessed_data_statistics_resolver"].outputs["baseline_statistics"]
    assert "text_schema" not in nodes["DataChecks"].inputs  # nothing frozen yet
    assert nodes["Evaluator"].inputs["reference_examples"] is nodes["reference_examples_resolver"].outputs["examples"]
    assert nodes["Evaluator"].exec_properties["reference_bpb_tolerance"] == 0.05
    # the Trainer runs after the data checks (which fail on bad data), without taking their output as an input
    assert nodes["DataChecks"] in nodes["Trainer"].upstream_nodes
    assert nodes["DataChecks"].outputs["anomalies"] not in nodes["Trainer"].inputs.values()
    assert pipeline.enable_cache
    assert pipeline.beam_pipeline_args == ["--direct_num_workers=2"]


def test_a_frozen_schema_is_imported(tmp_path):
    nodes = {c.id: c for c in build(tmp_path, frozen_schema_dir="gs://bucket/schema").components}
    assert nodes["ImportSchemaGen"].exec_properties["schema_file"] == "gs://bucket/schema/schema.pbtxt"
    assert nodes["ImportTextSchemaGen"].exec_properties["schema_file"] == "gs://bucket/schema/text_schema.pbtxt"
    assert nodes["ExampleValidator"].inputs["schema"] is nodes["ImportSchemaGen"].outputs["schema"]
    # parsing keeps SchemaGen's schema of the same data, so a rerun right after the freeze stays cached
    assert nodes["Transform"].inputs["schema"] is nodes["SchemaGen"].outputs["schema"]
    assert nodes["Trainer"].inputs["schema"] is nodes["SchemaGen"].outputs["schema"]
    assert nodes["DataChecks"].inputs["text_schema"] is nodes["ImportTextSchemaGen"].outputs["schema"]


def test_component_parameters_follow_the_config(tmp_path):
    nodes = {c.id: c for c in build(tmp_path, train_steps=5, max_perplexity=50.0).components}
    assert json.loads(nodes["Trainer"].exec_properties["train_args"])["num_steps"] == 5
    # EvalArgs carries the preset's eval batches, which run_fn honours (test_train_loop)
    assert json.loads(nodes["Trainer"].exec_properties["eval_args"])["num_steps"] == \
        get_preset("tiny").train.eval_batches > 0
    assert nodes["Trainer"].exec_properties["run_fn"] == "deepseek_tfx.trainer_module.trainer.run_fn"
    assert nodes["Transform"].exec_properties["preprocessing_fn"] == \
        "deepseek_tfx.trainer_module.preprocessing.preprocessing_fn"
    eval_config = nodes["Evaluator"].exec_properties["eval_config"]
    assert "Perplexity" in eval_config and "BitsPerByte" in eval_config and '"upper_bound"' in eval_config
    assert nodes["Evaluator"].exec_properties["example_splits"] == '["eval"]'
    assert str(tmp_path / "serving") in nodes["Pusher"].exec_properties["push_destination"]


def test_gate_thresholds_follow_the_config(tmp_path):
    nodes = {c.id: c for c in build(tmp_path, max_perplexity=50.0, max_bits_per_byte=3.0,
                                      regression_tolerance=0.5, bpb_regression_tolerance=0.01).components}
    metrics = {m["class_name"]: m.get("threshold", {})
               for m in json.loads(nodes["Evaluator"].exec_properties["eval_config"])["metrics_specs"][0]["metrics"]}
    assert metrics["Perplexity"]["value_threshold"]["upper_bound"] == 50.0
    assert metrics["Perplexity"]["change_threshold"] == {"direction": "LOWER_IS_BETTER", "absolute": 0.5}
    assert metrics["BitsPerByte"]["value_threshold"]["upper_bound"] == 3.0
    assert metrics["BitsPerByte"]["change_threshold"] == {"direction": "LOWER_IS_BETTER", "absolute": 0.01}


def test_retrain_tokenizer_drops_the_reuse(tmp_path):
    nodes = {c.id: c for c in build(tmp_path, retrain_tokenizer=True).components}
    assert "blessed_model_tokenizer_resolver" not in nodes
    assert "base_tokenizer" not in nodes["TokenizerGen"].inputs


def test_warm_start_can_be_switched_off(tmp_path):
    nodes = {c.id: c for c in build(tmp_path, warm_start=False).components}
    assert "warm_start_model_resolver" not in nodes
    assert "base_model" not in nodes["Trainer"].inputs


def test_last_spans_routes_the_window_to_tokenizer_transform_and_evaluator(tmp_path):
    pipeline = build(tmp_path, last_spans=3)
    nodes = {c.id: c for c in pipeline.components}
    window = nodes["span_window_resolver"]
    assert window.exec_properties["source_uri"] == {"num_spans": 3}  # TFX keeps the strategy config there
    assert window.raw_inputs["examples"].producer_component_id == "TextExampleGen"
    assert nodes["TextExampleGen"] in window.upstream_nodes
    for node in ("TokenizerGen", "Transform", "Evaluator"):
        assert nodes[node].inputs["examples"] is window.outputs["examples"], node
    assert nodes["blessed_model_tokenizer_resolver"].raw_inputs["examples"] is window.outputs["examples"]
    assert nodes["StatisticsGen"].inputs["examples"] is nodes["TextExampleGen"].outputs["examples"]

    ir = compiler.Compiler().compile(pipeline)  # what LocalDagRunner runs: the window waits for ExampleGen
    compiled = {n.pipeline_node.node_info.id: n.pipeline_node for n in ir.nodes}
    assert "TextExampleGen" in compiled["span_window_resolver"].upstream_nodes
    assert "span_window_resolver" in compiled["Transform"].upstream_nodes


def test_last_spans_does_not_compile_for_kubeflow(tmp_path):
    with pytest.raises(ConfigError, match=r"last_spans must be 1 for Kubeflow Pipelines / Vertex AI"):
        create_pipeline(pipeline_name="p", pipeline_root="gs://b/root", corpus_base="gs://b/corpus",
                        corpus_pattern="span-{SPAN}/*", serving_model_dir="gs://b/serving",
                        config=PipelineConfig(preset="tiny", last_spans=2), portable_resolvers=True)
    with pytest.raises(ConfigError, match=r"PipelineConfig.last_spans: must be >= 1, got 0"):
        PipelineConfig(last_spans=0)


def test_an_eval_corpus_is_the_reference_eval_set(tmp_path):
    nodes = {c.id: c for c in build(tmp_path, eval_corpus=("/reference", "*.txt")).components}
    assert "reference_examples_resolver" not in nodes
    reference = nodes["ReferenceExampleGen"]
    assert reference.exec_properties["input_base"] == "/reference"
    assert json.loads(reference.exec_properties["input_config"])["splits"] == [{"name": "eval", "pattern": "*.txt"}]
    assert "split_config" not in json.loads(reference.exec_properties["output_config"])  # one split: all of it
    assert nodes["Evaluator"].inputs["reference_examples"] is reference.outputs["examples"]
    # no tolerance, no reference check
    nodes = {c.id: c for c in build(tmp_path, eval_corpus=("/reference", "*"), reference_bpb_tolerance=None).components}
    assert "ReferenceExampleGen" not in nodes and "reference_examples" not in nodes["Evaluator"].inputs


def test_the_tflite_step_follows_the_pusher_when_asked(tmp_path):
    assert "TFLiteExporter" not in {c.id for c in build(tmp_path).components}
    nodes = {c.id: c for c in build(tmp_path, export_tflite="dynamic-int8").components}
    exporter = nodes["TFLiteExporter"]
    assert exporter.inputs["pushed_model"] is nodes["Pusher"].outputs["pushed_model"]
    assert exporter.exec_properties["quantize"] == "dynamic-int8"
    float32 = {c.id: c for c in build(tmp_path, export_tflite="float32").components}["TFLiteExporter"]
    assert float32.exec_properties["quantize"] == "none"
    with pytest.raises(ConfigError, match="export_tflite"):
        PipelineConfig(export_tflite="int4")
