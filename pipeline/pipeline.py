"""``create_pipeline``: the DAG, as a pure function of its arguments.

corpus -> TextExampleGen -> StatisticsGen -> SchemaGen -> ExampleValidator
       -> TokenizerGen (learn subwords) -> Transform (tokenize) -> Trainer
       -> Evaluator (gate vs. latest blessed) -> Pusher

With ``last_spans`` > 1, TokenizerGen, Transform (so the Trainer) and the
Evaluator take the Examples of the last N spans (components.span_window)
instead of the newest span alone; the data checks stay on the newest span.

Runners set paths, metadata and the orchestrator, then call this; nothing here
reads the environment or invents paths.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow_model_analysis as tfma
from ml_metadata.proto import metadata_store_pb2
from tfx import v1 as tfx
from tfx.dsl.input_resolution.strategies.latest_blessed_model_strategy import LatestBlessedModelStrategy
from tfx.proto import range_config_pb2

from components.model_gate import AtomicPusher, TokenizerAwareEvaluator
from components.span_window import LastSpansStrategy
from components.baseline_resolver import (
    BlessedModelTokenizerStrategy,
    LatestBlessedBaselineStrategy,
    WarmStartModelStrategy,
)
from components.text_example_gen import TextExampleGen
from components.tokenizer_consumers import TokenizingTrainer, TokenizingTransform, VertexTokenizingTrainer
from components.tokenizer_gen import Tokenizer, TokenizerGen
from pipeline.config import ConfigError, PipelineConfig

PREPROCESSING_FN = "trainer_module.preprocessing.preprocessing_fn"
RUN_FN = "trainer_module.trainer.run_fn"
METRICS_MODULE = "trainer_module.metrics"


def eval_config(config: PipelineConfig) -> tfma.EvalConfig:
    """Perplexity and bits per byte on the eval split, with the blessing thresholds.

    Both metrics carry a change threshold against the baseline (lower is better);
    the Evaluator keeps the perplexity one when candidate and baseline share a
    tokenizer and the bits-per-byte one when they do not (components.model_gate).
    """
    lower = tfma.MetricDirection.LOWER_IS_BETTER

    def threshold(tolerance: float, upper_bound: Optional[float]) -> tfma.MetricThreshold:
        t = tfma.MetricThreshold(change_threshold=tfma.GenericChangeThreshold(
            direction=lower, absolute={"value": tolerance}))
        if upper_bound is not None:
            t.value_threshold.CopyFrom(tfma.GenericValueThreshold(upper_bound={"value": upper_bound}))
        return t

    return tfma.EvalConfig(
        model_specs=[tfma.ModelSpec(signature_name="serving_default", preprocessing_function_names=[])],
        slicing_specs=[tfma.SlicingSpec()],
        metrics_specs=[tfma.MetricsSpec(metrics=[
            tfma.MetricConfig(class_name="ExampleCount"),
            tfma.MetricConfig(class_name="Perplexity", module=METRICS_MODULE,
                              threshold=threshold(config.regression_tolerance, config.max_perplexity)),
            tfma.MetricConfig(class_name="BitsPerByte", module=METRICS_MODULE,
                              threshold=threshold(config.bpb_regression_tolerance, config.max_bits_per_byte)),
        ])],
    )


def _example_gen(corpus_base: str, corpus_pattern: str, config: PipelineConfig, span: Optional[int] = None):
    """The pipeline's ExampleGen: the latest span, or exactly ``span``."""
    range_config = None
    if span is not None:
        range_config = range_config_pb2.RangeConfig(static_range=range_config_pb2.StaticRange(
            start_span_number=span, end_span_number=span))
    return TextExampleGen(input_base=corpus_base, input_pattern=corpus_pattern, eval_fraction=config.eval_fraction,
                          max_document_chars=config.max_document_chars, text_field=config.text_field,
                          range_config=range_config)


def _data_checks(example_gen):
    """StatisticsGen, SchemaGen and ExampleValidator (TFDV) over an ExampleGen's output."""
    statistics_gen = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
    schema_gen = tfx.components.SchemaGen(statistics=statistics_gen.outputs["statistics"],
                                          infer_feature_shape=True)
    example_validator = tfx.components.ExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"])
    return statistics_gen, schema_gen, example_validator


def create_ingest_pipeline(
    *,
    pipeline_name: str,
    pipeline_root: str,
    corpus_base: str,
    corpus_pattern: str,
    span: int,
    config: PipelineConfig,
    metadata_connection_config: Optional[metadata_store_pb2.ConnectionConfig] = None,
    beam_pipeline_args: Sequence[str] = (),
) -> tfx.dsl.Pipeline:
    """ExampleGen reading one given span, and the data checks, under the same pipeline and node names as
    create_pipeline.

    Its Examples are outputs of the same ExampleGen node, so the span-window
    resolver of a later create_pipeline run finds them (used to backfill the
    window of ``last_spans`` with spans that no run has read); the span gets the
    same statistics and validation as a span read by a whole run.
    """
    example_gen = _example_gen(corpus_base, corpus_pattern, config, span=span)
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name,
        pipeline_root=pipeline_root,
        components=[example_gen, *_data_checks(example_gen)],
        enable_cache=True,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=list(beam_pipeline_args),
    )


def create_pipeline(
    *,
    pipeline_name: str,
    pipeline_root: str,
    corpus_base: str,
    corpus_pattern: str,
    serving_model_dir: str,
    config: PipelineConfig,
    metadata_connection_config: Optional[metadata_store_pb2.ConnectionConfig] = None,
    beam_pipeline_args: Sequence[str] = (),
    enable_cache: bool = True,
    portable_resolvers: bool = False,
    vertex_training: Optional[dict] = None,
) -> tfx.dsl.Pipeline:
    """Wires the components of the text-to-served-model pipeline.

    Args:
        pipeline_name: name of the pipeline (its MLMD context).
        pipeline_root: where component outputs are written.
        corpus_base: directory the corpus pattern is relative to.
        corpus_pattern: glob under ``corpus_base``; may contain ``{SPAN}``.
        serving_model_dir: Pusher's base directory; versions go to
            ``serving_model_dir/<numeric version>/``.
        config: data, model and gate settings.
        metadata_connection_config: MLMD connection (None: the orchestrator's default).
        beam_pipeline_args: options for every Beam-based component.
        enable_cache: reuse outputs of executions with identical inputs.
        portable_resolvers: use only resolver strategies that compile for Kubeflow
            Pipelines V2 / Vertex AI (TFX's LatestBlessedModelStrategy): the baseline
            and the warm-start model are the latest blessed model, and TokenizerGen
            learns its tokenizer every run (deterministically: unchanged data gives
            the same tokenizer, so warm starts still apply). Locally the MLMD-aware
            strategies of components.baseline_resolver keep reruns fully cached.
        vertex_training: run the Trainer as a Vertex AI custom job
            (components.tokenizer_consumers.vertex_training_config) instead of in
            the pipeline step; None trains in the step.
    """
    example_gen = _example_gen(corpus_base, corpus_pattern, config)
    statistics_gen, schema_gen, example_validator = _data_checks(example_gen)
    # The newest span is validated above; the tokenizer, training and evaluation see the window.
    span_window = None
    examples = example_gen.outputs["examples"]
    if config.last_spans > 1:
        if portable_resolvers:
            raise ConfigError("PipelineConfig.last_spans must be 1 for Kubeflow Pipelines / Vertex AI: the "
                              f"span-window resolver does not compile there (got {config.last_spans})")
        span_window = tfx.dsl.Resolver(
            strategy_class=LastSpansStrategy,
            config={"num_spans": config.last_spans},
            examples=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Examples,
                                     producer_component_id=example_gen.id, output_key="examples"),
        ).with_id("span_window_resolver")
        span_window.add_upstream_node(example_gen)  # the window ends at the span this run read
        examples = span_window.outputs["examples"]
    tokenizer_resolver = None
    if not config.retrain_tokenizer and not portable_resolvers:  # reuse the blessed model's tokenizer, so warm starts stay valid
        tokenizer_resolver = tfx.dsl.Resolver(
            strategy_class=BlessedModelTokenizerStrategy,
            model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
            model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
            tokenizer=tfx.dsl.Channel(type=Tokenizer),
            examples=examples,
        ).with_id("blessed_model_tokenizer_resolver")
    tokenizer_gen = TokenizerGen(
        examples=examples, config=config.tokenizer,
        base_tokenizer=tokenizer_resolver.outputs["tokenizer"] if tokenizer_resolver else None)
    transform = TokenizingTransform(
        examples=examples,
        schema=schema_gen.outputs["schema"],
        tokenizer=tokenizer_gen.outputs["tokenizer"],
        preprocessing_fn=PREPROCESSING_FN,
    ).with_id("Transform")
    warm_start_resolver = None
    if config.warm_start:
        inputs = {} if portable_resolvers else {"examples": transform.outputs["transformed_examples"]}
        warm_start_resolver = tfx.dsl.Resolver(
            strategy_class=LatestBlessedModelStrategy if portable_resolvers else WarmStartModelStrategy,
            model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
            model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
            **inputs,
        ).with_id("warm_start_model_resolver")
    trainer = (VertexTokenizingTrainer if vertex_training else TokenizingTrainer)(
        run_fn=RUN_FN,
        base_model=warm_start_resolver.outputs["model"] if warm_start_resolver else None,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        schema=schema_gen.outputs["schema"],
        tokenizer=tokenizer_gen.outputs["tokenizer"],
        train_args=tfx.proto.TrainArgs(num_steps=config.resolved_train_steps),
        eval_args=tfx.proto.EvalArgs(num_steps=0),
        custom_config={**config.trainer_custom_config(), **(vertex_training or {})},
    ).with_id("Trainer")
    model_resolver = tfx.dsl.Resolver(
        strategy_class=LatestBlessedModelStrategy if portable_resolvers else LatestBlessedBaselineStrategy,
        model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
        model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
        **({} if portable_resolvers else {"candidate": trainer.outputs["model"]}),
    ).with_id("latest_blessed_model_resolver")
    evaluator = TokenizerAwareEvaluator(
        examples=examples,
        model=trainer.outputs["model"],
        baseline_model=model_resolver.outputs["model"],
        eval_config=eval_config(config),
        example_splits=["eval"],
    ).with_id("Evaluator")
    pusher = AtomicPusher(
        model=trainer.outputs["model"],
        model_blessing=evaluator.outputs["blessing"],
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(base_directory=serving_model_dir)),
        keep_versions=config.keep_versions,
    ).with_id("Pusher")
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name,
        pipeline_root=pipeline_root,
        components=[example_gen, statistics_gen, schema_gen, example_validator,
                    *([span_window] if span_window else []),
                    *([tokenizer_resolver] if tokenizer_resolver else []), tokenizer_gen, transform,
                    *([warm_start_resolver] if warm_start_resolver else []), trainer,
                    model_resolver, evaluator, pusher],
        enable_cache=enable_cache,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=list(beam_pipeline_args),
    )
