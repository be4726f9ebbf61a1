"""``create_pipeline``: the DAG, as a pure function of its arguments.

corpus -> TextExampleGen -> StatisticsGen -> SchemaGen -> ExampleValidator
       -> TokenizerGen (learn subwords) -> Transform (tokenize) -> DataChecks
       -> Trainer -> Evaluator (gate vs. latest blessed) -> Pusher

Once the schema is frozen (``frozen_schema_dir``), ExampleValidator checks each
new span against it (ImportSchemaGen) and a second ImportSchemaGen gives
DataChecks the frozen text ranges.
The Trainer runs after DataChecks, which fails on bad data, so a bad span stops
the run before training. It is an upstream dependency, not an input: when only
the checks run again (the first run after the schema is frozen), the Trainer
stays cached.

With ``last_spans`` > 1, TokenizerGen, Transform (so the Trainer) and the
Evaluator take the Examples of the last N spans (components.span_window)
instead of the newest span alone; the data checks stay on the newest span.

Runners set paths, metadata and the orchestrator, then call this; nothing here
reads the environment or invents paths.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow_model_analysis as tfma
from ml_metadata.proto import metadata_store_pb2
from tfx import v1 as tfx
from tfx.dsl.input_resolution.strategies.latest_blessed_model_strategy import LatestBlessedModelStrategy
from tfx.proto import range_config_pb2

from deepseek_tfx.components.mlmd import (
    BEST_HYPERPARAMETERS_KEY,
    BLESSING_KEY,
    PUSHED_MODEL_KEY,
    CANDIDATE_KEY,
    EXAMPLES_KEY,
    ANOMALIES_KEY,
    MODEL_BLESSING_KEY,
    MODEL_KEY,
    POST_TRANSFORM_STATS_KEY,
    SCHEMA_KEY,
    STATISTICS_KEY,
    TOKENIZER_KEY,
    TRANSFORM_GRAPH_KEY,
    TRANSFORMED_EXAMPLES_KEY,
)
from deepseek_tfx.components import data_checks as checks_lib
from deepseek_tfx.components.model_gate import AtomicPusher, TokenizerAwareEvaluator
from deepseek_tfx.components.span_window import LastSpansStrategy
from deepseek_tfx.components.baseline_resolver import (
    BlessedDataStatisticsStrategy,
    FirstBlessedExamplesStrategy,
    BlessedModelTokenizerStrategy,
    LatestBlessedBaselineStrategy,
    WarmStartModelStrategy,
)
from deepseek_tfx.components.text_example_gen import TextExampleGen
from deepseek_tfx.components.tflite_exporter import TFLiteExporter
from deepseek_tfx.components.tokenizer_consumers import (
    TokenizingTrainer,
    TokenizingTransform,
    TokenizingTuner,
    VertexTokenizingTrainer,
)
from deepseek_tfx.components.tokenizer_gen import Tokenizer, TokenizerGen
from deepseek_tfx.serving import tf_serving
from deepseek_tfx.pipeline.config import (
    DATA_CHECKS,
    EVALUATOR,
    EXAMPLE_GEN,
    INFRA_VALIDATOR,
    PUSHER,
    TFLITE_EXPORTER,
    TRAINER,
    TRANSFORM,
    TUNER,
    ConfigError,
    PipelineConfig,
)

PREPROCESSING_FN = "deepseek_tfx.trainer_module.preprocessing.preprocessing_fn"
STATS_OPTIONS_UPDATER_FN = "deepseek_tfx.trainer_module.preprocessing.stats_options_updater_fn"
SCHEMA_FILE = "schema.pbtxt"  # the frozen schema of the raw examples, in frozen_schema_dir
TEXT_SCHEMA_FILE = "text_schema.pbtxt"  # the frozen text ranges (components.data_checks.text_constraints)
RUN_FN = "deepseek_tfx.trainer_module.trainer.run_fn"
TUNER_FN = "deepseek_tfx.trainer_module.tuning.tuner_fn"
METRICS_MODULE = "deepseek_tfx.trainer_module.metrics"


def eval_config(config: PipelineConfig) -> tfma.EvalConfig:
    """Perplexity and bits per byte on the eval split, with the blessing thresholds.

    Both metrics carry a change threshold against the baseline (lower is better);
    the Evaluator keeps the perplexity one when candidate and baseline share a
    tokenizer and the bits-per-byte one when they do not (components.model_gate).
    """
    lower = tfma.MetricDirection.LOWER_IS_BETTER

    def threshold(tolerance: float, upper_bound: float | None) -> tfma.MetricThreshold:
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


def _example_gen(corpus_base: str, corpus_pattern: str, config: PipelineConfig, span: int | None = None):
    """The pipeline's ExampleGen: the latest span, or exactly ``span``."""
    range_config = None
    if span is not None:
        range_config = range_config_pb2.RangeConfig(static_range=range_config_pb2.StaticRange(
            start_span_number=span, end_span_number=span))
    return TextExampleGen(input_base=corpus_base, input_pattern=corpus_pattern, eval_fraction=config.eval_fraction,
                          max_document_chars=config.max_document_chars, text_field=config.text_field,
                          max_line_bytes=config.max_line_bytes,
                          # a window's spans are tokenized and evaluated together: one may have an empty split
                          require_every_split=config.last_spans == 1,
                          range_config=range_config).with_id(EXAMPLE_GEN)


def _data_checks(example_gen, frozen_schema_dir: str | None = None) -> list:
    """StatisticsGen, SchemaGen and ExampleValidator (TFDV); with a frozen schema, ExampleValidator checks the data
    against it (ImportSchemaGen) instead of against the schema SchemaGen infers from the same data.

    Transform and the Trainer keep parsing with SchemaGen's schema (for a text corpus both describe the one
    ``text`` feature): their inputs then stay the same across the freeze, so a rerun on unchanged data right after
    the first push is still fully cached instead of training again.
    """
    statistics_gen = tfx.components.StatisticsGen(examples=example_gen.outputs[EXAMPLES_KEY])
    schema_gen = tfx.components.SchemaGen(statistics=statistics_gen.outputs[STATISTICS_KEY], infer_feature_shape=True)
    frozen = (tfx.components.ImportSchemaGen(schema_file=f"{frozen_schema_dir.rstrip('/')}/{SCHEMA_FILE}")
              .with_id("ImportSchemaGen") if frozen_schema_dir else None)
    example_validator = tfx.components.ExampleValidator(
        statistics=statistics_gen.outputs[STATISTICS_KEY], schema=(frozen or schema_gen).outputs[SCHEMA_KEY])
    return [statistics_gen, schema_gen, *([frozen] if frozen else []), example_validator]


class _Resolvers:
    """Builds the pipeline's resolver nodes; the one place that knows which strategies compile where.

    Locally (``portable=False``), the MLMD-aware strategies of components.baseline_resolver keep reruns fully
    cached and reuse the blessed model's tokenizer. For Kubeflow Pipelines V2 / Vertex AI (``portable=True``)
    only TFX's LatestBlessedModelStrategy compiles: the baseline and the warm-start model are the latest
    blessed model, TokenizerGen learns its tokenizer every run, and there is no span window.
    """

    def __init__(self, portable: bool):
        self.portable = portable

    @staticmethod
    def _blessed_models() -> dict:
        return {MODEL_KEY: tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
                MODEL_BLESSING_KEY: tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing)}

    def span_window(self, example_gen, num_spans: int) -> tfx.dsl.Resolver | None:
        """The Examples of the last ``num_spans`` spans (None for one span)."""
        if num_spans <= 1:
            return None
        if self.portable:
            raise ConfigError("PipelineConfig.last_spans must be 1 for Kubeflow Pipelines / Vertex AI: the "
                              f"span-window resolver does not compile there (got {num_spans})")
        window = tfx.dsl.Resolver(
            strategy_class=LastSpansStrategy,
            config={"num_spans": num_spans},
            examples=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Examples,
                                     producer_component_id=example_gen.id, output_key=EXAMPLES_KEY),
        ).with_id("span_window_resolver")
        window.add_upstream_node(example_gen)  # the window ends at the span this run read
        return window

    def blessed_model_tokenizer(self, examples) -> tfx.dsl.Resolver | None:
        """The latest blessed model's tokenizer, for TokenizerGen to carry over (None where not portable)."""
        if self.portable:
            return None
        return tfx.dsl.Resolver(
            strategy_class=BlessedModelTokenizerStrategy,
            **self._blessed_models(),
            tokenizer=tfx.dsl.Channel(type=Tokenizer),
            examples=examples,
        ).with_id("blessed_model_tokenizer_resolver")

    def warm_start_model(self, transformed_examples) -> tfx.dsl.Resolver:
        """The Trainer's base model: the latest blessed model (its own base model on a rerun, locally)."""
        return tfx.dsl.Resolver(
            strategy_class=LatestBlessedModelStrategy if self.portable else WarmStartModelStrategy,
            **self._blessed_models(),
            **({} if self.portable else {EXAMPLES_KEY: transformed_examples}),
        ).with_id("warm_start_model_resolver")

    def blessed_data_statistics(self, transformed_examples) -> tfx.dsl.Resolver | None:
        """The post-transform statistics of the latest blessed model's data (None where not portable: the data
        checks then compare no drift)."""
        if self.portable:
            return None
        return tfx.dsl.Resolver(
            strategy_class=BlessedDataStatisticsStrategy,
            **self._blessed_models(),
            baseline_statistics=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ExampleStatistics,
                                                producer_component_id=TRANSFORM,
                                                output_key=POST_TRANSFORM_STATS_KEY),
            examples=transformed_examples,
        ).with_id("blessed_data_statistics_resolver")

    def reference_examples(self, example_gen, candidate) -> tfx.dsl.Resolver | None:
        """The Examples the first blessed model was trained on: the Evaluator's reference eval set (None where
        portable)."""
        if self.portable:
            return None
        return tfx.dsl.Resolver(
            strategy_class=FirstBlessedExamplesStrategy,
            **self._blessed_models(),
            **{CANDIDATE_KEY: candidate},
            examples=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Examples,
                                     producer_component_id=example_gen.id, output_key=EXAMPLES_KEY),
        ).with_id("reference_examples_resolver")

    def baseline_model(self, candidate) -> tfx.dsl.Resolver:
        """The Evaluator's baseline: the latest blessed model (other than the candidate, locally)."""
        return tfx.dsl.Resolver(
            strategy_class=LatestBlessedModelStrategy if self.portable else LatestBlessedBaselineStrategy,
            **self._blessed_models(),
            **({} if self.portable else {CANDIDATE_KEY: candidate}),
        ).with_id("latest_blessed_model_resolver")


def infra_validator(model, examples, model_name: str) -> tfx.components.InfraValidator:
    """TFX's InfraValidator, LOAD_AND_QUERY in a local ``tensorflow/serving`` container (Docker).

    Loading replays the export's warmup requests (``generate`` and ``score`` on its own example prompts,
    trainer_module.export.WARMUP_FILE), so a model whose generate fails never loads; the query step sends
    ``serving_default`` requests that TFX builds from two eval examples of this run's data (TFX's request
    builder only builds requests for signatures that take serialized examples). Its examples are the
    newest span's, one Examples artifact.
    """
    return tfx.components.InfraValidator(
        model=model,
        examples=examples,
        serving_spec=tfx.proto.ServingSpec(
            tensorflow_serving=tfx.proto.TensorFlowServing(tags=[tf_serving.SERVING_VERSION]),
            local_docker=tfx.proto.LocalDockerConfig(),
            model_name=model_name),
        validation_spec=tfx.proto.ValidationSpec(max_loading_time_seconds=300, num_tries=2),
        request_spec=tfx.proto.RequestSpec(
            tensorflow_serving=tfx.proto.TensorFlowServingRequestSpec(signature_names=["serving_default"]),
            split_name="eval", num_examples=2),
    ).with_id(INFRA_VALIDATOR)


def create_ingest_pipeline(
    *,
    pipeline_name: str,
    pipeline_root: str,
    corpus_base: str,
    corpus_pattern: str,
    span: int,
    config: PipelineConfig,
    metadata_connection_config: metadata_store_pb2.ConnectionConfig | None = None,
    beam_pipeline_args: Sequence[str] = (),
    frozen_schema_dir: str | None = None,
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
        components=[example_gen, *_data_checks(example_gen, frozen_schema_dir)],
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
    metadata_connection_config: metadata_store_pb2.ConnectionConfig | None = None,
    beam_pipeline_args: Sequence[str] = (),
    enable_cache: bool = True,
    portable_resolvers: bool = False,
    vertex_training: dict | None = None,
    infra_validation: bool = False,
    runtime: dict | None = None,
    frozen_schema_dir: str | None = None,
    eval_corpus: tuple[str, str] | None = None,
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
        runtime: values (or TFX RuntimeParameters) that replace the config's at run time: ``train_steps``
            (the Trainer's), ``max_bits_per_byte`` and ``max_perplexity`` (the gate's absolute bounds; 0 keeps
            the config's). ``corpus_base`` may be a RuntimeParameter too.
        frozen_schema_dir: the pipeline's frozen schema (``schema.pbtxt`` of the raw examples and
            ``text_schema.pbtxt`` of the text ranges; pipeline.schema freezes them); None: SchemaGen infers the
            schema from each run's data and DataChecks has no ranges yet.
        eval_corpus: (base, pattern) of a fixed reference eval corpus, read whole by a second TextExampleGen
            (``ReferenceExampleGen``, one ``eval`` split); None: the reference eval set is the eval split of the
            first blessed run's data (reference_examples_resolver, local only). Either way the Evaluator slices
            by source (components.model_gate.with_reference_slice) when ``config.reference_bpb_tolerance`` is set.
        infra_validation: add TFX's InfraValidator (see infra_validator) before the Pusher, which then
            pushes only a model that loaded and answered in TF Serving. Needs a Docker engine where the
            component runs (local runs decide with local_runner.docker_reachable).
    """
    resolvers = _Resolvers(portable_resolvers)
    runtime = runtime or {}
    example_gen = _example_gen(corpus_base, corpus_pattern, config)
    checks = _data_checks(example_gen, frozen_schema_dir)
    reference_gen = None
    if eval_corpus is not None and config.reference_bpb_tolerance is not None:
        reference_gen = TextExampleGen(
            input_base=eval_corpus[0], input_pattern=eval_corpus[1], max_document_chars=config.max_document_chars,
            text_field=config.text_field, max_line_bytes=config.max_line_bytes, single_split="eval",
        ).with_id("ReferenceExampleGen")
    schema_gen, example_validator = checks[1], checks[-1]
    # The newest span is validated above; the tokenizer, training and evaluation see the window.
    span_window = resolvers.span_window(example_gen, config.last_spans)
    examples = span_window.outputs[EXAMPLES_KEY] if span_window else example_gen.outputs[EXAMPLES_KEY]
    # Reuse the blessed model's tokenizer, so warm starts stay valid.
    tokenizer_resolver = None if config.retrain_tokenizer else resolvers.blessed_model_tokenizer(examples)
    tokenizer_gen = TokenizerGen(
        examples=examples, config=config.tokenizer,
        base_tokenizer=tokenizer_resolver.outputs[TOKENIZER_KEY] if tokenizer_resolver else None)
    transform = TokenizingTransform(
        examples=examples,
        schema=schema_gen.outputs[SCHEMA_KEY],
        tokenizer=tokenizer_gen.outputs[TOKENIZER_KEY],
        preprocessing_fn=PREPROCESSING_FN,
        stats_options_updater_fn=STATS_OPTIONS_UPDATER_FN,
    ).with_id(TRANSFORM)
    transformed = transform.outputs[TRANSFORMED_EXAMPLES_KEY]
    post_stats = transform.outputs[POST_TRANSFORM_STATS_KEY]
    text_schema = (tfx.components.ImportSchemaGen(
        schema_file=f"{frozen_schema_dir.rstrip('/')}/{TEXT_SCHEMA_FILE}").with_id("ImportTextSchemaGen")
        if frozen_schema_dir else None)
    statistics_resolver = (resolvers.blessed_data_statistics(transformed)
                           if config.data_checks.max_token_drift is not None else None)
    data_checks = checks_lib.DataChecks(
        statistics=post_stats,
        checks={"max_replacement_share": config.data_checks.max_replacement_share,
                "max_token_drift": config.data_checks.max_token_drift},
        text_schema=text_schema.outputs[SCHEMA_KEY] if text_schema else None,
        baseline_statistics=(statistics_resolver.outputs[checks_lib.BASELINE_STATISTICS_KEY]
                             if statistics_resolver else None),
        raw_anomalies=example_validator.outputs[ANOMALIES_KEY],
    ).with_id(DATA_CHECKS)
    warm_start_resolver = resolvers.warm_start_model(transformed) if config.warm_start else None
    tuner = None
    if config.tune.enabled:  # TFX's Tuner: a KerasTuner search whose trials run the Trainer's loop
        tuner = TokenizingTuner(
            examples=transformed, transform_graph=transform.outputs[TRANSFORM_GRAPH_KEY],
            schema=schema_gen.outputs[SCHEMA_KEY], tokenizer=tokenizer_gen.outputs[TOKENIZER_KEY],
            tuner_fn=TUNER_FN, train_args=tfx.proto.TrainArgs(num_steps=config.tune.steps_per_trial),
            eval_args=tfx.proto.EvalArgs(num_steps=config.resolved_eval_batches),
            custom_config={**config.trainer_custom_config(), "tune": config.tune.to_dict()},
        ).with_id(TUNER)
        tuner.add_upstream_node(data_checks)
    trainer = (VertexTokenizingTrainer if vertex_training else TokenizingTrainer)(
        run_fn=RUN_FN,
        base_model=warm_start_resolver.outputs[MODEL_KEY] if warm_start_resolver else None,
        examples=transformed,
        transform_graph=transform.outputs[TRANSFORM_GRAPH_KEY],
        schema=schema_gen.outputs[SCHEMA_KEY],
        tokenizer=tokenizer_gen.outputs[TOKENIZER_KEY],
        train_args=tfx.proto.TrainArgs(num_steps=config.resolved_train_steps),
        eval_args=tfx.proto.EvalArgs(num_steps=config.resolved_eval_batches),
        custom_config={**config.trainer_custom_config(), **(vertex_training or {})},
        train_steps=runtime.get("train_steps"),
        hyperparameters=tuner.outputs[BEST_HYPERPARAMETERS_KEY] if tuner else None,
    ).with_id(TRAINER)
    trainer.add_upstream_node(data_checks)  # it fails on bad data; an ordering, not an input (module docstring)
    model_resolver = resolvers.baseline_model(trainer.outputs[MODEL_KEY])
    reference_resolver = (resolvers.reference_examples(example_gen, trainer.outputs[MODEL_KEY])
                          if config.reference_bpb_tolerance is not None and reference_gen is None else None)
    reference_node = reference_gen or reference_resolver
    reference = reference_node.outputs[EXAMPLES_KEY] if reference_node else None
    evaluator = TokenizerAwareEvaluator(
        examples=examples,
        model=trainer.outputs[MODEL_KEY],
        baseline_model=model_resolver.outputs[MODEL_KEY],
        eval_config=eval_config(config),
        example_splits=["eval"],
        max_bits_per_byte=runtime.get("max_bits_per_byte"),
        max_perplexity=runtime.get("max_perplexity"),
        reference_examples=reference,
        reference_bpb_tolerance=config.reference_bpb_tolerance if reference else None,
    ).with_id(EVALUATOR)
    infra = (infra_validator(trainer.outputs[MODEL_KEY], example_gen.outputs[EXAMPLES_KEY], config.model_name)
             if infra_validation else None)
    pusher = AtomicPusher(
        model=trainer.outputs[MODEL_KEY],
        model_blessing=evaluator.outputs[BLESSING_KEY],
        infra_blessing=infra.outputs[BLESSING_KEY] if infra else None,
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(base_directory=serving_model_dir)),
    ).with_id(PUSHER)
    tflite = (TFLiteExporter(pushed_model=pusher.outputs[PUSHED_MODEL_KEY],
                             quantize="none" if config.export_tflite == "float32" else config.export_tflite
                             ).with_id(TFLITE_EXPORTER) if config.export_tflite else None)
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name,
        pipeline_root=pipeline_root,
        components=[example_gen, *checks,
                    *([span_window] if span_window else []),
                    *([tokenizer_resolver] if tokenizer_resolver else []), tokenizer_gen, transform,
                    *([text_schema] if text_schema else []), *([statistics_resolver] if statistics_resolver else []),
                    data_checks, *([warm_start_resolver] if warm_start_resolver else []),
                    *([tuner] if tuner else []), trainer,
                    model_resolver, *([reference_resolver] if reference_resolver else []),
                    *([reference_gen] if reference_gen else []), evaluator,
                    *([infra] if infra else []), pusher, *([tflite] if tflite else [])],
        enable_cache=enable_cache,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=list(beam_pipeline_args),
    )
