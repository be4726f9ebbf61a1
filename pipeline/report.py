"""Reads ML Metadata back: the summary of the latest run, its printed form, and the lineage of a pushed model.

Everything here comes from MLMD (through components.mlmd, the one module that
queries it) and from files inside the artifacts it names; nothing is parsed
from logs.
"""

from __future__ import annotations

import json
import os
from typing import Any

import tensorflow as tf
from ml_metadata.proto import metadata_store_pb2

from deepseek_tfx.components import mlmd, model_gate
from deepseek_tfx.components.mlmd import (
    BLESSED_PROPERTY,
    BLESSING_KEY,
    EVALUATION_KEY,
    EXAMPLES_KEY,
    MODEL_RUN_KEY,
    POST_TRANSFORM_STATS_KEY,
    PUSHED_DESTINATION_PROPERTY,
    PUSHED_MODEL_KEY,
    PUSHED_PROPERTY,
    PUSHED_VERSION_PROPERTY,
    SPAN_PROPERTY,
    TFLITE_EXPORTED_PROPERTY,
    TFLITE_MODEL_KEY,
    TFLITE_QUANTIZE_PROPERTY,
    prop,
    single,
)
from deepseek_tfx.pipeline.config import (
    DATA_CHECKS,
    EVALUATOR,
    EXAMPLE_GEN,
    INFRA_VALIDATOR,
    PUSHER,
    TFLITE_EXPORTER,
    TRAINER,
    TRANSFORM,
)
from deepseek_tfx.trainer_module.config import SET_IN_CONFIG, SUMMARY_FILE

FAILED_CHECKS = "failed_checks"
"""Custom property of a failed DataChecks execution: the reasons, as a JSON list (local runs set it)."""


def _read_json(path: str) -> dict | None:
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def evaluation_metrics(evaluation_uri: str, source: str | None = None) -> dict[str, float]:
    """The candidate's metrics on one eval set's slice (model_gate.NEW / REFERENCE; None: the overall slice)."""
    import tensorflow_model_analysis as tfma  # noqa: PLC0415  (heavy; only when reporting)

    wanted = () if source is None else ((model_gate.SOURCE, source.encode()),)
    metrics: dict[str, float] = {}
    for per_slice in tfma.load_metrics(evaluation_uri):
        if tuple((k.column, k.bytes_value) for k in per_slice.slice_key.single_slice_keys) != wanted:
            continue
        for kv in per_slice.metric_keys_and_values:
            if kv.key.model_name in ("", "candidate") and not kv.key.is_diff:
                metrics[kv.key.name] = kv.value.double_value.value
    return metrics


def failed_bounds(evaluation_uri: str) -> list[str]:
    """Why the gate did not bless: each failed threshold with the values it compared."""
    import tensorflow_model_analysis as tfma  # noqa: PLC0415  (heavy; only when reporting)

    reasons = []
    for per_slice in tfma.load_validation_result(evaluation_uri).metric_validations_per_slice:
        values = {k.bytes_value.decode() for k in per_slice.slice_key.single_slice_keys}
        source = model_gate.REFERENCE if model_gate.REFERENCE in values else model_gate.NEW if values else None
        on = " on the reference eval set" if source == model_gate.REFERENCE else ""
        for failure in per_slice.failures:
            name, value = failure.metric_key.name, failure.metric_value.double_value.value
            threshold = failure.metric_threshold
            if threshold.HasField("change_threshold"):
                tolerance = threshold.change_threshold.absolute.value
                both = model_gate.slice_metrics(evaluation_uri, source, name)
                compared = (f" ({both['candidate']:.4f} against {both['baseline']:.4f})"
                            if {"candidate", "baseline"} <= set(both) else "")
                reasons.append(f"{name} {value:+.4f} against the last blessed model{on}{compared}, "
                               f"tolerance {tolerance:g}")
            else:
                bound = threshold.value_threshold.upper_bound.value
                reasons.append(f"{name} {value:.4f} above the bound {bound:g}{on}")
    return reasons


def transformed_token_count(post_transform_stats_uri: str) -> int | None:
    """Total ``token_ids`` values over all transformed splits, from Transform's post-transform stats."""
    from tensorflow_metadata.proto.v0 import statistics_pb2  # noqa: PLC0415

    path = os.path.join(post_transform_stats_uri, "FeatureStats.pb")
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path, "rb") as f:
        stats = statistics_pb2.DatasetFeatureStatisticsList.FromString(f.read())
    for dataset in stats.datasets:
        for feature in dataset.features:
            if list(feature.path.step) == ["token_ids"]:  # categorical (preprocessing.stats_options_updater_fn)
                return int(getattr(feature, feature.WhichOneof("stats")).common_stats.tot_num_values)
    return None


def run_summary(store, pipeline_name: str, run_id: str | None = None) -> dict[str, Any]:
    """What each stage of run ``run_id`` produced (ran or served from the cache), as one flat dict.

    Without ``run_id``: the latest execution of each stage, whichever run it belonged to.
    """
    summary: dict[str, Any] = {"run_id": run_id} if run_id else {}
    examples = single(mlmd.latest_outputs(store, pipeline_name, EXAMPLE_GEN, run_id), EXAMPLES_KEY)
    if examples is not None:
        summary.update(examples_uri=examples.uri, span=prop(examples, SPAN_PROPERTY),
                       files=prop(examples, "corpus_files"), documents=prop(examples, "corpus_documents"),
                       bytes=prop(examples, "corpus_bytes"),
                       replaced_invalid_utf8=prop(examples, "corpus_replaced_invalid_utf8"),
                       chunked_documents=prop(examples, "corpus_chunked_documents"))
    transforms = mlmd.node_executions(store, pipeline_name, TRANSFORM, run_id)
    transform_inputs = mlmd.execution_artifacts(store, transforms[-1].id, outputs=False) if transforms else {}
    # the spans tokenized and trained on: the newest, or the window of --last-spans
    summary["spans"] = sorted(mlmd.span(a) for a in transform_inputs.get(EXAMPLES_KEY, [])) or (
        [summary["span"]] if summary.get("span") is not None else [])
    post_stats = single(mlmd.execution_artifacts(store, transforms[-1].id) if transforms else {},
                        POST_TRANSFORM_STATS_KEY)
    if post_stats is not None:
        summary["corpus_tokens"] = transformed_token_count(post_stats.uri)
    checks = single(mlmd.latest_outputs(store, pipeline_name, DATA_CHECKS, run_id), "anomalies")
    if checks is not None:
        summary["data_checks_passed"] = bool(prop(checks, "passed", 0))
        summary["data_checks_failed"] = json.loads(prop(checks, "reasons", "[]"))
    failed = [e for e in (mlmd.run_executions(store, pipeline_name, DATA_CHECKS, run_id) if run_id else [])
              if e.last_known_state == metadata_store_pb2.Execution.FAILED and mlmd.has_prop(e, FAILED_CHECKS)]
    if failed:  # the checks failed the run (local_runner records why on the execution)
        summary.update(data_checks_passed=False, data_checks_failed=json.loads(prop(failed[-1], FAILED_CHECKS)))
    model_run = single(mlmd.latest_outputs(store, pipeline_name, TRAINER, run_id), MODEL_RUN_KEY)
    training = _read_json(os.path.join(model_run.uri, SUMMARY_FILE)) if model_run else None
    if model_run is not None:
        summary["tensorboard_logdir"] = model_run.uri
    if training:
        summary.update(train_steps=training["train_steps"], train_tokens=training["train_tokens"],
                       train_tokens_per_second=training["tokens_per_second"],
                       parameters=training["parameters"], final_train_loss=training["final_train_loss"],
                       warm_start=training.get("base_model"), resumed_from_step=training.get("resumed_from_step"),
                       train_mfu=training.get("mfu"))
        if training.get("autotune") and training["autotune"]["reason"] != SET_IN_CONFIG:  # auto decided
            choice = training["autotune"]
            summary.update(train_precision=choice["precision"], train_jit_compile=choice["jit_compile"],
                           train_precision_reason=choice["reason"], moe_dispatch=training.get("moe_dispatch"))
        if training.get("tuned_hyperparameters"):
            summary["tuned_hyperparameters"] = training["tuned_hyperparameters"]
    evaluator = mlmd.latest_outputs(store, pipeline_name, EVALUATOR, run_id)
    evaluation, blessing = single(evaluator, EVALUATION_KEY), single(evaluator, BLESSING_KEY)
    if evaluation is not None:
        metrics = evaluation_metrics(evaluation.uri, model_gate.NEW) or evaluation_metrics(evaluation.uri)
        summary.update(eval_perplexity=metrics.get("perplexity"),
                       eval_bits_per_byte=metrics.get("bits_per_byte"),
                       eval_examples=metrics.get("example_count"))
        reference = evaluation_metrics(evaluation.uri, model_gate.REFERENCE)
        if reference:
            summary.update(reference_bits_per_byte=reference.get("bits_per_byte"),
                           reference_baseline_bits_per_byte=prop(
                               evaluation, f"{model_gate.REFERENCE}_baseline_bits_per_byte"),
                           reference_examples=reference.get("example_count"))
    if blessing is not None:
        summary["blessed"] = bool(prop(blessing, BLESSED_PROPERTY, 0))
        if not summary["blessed"] and evaluation is not None:
            summary["not_blessed_because"] = failed_bounds(evaluation.uri)
    infra = single(mlmd.latest_outputs(store, pipeline_name, INFRA_VALIDATOR, run_id), BLESSING_KEY)
    if infra is not None:  # only runs with a Docker engine have an InfraValidator
        summary["infra_validated"] = bool(prop(infra, BLESSED_PROPERTY, 0))
    pushed = single(mlmd.latest_outputs(store, pipeline_name, PUSHER, run_id), PUSHED_MODEL_KEY)
    if pushed is not None and prop(pushed, PUSHED_PROPERTY, 0):
        summary.update(pushed_model_path=prop(pushed, PUSHED_DESTINATION_PROPERTY),
                       pushed_version=prop(pushed, PUSHED_VERSION_PROPERTY))
    tflite = single(mlmd.latest_outputs(store, pipeline_name, TFLITE_EXPORTER, run_id), TFLITE_MODEL_KEY)
    if tflite is not None and prop(tflite, TFLITE_EXPORTED_PROPERTY, 0):  # the optional TFLiteExporter step
        summary["tflite_model"] = f"{tflite.uri} ({prop(tflite, TFLITE_QUANTIZE_PROPERTY, 'none')})"
    return summary


def format_spans(spans) -> str:
    """'span 3' or 'spans 2, 3'."""
    spans = list(spans or [])
    if len(spans) == 1:
        return f"span {spans[0]}"
    return f"spans {', '.join(map(str, spans))}" if spans else "span n/a"


def format_summary(summary: dict) -> str:
    """The run summary as the CLI prints it."""
    def num(key, fmt="{:,}"):
        value = summary.get(key)
        return "n/a" if value is None else fmt.format(value)

    lines = [
        "",
        "deepseek-tfx run summary",
        f"  corpus:        {summary.get('corpus')} ({format_spans(summary.get('spans'))})",
        f"  read:          {num('documents')} documents, {num('bytes')} bytes from {num('files')} file(s)"
        f"; {num('replaced_invalid_utf8')} invalid UTF-8 sequence(s) replaced"
        + (" (the newest span)" if len(summary.get("spans") or []) > 1 else ""),
        f"  tokens:        {num('corpus_tokens')} in the corpus; trained on {num('train_tokens')}",
        f"  training:      {num('train_steps')} steps, {num('parameters')} parameters, "
        f"{num('train_tokens_per_second', '{:,.0f}')} tokens/s (MFU {num('train_mfu', '{:.1%}')}), "
        f"last loss {num('final_train_loss', '{:.4f}')}; {summary.get('warm_start') or 'n/a'}",
        *([f"  precision:     {summary['train_precision']}, XLA {'on' if summary['train_jit_compile'] else 'off'}"
           + (f", MoE dispatch {summary['moe_dispatch']}" if summary.get("moe_dispatch") not in (None, "none") else "")
           + f" ({summary['train_precision_reason']})"] if "train_precision" in summary else []),
        *([("  tuned:         " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in
                                           summary["tuned_hyperparameters"].items()) + " (the Tuner's best trial)")]
          if summary.get("tuned_hyperparameters") else []),
        "  data checks:   " + ("n/a" if "data_checks_passed" not in summary else "passed"
                                 if summary["data_checks_passed"] else
                                 "FAILED, nothing trained or pushed: " + "; ".join(summary["data_checks_failed"])),
        f"  evaluation:    perplexity {num('eval_perplexity', '{:.3f}')}, bits per byte "
        f"{num('eval_bits_per_byte', '{:.4f}')} on {num('eval_examples', '{:,.0f}')} eval examples",
        *([f"  reference:     bits per byte {num('reference_bits_per_byte', '{:.4f}')} (last blessed model: "
           f"{num('reference_baseline_bits_per_byte', '{:.4f}')}) on {num('reference_examples', '{:,.0f}')} "
           "examples of the reference eval set"] if "reference_bits_per_byte" in summary else []),
        "  blessed:       " + ("n/a (not evaluated)" if "blessed" not in summary
                                 else "yes" if summary["blessed"] else "no")
        + (f" ({'; '.join(summary['not_blessed_because'])})" if summary.get("not_blessed_because") else ""),
    ]
    if summary.get("config"):
        changed = ", ".join(summary["config"]["changed"]) or "none"
        lines.insert(2, f"  config:        preset {summary['config']['preset']}; changed {changed}")
    if summary.get("pushed_model_path"):
        lines.append(f"  pushed model:  {summary['pushed_model_path']} (version {summary['pushed_version']})")
        if summary.get("serve_command"):
            lines.append(f"  serve it:      {summary['serve_command']}")
            lines.append(f"  configs:       {', '.join(sorted(summary.get('serving_configs', {}).values()))}")
        if summary.get("tflite_model"):
            lines.append(f"  TFLite model:  {summary['tflite_model']}")
        if "removed_versions" in summary:
            removed = ", ".join(map(str, summary["removed_versions"])) or "none"
            keep = summary["keep_versions"] or "all"
            lines.append(f"  retention:     keep {keep} pushed versions; removed {removed}")
    elif summary.get("data_checks_passed") is False:
        lines.append("  pushed model:  none (the data checks failed)")
    elif summary.get("blessed") and summary.get("infra_validated") is False:
        lines.append("  pushed model:  none (InfraValidator: TF Serving did not load the model or answer its "
                     "requests; its log is in the InfraValidator's execution)")
    else:
        lines.append("  pushed model:  none (not blessed)")
    if "schema" in summary:
        lines.append("  schema:        " + (f"frozen in {summary['schema']}" + (" by this run" if summary.get(
            "schema_frozen_now") else "") if summary["schema"] else "inferred from this run's data (not frozen)"))
    lines.append(f"  ML Metadata:   {summary.get('metadata')}")
    if summary.get("tensorboard_logdir"):
        lines.append(f"  TensorBoard:   tensorboard --logdir {summary['tensorboard_logdir']}")
    if summary.get("report"):
        lines.append(f"  report:        {summary['report']} (open it in a browser; it needs no network)")
    if summary.get("log_file"):
        lines.append(f"  log:           {summary['log_file']} (every library's output; --verbose prints it here)")
    return "\n".join(lines)


def pushed_versions_lines(store) -> list[str]:
    """One line per pushed version: the spans and examples it was trained on, and where it went."""
    return [f"version {row['version']}: trained on {format_spans(row['spans'])} ({', '.join(row['examples_uris'])})"
            f" -> {row['path']}" for row in mlmd.pushed_versions(store)]


def _describe_artifact(store, artifact) -> str:
    type_name = mlmd.artifact_type_name(store, artifact)
    details = []
    for name in (PUSHED_VERSION_PROPERTY, BLESSED_PROPERTY, SPAN_PROPERTY, "corpus_documents", "corpus_bytes"):
        value = prop(artifact, name)
        if value is not None:
            details.append(f"{name}={value}")
    return f"{type_name} #{artifact.id} {artifact.uri}" + (f" ({', '.join(details)})" if details else "")


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
        execution = mlmd.producer(store, art.id)
        if execution is None or depth >= max_depth:
            return
        exec_type = mlmd.execution_type_name(store, execution).split(".")[-1]
        node = prop(execution, "component_id") or exec_type
        lines.append(f"{indent}    made by {node} (execution #{execution.id})")
        input_base = prop(execution, "input_base")
        if input_base is not None:
            config = json.loads(prop(execution, "input_config") or "{}")
            patterns = [s.get("pattern", "") for s in config.get("splits", [])]
            lines.append(f"{indent}    <- corpus: {os.path.join(input_base, *patterns[:1])}")
        for key, arts in sorted(mlmd.execution_artifacts(store, execution.id, outputs=False).items()):
            for a in arts:
                walk(a, depth + 1, key)

    walk(artifact, 0, "")
    return lines




def finished_trainer_checkpoints(store, pipeline_name: str) -> list[str]:
    """Checkpoint directories of the Trainer executions that finished (each recorded in its training summary)."""
    found = []
    for execution in mlmd.node_executions(store, pipeline_name, TRAINER):
        if execution.last_known_state != mlmd.COMPLETE:  # a cached one points at a completed one's outputs
            continue
        for model_run in mlmd.execution_artifacts(store, execution.id).get(MODEL_RUN_KEY, []):
            training = _read_json(os.path.join(model_run.uri, SUMMARY_FILE)) or {}
            if training.get("checkpoint_dir") and training["checkpoint_dir"] not in found:
                found.append(training["checkpoint_dir"])
    return found


class NothingToReportError(Exception):
    """The store has nothing to report yet; the message says what to run first."""


def lineage_text(connection) -> str:
    """Every pushed version with its spans, then the provenance tree of the latest one.

    Raises:
        NothingToReportError: no ML Metadata at the SQLite path, or no pushed model in it yet.
    """
    if connection.HasField("sqlite") and not os.path.exists(connection.sqlite.filename_uri):
        raise NothingToReportError(f"no ML Metadata at {connection.sqlite.filename_uri}; run `deepseek-tfx run` first")
    store = mlmd.open_store(connection)
    pushed = mlmd.latest_pushed_model(store)
    if pushed is None:
        raise NothingToReportError("no pushed model in ML Metadata yet")
    return "\n".join([*pushed_versions_lines(store), "", *lineage_lines(store, pushed)])
