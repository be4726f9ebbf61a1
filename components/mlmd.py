"""ML Metadata: every query the project makes of the store, and the artifact keys, in one place.

The resolvers (components.baseline_resolver, components.span_window), the run
summary and lineage (pipeline.report), the local runner's span backfill and the
CLI all read lineage through these functions, so they share one rule for what
counts as an execution's input or output (TFX records OUTPUT events; the
Kubeflow V2 launcher also DECLARED_OUTPUT) and one reading of each property.

Functions take MLMD protos or TFX ``types.Artifact`` objects alike (an Artifact
wraps its proto as ``mlmd_artifact``). Tests: tests/test_mlmd.py, on an
in-memory store.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2
from tfx.types import standard_component_specs as std

# Artifact keys: one constant each. The standard components' keys are TFX's own.
EXAMPLES_KEY = std.EXAMPLES_KEY  # "examples"
TRANSFORMED_EXAMPLES_KEY = std.TRANSFORMED_EXAMPLES_KEY
TRANSFORM_GRAPH_KEY = std.TRANSFORM_GRAPH_KEY
POST_TRANSFORM_STATS_KEY = std.POST_TRANSFORM_STATS_KEY
STATISTICS_KEY = std.STATISTICS_KEY
ANOMALIES_KEY = std.ANOMALIES_KEY  # ExampleValidator's output
SCHEMA_KEY = std.SCHEMA_KEY
MODEL_KEY = std.MODEL_KEY  # "model"
MODEL_RUN_KEY = std.MODEL_RUN_KEY
BASE_MODEL_KEY = std.BASE_MODEL_KEY  # "base_model"
MODEL_BLESSING_KEY = std.MODEL_BLESSING_KEY  # "model_blessing": the Pusher's and resolvers' input
BLESSING_KEY = std.BLESSING_KEY  # "blessing": the Evaluator's output
EVALUATION_KEY = std.EVALUATION_KEY
PUSHED_MODEL_KEY = std.PUSHED_MODEL_KEY
TFLITE_MODEL_KEY = "tflite_model"  # TFLiteExporter's output
TFLITE_EXPORTED_PROPERTY = "exported"  # on it: 1 when a model was converted, 0 when nothing had been pushed
TFLITE_QUANTIZE_PROPERTY = "quantize"  # on it: none, float16 or dynamic-int8
BEST_HYPERPARAMETERS_KEY = std.BEST_HYPERPARAMETERS_KEY  # the Tuner's output; the Trainer's hyperparameters
TOKENIZER_KEY = "tokenizer"  # TokenizerGen's output; Transform's and the Trainer's input
BASE_TOKENIZER_KEY = "base_tokenizer"  # TokenizerGen's optional input: a tokenizer to carry over
CANDIDATE_KEY = "candidate"  # the baseline resolver's input: the model being judged

# Property names (custom properties, except where TFX makes them properties).
SPAN_PROPERTY = "span"
VERSION_PROPERTY = "version"
PUSHED_PROPERTY = "pushed"
PUSHED_VERSION_PROPERTY = "pushed_version"
PUSHED_DESTINATION_PROPERTY = "pushed_destination"
BLESSED_PROPERTY = "blessed"

PUSHED_MODEL_TYPE = "PushedModel"
COMPLETE = metadata_store_pb2.Execution.COMPLETE
_DONE = (COMPLETE, metadata_store_pb2.Execution.CACHED)
OUTPUT_EVENTS = (metadata_store_pb2.Event.OUTPUT, metadata_store_pb2.Event.DECLARED_OUTPUT)
INPUT_EVENTS = (metadata_store_pb2.Event.INPUT, metadata_store_pb2.Event.DECLARED_INPUT)


def open_store(connection_config: metadata_store_pb2.ConnectionConfig) -> metadata_store.MetadataStore:
    return metadata_store.MetadataStore(connection_config)


def _proto(item):
    """The MLMD proto of an artifact or execution (a TFX Artifact wraps one)."""
    return getattr(item, "mlmd_artifact", item)


def _value(v: metadata_store_pb2.Value) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def prop(item, name: str, default=None) -> Any:
    """A property or custom property of an MLMD artifact or execution (or a TFX Artifact)."""
    item = _proto(item)
    for props in (item.properties, item.custom_properties):
        if name in props:
            return _value(props[name])
    return default


def has_prop(item, name: str) -> bool:
    return prop(item, name) is not None


def span(artifact, default: int = 0) -> int:
    """ExampleGen's ``span`` (an int; older TFX stored it as a string); ``default`` when absent."""
    value = prop(artifact, SPAN_PROPERTY)
    return default if value in (None, "") else int(value)


def version(artifact) -> int:
    """ExampleGen's ``version`` of a span's data (0 when absent)."""
    value = prop(artifact, VERSION_PROPERTY)
    return 0 if value in (None, "") else int(value)


def artifact_type_name(store, artifact) -> str:
    """The name of an artifact's type (e.g. ``Examples``, ``deepseek_tfx.Tokenizer``)."""
    return store.get_artifact_types_by_id([_proto(artifact).type_id])[0].name


def execution_type_name(store, execution) -> str:
    """The name of an execution's type (TFX uses the component's class path)."""
    return store.get_execution_types_by_id([execution.type_id])[0].name


PIPELINE_RUN_CONTEXT = "pipeline_run"
"""The context type TFX gives each run of a pipeline; its name is the run id."""


def node_executions(store, pipeline_name: str, node_id: str, run_id: str | None = None) -> list:
    """Finished executions (complete or cached) of one pipeline node, oldest first; only run ``run_id``'s
    when given."""
    context = store.get_context_by_type_and_name("node", f"{pipeline_name}.{node_id}")
    if context is None:
        return []
    executions = store.get_executions_by_context(context.id)
    if run_id is not None:
        run = store.get_context_by_type_and_name(PIPELINE_RUN_CONTEXT, run_id)
        in_run = {e.id for e in store.get_executions_by_context(run.id)} if run is not None else set()
        executions = [e for e in executions if e.id in in_run]
    return sorted((e for e in executions if e.last_known_state in _DONE), key=lambda e: e.id)


def run_executions(store, pipeline_name: str, node_id: str, run_id: str) -> list:
    """Every execution of one node in run ``run_id``, whatever its state, oldest first."""
    context = store.get_context_by_type_and_name("node", f"{pipeline_name}.{node_id}")
    run = store.get_context_by_type_and_name(PIPELINE_RUN_CONTEXT, run_id)
    if context is None or run is None:
        return []
    in_run = {e.id for e in store.get_executions_by_context(run.id)}
    return sorted((e for e in store.get_executions_by_context(context.id) if e.id in in_run), key=lambda e: e.id)


def latest_run_id(store, pipeline_name: str) -> str | None:
    """The id of the pipeline's newest run (the run of its newest execution), or None."""
    pipeline = store.get_context_by_type_and_name("pipeline", pipeline_name)
    if pipeline is None:
        return None
    executions = store.get_executions_by_context(pipeline.id)
    for execution in sorted(executions, key=lambda e: e.id, reverse=True):
        for context in store.get_contexts_by_execution(execution.id):
            if store.get_context_types_by_id([context.type_id])[0].name == PIPELINE_RUN_CONTEXT:
                return context.name
    return None


def _events(store, execution_id: int, outputs: bool) -> list:
    kinds = OUTPUT_EVENTS if outputs else INPUT_EVENTS
    return [e for e in store.get_events_by_execution_ids([execution_id]) if e.type in kinds]


def _keys(event) -> list[str]:
    """The keys an event files its artifact under: several when one artifact went to one execution under several
    keys (ML Metadata keeps one event per artifact and execution, its path holding each key and index)."""
    return [step.key for step in event.path.steps if step.HasField("key")] or [""]


def artifact_ids(store, execution_id: int, key: str, outputs: bool = False) -> list[int]:
    """Ids of the artifacts an execution took (or, with ``outputs``, produced) under ``key``, in event order."""
    return [e.artifact_id for e in _events(store, execution_id, outputs) if key in _keys(e)]


def execution_artifacts(store, execution_id: int, outputs: bool = True) -> dict[str, list]:
    """An execution's output (or input) artifacts by key."""
    events = _events(store, execution_id, outputs)
    artifacts = {a.id: a for a in store.get_artifacts_by_id([e.artifact_id for e in events])}
    by_key: dict[str, list] = {}
    for event in events:
        for key in _keys(event):
            by_key.setdefault(key, []).append(artifacts[event.artifact_id])
    return by_key


def producer_id(store, artifact_id: int) -> int | None:
    """Id of the execution that output the artifact, or None."""
    events = [e for e in store.get_events_by_artifact_ids([artifact_id]) if e.type in OUTPUT_EVENTS]
    return events[0].execution_id if events else None


def consumer_ids(store, artifact_id: int, key: str) -> list[int]:
    """Ids of the executions that took the artifact as an input under ``key``, oldest first."""
    return sorted(e.execution_id for e in store.get_events_by_artifact_ids([artifact_id])
                  if e.type in INPUT_EVENTS and key in _keys(e))


def training_statistics(store, model) -> list:
    """The post-transform statistics of the data a Trainer's model was trained on (its Transform's output)."""
    transformed = producer_inputs(store, [model], EXAMPLES_KEY)
    found: dict[int, Any] = {}
    for artifact in transformed:
        execution_id = producer_id(store, artifact.id)
        if execution_id is not None:
            for stats in execution_artifacts(store, execution_id).get(POST_TRANSFORM_STATS_KEY, []):
                found[stats.id] = stats
    return [found[i] for i in sorted(found)]


def producer(store, artifact_id: int):
    """The execution that output the artifact, or None."""
    execution_id = producer_id(store, artifact_id)
    return None if execution_id is None else store.get_executions_by_id([execution_id])[0]


def latest_outputs(store, pipeline_name: str, node_id: str, run_id: str | None = None) -> dict[str, list]:
    """Output artifacts by key of a node's latest finished execution ({} before it ran); in run ``run_id``
    when given."""
    executions = node_executions(store, pipeline_name, node_id, run_id)
    return execution_artifacts(store, executions[-1].id) if executions else {}


def single(artifacts_by_key: dict, key: str):
    """The first artifact under ``key``, or None."""
    items = artifacts_by_key.get(key) or []
    return items[0] if items else None


def producer_inputs(store, artifacts: Iterable, key: str) -> list:
    """The ``key`` inputs of the executions that produced ``artifacts`` (each artifact once, by id)."""
    found: dict[int, Any] = {}
    for artifact in artifacts:
        execution_id = producer_id(store, artifact.id)
        if execution_id is not None:
            for a in execution_artifacts(store, execution_id, outputs=False).get(key, []):
                found[a.id] = a
    return [found[i] for i in sorted(found)]


def trained_examples(store, model) -> list:
    """The ExampleGen outputs a Trainer's model was trained on (through Transform), oldest span first."""
    transformed = producer_inputs(store, [model], EXAMPLES_KEY)
    return sorted(producer_inputs(store, transformed, EXAMPLES_KEY), key=lambda a: (span(a), a.id))


def ingested_spans(store, pipeline_name: str, example_gen_id: str) -> set[int]:
    """Spans that the pipeline's ExampleGen node has read into Examples artifacts."""
    return {span(examples)
            for execution in node_executions(store, pipeline_name, example_gen_id)
            for examples in execution_artifacts(store, execution.id).get(EXAMPLES_KEY, [])}


def pushed_models(store) -> list:
    """PushedModel artifacts that were really pushed, oldest first."""
    pushed = store.get_artifacts_by_type(PUSHED_MODEL_TYPE)
    return sorted((a for a in pushed if prop(a, PUSHED_PROPERTY, 0)), key=lambda a: a.id)


def latest_pushed_model(store):
    """The newest PushedModel artifact that was really pushed, or None."""
    pushed = pushed_models(store)
    return pushed[-1] if pushed else None


def pushed_versions(store) -> list[dict]:
    """Every model really pushed, oldest first: version, path, and the corpus spans it was trained on."""
    rows = []
    for pushed in pushed_models(store):
        examples = trained_examples(store, producer_inputs(store, [pushed], MODEL_KEY)[0])
        rows.append({"version": prop(pushed, PUSHED_VERSION_PROPERTY),
                     "path": prop(pushed, PUSHED_DESTINATION_PROPERTY),
                     "spans": [span(a, None) for a in examples], "examples_uris": [a.uri for a in examples]})
    return rows
