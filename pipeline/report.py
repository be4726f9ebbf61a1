"""Reads ML Metadata back: the summary of the latest run and the lineage of a pushed model.

Everything here comes from MLMD (executions, events, artifacts and their
properties) and from files inside the artifacts it names; nothing is parsed
from logs.
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import tensorflow as tf
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

_DONE = (metadata_store_pb2.Execution.COMPLETE, metadata_store_pb2.Execution.CACHED)
_OUTPUT_EVENTS = (metadata_store_pb2.Event.OUTPUT, metadata_store_pb2.Event.DECLARED_OUTPUT)
_INPUT_EVENTS = (metadata_store_pb2.Event.INPUT, metadata_store_pb2.Event.DECLARED_INPUT)


def open_store(connection_config: metadata_store_pb2.ConnectionConfig) -> metadata_store.MetadataStore:
    return metadata_store.MetadataStore(connection_config)


def _value(v: metadata_store_pb2.Value) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def prop(item, name: str, default=None) -> Any:
    """A property or custom property of an MLMD artifact or execution."""
    for props in (item.properties, item.custom_properties):
        if name in props:
            return _value(props[name])
    return default


def node_executions(store, pipeline_name: str, node_id: str) -> list:
    """Finished executions (complete or cached) of one pipeline node, oldest first."""
    context = store.get_context_by_type_and_name("node", f"{pipeline_name}.{node_id}")
    if context is None:
        return []
    executions = store.get_executions_by_context(context.id)
    return sorted((e for e in executions if e.last_known_state in _DONE), key=lambda e: e.id)


def execution_artifacts(store, execution_id: int, outputs: bool = True) -> dict[str, list]:
    """An execution's output (or input) artifacts by key."""
    kinds = _OUTPUT_EVENTS if outputs else _INPUT_EVENTS
    events = [e for e in store.get_events_by_execution_ids([execution_id]) if e.type in kinds]
    artifacts = {a.id: a for a in store.get_artifacts_by_id([e.artifact_id for e in events])}
    by_key: dict[str, list] = {}
    for event in events:
        key = event.path.steps[0].key if event.path.steps else ""
        by_key.setdefault(key, []).append(artifacts[event.artifact_id])
    return by_key


def latest_outputs(store, pipeline_name: str, node_id: str) -> dict[str, list]:
    executions = node_executions(store, pipeline_name, node_id)
    return execution_artifacts(store, executions[-1].id) if executions else {}


def _single(outputs: dict, key: str):
    items = outputs.get(key) or []
    return items[0] if items else None


def _read_json(path: str) -> Optional[dict]:
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def evaluation_metrics(evaluation_uri: str) -> dict[str, float]:
    """Overall-slice metrics of the candidate model from an Evaluator output."""
    import tensorflow_model_analysis as tfma  # noqa: PLC0415  (heavy; only when reporting)

    metrics: dict[str, float] = {}
    for per_slice in tfma.load_metrics(evaluation_uri):
        if per_slice.slice_key.single_slice_keys:
            continue
        for kv in per_slice.metric_keys_and_values:
            if kv.key.model_name in ("", "candidate") and not kv.key.is_diff:
                metrics[kv.key.name] = kv.value.double_value.value
    return metrics


def transformed_token_count(post_transform_stats_uri: str) -> Optional[int]:
    """Total ``token_ids`` values over all transformed splits, from Transform's post-transform stats."""
    from tensorflow_metadata.proto.v0 import statistics_pb2  # noqa: PLC0415

    path = os.path.join(post_transform_stats_uri, "FeatureStats.pb")
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "rb") as f:
        stats = statistics_pb2.DatasetFeatureStatisticsList.FromString(f.read())
    for dataset in stats.datasets:
        for feature in dataset.features:
            if list(feature.path.step) == ["token_ids"]:
                return int(feature.num_stats.common_stats.tot_num_values)
    return None


def run_summary(store, pipeline_name: str) -> dict[str, Any]:
    """What the latest execution of each stage produced, as one flat dict."""
    summary: dict[str, Any] = {}
    examples = _single(latest_outputs(store, pipeline_name, "TextExampleGen"), "examples")
    if examples is not None:
        summary.update(examples_uri=examples.uri, span=prop(examples, "span"),
                       files=prop(examples, "corpus_files"), documents=prop(examples, "corpus_documents"),
                       bytes=prop(examples, "corpus_bytes"),
                       replaced_invalid_utf8=prop(examples, "corpus_replaced_invalid_utf8"),
                       chunked_documents=prop(examples, "corpus_chunked_documents"))
    transforms = node_executions(store, pipeline_name, "Transform")
    tokenized = execution_artifacts(store, transforms[-1].id, outputs=False).get("examples", []) if transforms else []
    # the spans tokenized and trained on: the newest, or the window of --last-spans
    summary["spans"] = sorted(prop(a, "span", 0) for a in tokenized) or (
        [summary["span"]] if summary.get("span") is not None else [])
    post_stats = _single(execution_artifacts(store, transforms[-1].id) if transforms else {}, "post_transform_stats")
    if post_stats is not None:
        summary["corpus_tokens"] = transformed_token_count(post_stats.uri)
    model_run = _single(latest_outputs(store, pipeline_name, "Trainer"), "model_run")
    training = _read_json(os.path.join(model_run.uri, "training_summary.json")) if model_run else None
    if training:
        summary.update(train_steps=training["train_steps"], train_tokens=training["train_tokens"],
                       train_tokens_per_second=training["tokens_per_second"],
                       parameters=training["parameters"], final_train_loss=training["final_train_loss"],
                       warm_start=training.get("base_model"), resumed_from_step=training.get("resumed_from_step"),
                       train_mfu=training.get("mfu"))
    evaluator = latest_outputs(store, pipeline_name, "Evaluator")
    evaluation, blessing = _single(evaluator, "evaluation"), _single(evaluator, "blessing")
    if evaluation is not None:
        metrics = evaluation_metrics(evaluation.uri)
        summary.update(eval_perplexity=metrics.get("perplexity"),
                       eval_bits_per_byte=metrics.get("bits_per_byte"),
                       eval_examples=metrics.get("example_count"))
    if blessing is not None:
        summary["blessed"] = bool(prop(blessing, "blessed", 0))
    pushed = _single(latest_outputs(store, pipeline_name, "Pusher"), "pushed_model")
    if pushed is not None and prop(pushed, "pushed", 0):
        summary.update(pushed_model_path=prop(pushed, "pushed_destination"),
                       pushed_version=prop(pushed, "pushed_version"))
    return summary


def latest_pushed_model(store):
    """The newest PushedModel artifact that was really pushed, or None."""
    pushed = [a for a in store.get_artifacts_by_type("PushedModel") if prop(a, "pushed", 0)]
    return max(pushed, key=lambda a: a.id) if pushed else None


def _describe_artifact(store, artifact) -> str:
    type_name = store.get_artifact_types_by_id([artifact.type_id])[0].name
    details = []
    for name in ("pushed_version", "blessed", "span", "corpus_documents", "corpus_bytes"):
        value = prop(artifact, name)
        if value is not None:
            details.append(f"{name}={value}")
    return f"{type_name} #{artifact.id} {artifact.uri}" + (f" ({', '.join(details)})" if details else "")


def _producer(store, artifact_id: int):
    events = [e for e in store.get_events_by_artifact_ids([artifact_id]) if e.type in _OUTPUT_EVENTS]
    if not events:
        return None
    return store.get_executions_by_id([events[0].execution_id])[0]


def lineage_lines(store, artifact, max_depth: int = 8) -> list[str]:
    """The provenance tree of ``artifact``: each artifact, the execution that made it, and its inputs.

    Artifacts already shown are referenced, not repeated. ExampleGen executions
    also show the corpus location they read.
    """
    lines: list[str] = []
    seen: set[int] = set()

    def walk(art, depth: int, via: str):
        indent = "    " * depth
        prefix = f"{indent}<- {via}: " if depth else ""
        if art.id in seen:
            lines.append(f"{prefix}{_describe_artifact(store, art)} (shown above)")
            return
        seen.add(art.id)
        lines.append(prefix + _describe_artifact(store, art))
        execution = _producer(store, art.id)
        if execution is None or depth >= max_depth:
            return
        exec_type = store.get_execution_types_by_id([execution.type_id])[0].name.split(".")[-1]
        node = prop(execution, "component_id") or exec_type
        lines.append(f"{indent}    made by {node} (execution #{execution.id})")
        input_base = prop(execution, "input_base")
        if input_base is not None:
            config = json.loads(prop(execution, "input_config") or "{}")
            patterns = [s.get("pattern", "") for s in config.get("splits", [])]
            lines.append(f"{indent}    <- corpus: {os.path.join(input_base, *patterns[:1])}")
        for key, arts in sorted(execution_artifacts(store, execution.id, outputs=False).items()):
            for a in arts:
                walk(a, depth + 1, key)

    walk(artifact, 0, "")
    return lines


def _producer_inputs(store, artifacts, key: str) -> list:
    """The ``key`` inputs of the executions that produced ``artifacts`` (each artifact once, by id)."""
    found: dict[int, Any] = {}
    for artifact in artifacts:
        execution = _producer(store, artifact.id)
        if execution is not None:
            for a in execution_artifacts(store, execution.id, outputs=False).get(key, []):
                found[a.id] = a
    return [found[i] for i in sorted(found)]


def trained_examples(store, model) -> list:
    """The ExampleGen outputs a Trainer's model was trained on (through Transform), oldest span first."""
    transformed = _producer_inputs(store, [model], "examples")
    return sorted(_producer_inputs(store, transformed, "examples"), key=lambda a: (prop(a, "span", 0), a.id))


def ingested_spans(store, pipeline_name: str) -> set[int]:
    """Spans that the pipeline's ExampleGen has read into Examples artifacts."""
    spans = set()
    for execution in node_executions(store, pipeline_name, "TextExampleGen"):
        for examples in execution_artifacts(store, execution.id).get("examples", []):
            spans.add(int(prop(examples, "span", 0)))
    return spans


def pushed_versions(store) -> list[dict]:
    """Every model really pushed, oldest first: version, path, and the corpus spans it was trained on."""
    rows = []
    for pushed in sorted(store.get_artifacts_by_type("PushedModel"), key=lambda a: a.id):
        if not prop(pushed, "pushed", 0):
            continue
        examples = trained_examples(store, _producer_inputs(store, [pushed], "model")[0])
        rows.append({"version": prop(pushed, "pushed_version"), "path": prop(pushed, "pushed_destination"),
                     "spans": [prop(a, "span") for a in examples], "examples_uris": [a.uri for a in examples]})
    return rows
