"""The gate and the push: Evaluator and Pusher with the two behaviours TFX leaves out.

* ``TokenizerAwareEvaluator`` is the standard Evaluator whose executor first
  compares the candidate's tokenizer with the baseline's (each exported model
  records its tokenizer's fingerprint in ``assets.extra/deepseek_config.json``).
  Perplexities over different vocabularies are not comparable, so when the
  tokenizers differ the change threshold against the baseline is taken from
  ``BitsPerByte``; otherwise from ``Perplexity``. The pipeline's EvalConfig
  carries change thresholds on both metrics; the executor keeps one and records
  which on the evaluation artifact (custom property ``compared_by``).
* ``AtomicPusher`` is the standard Pusher whose filesystem push is atomic: the
  SavedModel is copied to ``<base>/.tmp-<version>-<pid>`` (TF Serving ignores
  non-numeric directories) and renamed to ``<base>/<version>`` only when
  complete, so a server polling the base path never loads a half-written
  model. Versions are Unix seconds, bumped past the newest existing version so
  they always increase. ``.tmp-*`` directories of older versions (left by a
  killed push) are removed by the next push. Every copy writes
  ``saved_model.pb`` last, as TFX's Pusher does (TF Serving takes that file as
  the sign of a complete SavedModel). On object stores (``gs://``) a rename is
  itself a copy of each object in no set order, so there the model is copied
  straight to ``<base>/<version>``, ``saved_model.pb`` last. Retention (which
  old versions to delete) needs ML Metadata and runs after the run
  (``pipeline.local_runner.retain_pushed_versions``).
"""

from __future__ import annotations

import os
import re
import time

from absl import logging
from tfx import v1 as tfx
from tfx.components.evaluator import executor as evaluator_executor
from tfx.components.pusher import executor as pusher_executor
from tfx import types
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.dsl.io import fileio
from tfx.proto import pusher_pb2
from tfx.types import artifact_utils, standard_artifacts, standard_component_specs
from tfx.types.component_spec import ChannelParameter, ExecutionParameter
from tfx.utils import io_utils, json_utils, path_utils, proto_utils

from deepseek_tfx.trainer_module.export import read_export_config

COMPARED_BY = "compared_by"
REFERENCE_EXAMPLES_KEY = "reference_examples"
REFERENCE_TOLERANCE_KEY = "reference_bpb_tolerance"
SOURCE = "source"  # the feature the Evaluator slices by: which eval set an example came from
NEW, REFERENCE = "new", "reference"
PERPLEXITY, BITS_PER_BYTE = "Perplexity", "BitsPerByte"
TMP_PREFIX = ".tmp-"
_TMP_DIR = re.compile(re.escape(TMP_PREFIX) + r"(\d+)-\d+")  # TMP_PREFIX<version>-<pid>, as push_atomically names it


class GateError(RuntimeError):
    """The gate or the push cannot go ahead; the message says why."""


def tokenizer_fingerprint(model_artifact) -> str | None:
    """The fingerprint an exported model recorded for its tokenizer (None for older exports)."""
    config = read_export_config(path_utils.serving_model_path(model_artifact.uri))
    return config.get("tokenizer_fingerprint") if config else None


def comparison_metric(candidate, baseline) -> str | None:
    """Which metric compares ``candidate`` with ``baseline``: None without a baseline."""
    if baseline is None:
        return None
    theirs, ours = tokenizer_fingerprint(baseline), tokenizer_fingerprint(candidate)
    return PERPLEXITY if ours is not None and ours == theirs else BITS_PER_BYTE


def keep_change_threshold_on(eval_config, metric: str):
    """A copy of ``eval_config`` whose only change thresholds are on ``metric``."""
    import tensorflow_model_analysis as tfma  # noqa: PLC0415  (heavy)

    config = tfma.EvalConfig()
    config.CopyFrom(eval_config)
    found = False
    for spec in config.metrics_specs:
        for metric_config in spec.metrics:
            if not metric_config.threshold.HasField("change_threshold"):
                continue
            if metric_config.class_name == metric:
                found = True
            else:
                metric_config.threshold.ClearField("change_threshold")
                if not metric_config.threshold.ListFields():
                    metric_config.ClearField("threshold")
    if not found:
        raise GateError(f"the EvalConfig has no change threshold on {metric}; the gate against the "
                        f"baseline needs one (see pipeline.pipeline.eval_config)")
    return config


BOUND_KEYS = {"max_perplexity": PERPLEXITY, "max_bits_per_byte": BITS_PER_BYTE}
"""The Evaluator's optional float parameters (runtime parameters in compiled pipelines: TFX 1.16 cannot put one
inside eval_config) and the metric whose absolute upper bound each replaces."""


def runtime_bounds(exec_properties) -> dict[str, float]:
    """The absolute bounds the run's parameters set, by metric (a parameter that is unset or 0 sets none)."""
    return {BOUND_KEYS[k]: float(exec_properties[k]) for k in BOUND_KEYS if exec_properties.get(k)}


def with_upper_bounds(eval_config, bounds: dict[str, float]):
    """A copy of ``eval_config`` whose value-threshold upper bound on each metric in ``bounds`` is the given one
    (added when the metric has none)."""
    import tensorflow_model_analysis as tfma  # noqa: PLC0415  (heavy)

    config = tfma.EvalConfig()
    config.CopyFrom(eval_config)
    for metric, bound in bounds.items():
        matching = [m for spec in config.metrics_specs for m in spec.metrics if m.class_name == metric]
        if not matching:
            raise GateError(f"the EvalConfig computes no {metric}, so no bound can be set on it")
        for metric_config in matching:
            metric_config.threshold.value_threshold.upper_bound.value = bound
    return config


def source_slice(value: str):
    """The TFMA slicing spec of one eval set (NEW or REFERENCE)."""
    import tensorflow_model_analysis as tfma  # noqa: PLC0415  (heavy)

    return tfma.SlicingSpec(feature_values={SOURCE: value})


def with_reference_slice(eval_config, tolerance: float):
    """A copy of ``eval_config`` sliced by source: its thresholds apply to the new data's slice, and the reference
    slice may be worse than the baseline by at most ``tolerance`` bits per byte."""
    import tensorflow_model_analysis as tfma  # noqa: PLC0415  (heavy)

    config = tfma.EvalConfig()
    config.CopyFrom(eval_config)
    config.ClearField("slicing_specs")
    config.slicing_specs.extend([tfma.SlicingSpec(), source_slice(NEW), source_slice(REFERENCE)])
    found = False
    for spec in config.metrics_specs:
        for metric_config in spec.metrics:
            if metric_config.HasField("threshold"):
                metric_config.per_slice_thresholds.add(slicing_specs=[source_slice(NEW)],
                                                       threshold=metric_config.threshold)
                metric_config.ClearField("threshold")
            if metric_config.class_name == BITS_PER_BYTE:
                found = True
                metric_config.per_slice_thresholds.add(
                    slicing_specs=[source_slice(REFERENCE)],
                    threshold=tfma.MetricThreshold(change_threshold=tfma.GenericChangeThreshold(
                        direction=tfma.MetricDirection.LOWER_IS_BETTER, absolute={"value": tolerance})))
    if not found:
        raise GateError("the EvalConfig computes no BitsPerByte, which the reference eval set is compared on")
    return config


def _tag(record: bytes, source: bytes) -> bytes:
    import tensorflow as tf  # noqa: PLC0415

    example = tf.train.Example.FromString(record)
    example.features.feature[SOURCE].bytes_list.value[:] = [source]
    return example.SerializeToString()


class _TokenizerAwareEvaluatorExecutor(evaluator_executor.Executor):
    def _tagged_examples(self, groups: dict[str, list], splits: list[str]):
        """One Examples artifact holding ``splits`` of each group's artifacts, each example tagged with its
        group's name in the ``source`` feature (a Beam copy of the eval splits, in this execution's tmp dir)."""
        import apache_beam as beam  # noqa: PLC0415
        from tfx.components.util import examples_utils  # noqa: PLC0415

        tagged = standard_artifacts.Examples()
        tagged.uri = os.path.join(self._get_tmp_dir(), "tagged_examples")
        tagged.split_names = artifact_utils.encode_split_names(splits)
        examples_utils.set_payload_format(tagged, examples_utils.get_payload_format(groups[NEW][0]))
        with self._make_beam_pipeline() as pipeline:
            for split in splits:
                sources = [
                    pipeline
                    | f"Read[{split}][{name}][{i}]" >> beam.io.ReadFromTFRecord(io_utils.all_files_pattern(uri))
                    | f"Tag[{split}][{name}][{i}]" >> beam.Map(_tag, name.encode())
                    for name, artifacts in groups.items()
                    for i, uri in enumerate(artifact_utils.get_split_uris(artifacts, split))]
                _ = (sources | f"Flatten[{split}]" >> beam.Flatten()
                     | f"Write[{split}]" >> beam.io.WriteToTFRecord(
                         os.path.join(artifact_utils.get_split_uri([tagged], split), "data_tfrecord"),
                         file_name_suffix=".gz"))
        return tagged

    def Do(self, input_dict, output_dict, exec_properties) -> None:  # noqa: N802
        import tensorflow_model_analysis as tfma  # noqa: PLC0415

        candidate = artifact_utils.get_single_instance(input_dict[standard_component_specs.MODEL_KEY])
        baselines = input_dict.get(standard_component_specs.BASELINE_MODEL_KEY) or []
        metric = comparison_metric(candidate, baselines[0] if baselines else None)
        key = standard_component_specs.EVAL_CONFIG_KEY
        bounds = runtime_bounds(exec_properties)
        if bounds:
            eval_config = tfma.EvalConfig()
            proto_utils.json_to_proto(exec_properties[key], eval_config)
            exec_properties = {**exec_properties, key: proto_utils.proto_to_json(with_upper_bounds(eval_config,
                                                                                                  bounds))}
            logging.info("Gate: absolute bounds from the run's parameters: %s", bounds)
        if metric is not None:
            eval_config = tfma.EvalConfig()
            proto_utils.json_to_proto(exec_properties[key], eval_config)
            exec_properties = {**exec_properties,
                               key: proto_utils.proto_to_json(keep_change_threshold_on(eval_config, metric))}
            logging.info("Gate: candidate compared with baseline %s on %s (%s tokenizer)",
                         baselines[0].uri, metric, "same" if metric == PERPLEXITY else "a different")
        references = input_dict.get(REFERENCE_EXAMPLES_KEY) or []
        tolerance = exec_properties.get(REFERENCE_TOLERANCE_KEY)
        examples = input_dict[standard_component_specs.EXAMPLES_KEY]
        if references and {a.id for a in references} == {a.id for a in examples}:
            logging.info("Gate: the reference eval set is this run's eval data itself; no separate reference slice")
            references = []
        if references and tolerance is not None:
            eval_config = tfma.EvalConfig()
            proto_utils.json_to_proto(exec_properties[key], eval_config)
            exec_properties = {**exec_properties,
                               key: proto_utils.proto_to_json(with_reference_slice(eval_config, float(tolerance)))}
            splits = json_utils.loads(exec_properties.get(standard_component_specs.EXAMPLE_SPLITS_KEY) or "null")
            tagged = self._tagged_examples({NEW: examples, REFERENCE: references}, splits or ["eval"])
            input_dict = {**input_dict, standard_component_specs.EXAMPLES_KEY: [tagged]}
            logging.info("Gate: the reference eval set (%s) may be worse than the baseline by at most %g bits per "
                         "byte", ", ".join(a.uri for a in references), float(tolerance))
        evaluation = artifact_utils.get_single_instance(output_dict[standard_component_specs.EVALUATION_KEY])
        evaluation.set_string_custom_property(COMPARED_BY, metric or "none (no baseline)")
        input_dict = {k: v for k, v in input_dict.items() if k != REFERENCE_EXAMPLES_KEY}
        super().Do(input_dict, output_dict, exec_properties)
        if references and tolerance is not None:  # both eval sets' figures, in ML Metadata
            evaluation.set_string_custom_property("reference_examples", ",".join(a.uri for a in references))
            for source in (NEW, REFERENCE):
                for model, value in slice_metrics(evaluation.uri, source, "bits_per_byte").items():
                    evaluation.set_float_custom_property(f"{source}_{model}_bits_per_byte", value)


def slice_metrics(evaluation_uri: str, source: str | None, name: str) -> dict[str, float]:
    """Metric ``name`` by model (candidate, baseline) on one source's slice (None: the overall slice)."""
    import tensorflow_model_analysis as tfma  # noqa: PLC0415  (heavy)

    wanted = () if source is None else ((SOURCE, source.encode()),)
    found = {}
    for per_slice in tfma.load_metrics(evaluation_uri):
        keys = tuple((k.column, k.bytes_value) for k in per_slice.slice_key.single_slice_keys)
        if keys != wanted:
            continue
        for kv in per_slice.metric_keys_and_values:
            if kv.key.name == name and not kv.key.is_diff:
                found[kv.key.model_name or "candidate"] = kv.value.double_value.value
    return found


class TokenizerAwareEvaluatorSpec(standard_component_specs.EvaluatorSpec):
    INPUTS = {**standard_component_specs.EvaluatorSpec.INPUTS,
              REFERENCE_EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples, optional=True)}
    PARAMETERS = {**standard_component_specs.EvaluatorSpec.PARAMETERS,
                  **{k: ExecutionParameter(type=float, optional=True) for k in BOUND_KEYS},
                  REFERENCE_TOLERANCE_KEY: ExecutionParameter(type=float, optional=True)}


class TokenizerAwareEvaluator(base_beam_component.BaseBeamComponent):
    """The standard Evaluator; the change threshold follows the tokenizers (module docstring).

    Args:
        examples, model, baseline_model, eval_config, example_splits: as for Evaluator.
        max_perplexity, max_bits_per_byte: when set (a float or a RuntimeParameter), the absolute upper bound on
            that metric, replacing the one in ``eval_config`` (see BOUND_KEYS).
        reference_examples: a fixed reference eval set (components.baseline_resolver.FirstBlessedExamplesStrategy);
            when given with ``reference_bpb_tolerance``, the evaluation is sliced by source (with_reference_slice):
            ``eval_config``'s thresholds gate the new data's slice, and the reference slice may be worse than the
            baseline by at most that many bits per byte.
    """

    SPEC_CLASS = TokenizerAwareEvaluatorSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(_TokenizerAwareEvaluatorExecutor)

    def __init__(self, examples, model, eval_config, baseline_model=None, example_splits=None,
                 max_perplexity=None, max_bits_per_byte=None, reference_examples=None,
                 reference_bpb_tolerance: float | None = None):
        super().__init__(spec=TokenizerAwareEvaluatorSpec(
            examples=examples, model=model, baseline_model=baseline_model, eval_config=eval_config,
            reference_examples=reference_examples, reference_bpb_tolerance=reference_bpb_tolerance,
            example_splits=json_utils.dumps(example_splits), fairness_indicator_thresholds=json_utils.dumps(None),
            max_perplexity=max_perplexity, max_bits_per_byte=max_bits_per_byte,
            evaluation=types.Channel(type=standard_artifacts.ModelEvaluation),
            blessing=types.Channel(type=standard_artifacts.ModelBlessing)))


def numeric_versions(base: str) -> list[int]:
    """The numeric version directories under ``base``, ascending."""
    if not fileio.isdir(base):
        return []
    return sorted(int(n.rstrip("/")) for n in fileio.listdir(base) if n.rstrip("/").isdigit())


def next_version(base: str, now: float | None = None) -> int:
    """Unix seconds, or one more than the newest version there when that is later."""
    existing = numeric_versions(base)
    return max(int(now if now is not None else time.time()), (existing[-1] + 1) if existing else 0)


def copy_saved_model(src: str, dst: str) -> None:
    """Copies the SavedModel directory ``src`` to ``dst`` with ``saved_model.pb`` last (TFX's Pusher order)."""
    io_utils.copy_dir(src, dst, deny_regex_patterns=[r"(^|/)saved_model\.pb$"])
    io_utils.copy_file(os.path.join(src, "saved_model.pb"), os.path.join(dst, "saved_model.pb"))


def remove_stale_pushes(base: str, version: int) -> list[str]:
    """Deletes ``.tmp-<v>-<pid>`` directories under ``base`` with v < ``version`` (left by killed pushes)."""
    removed = []
    for name in (n.rstrip("/") for n in fileio.listdir(base)):
        match = _TMP_DIR.fullmatch(name)
        if match and int(match.group(1)) < version:
            fileio.rmtree(os.path.join(base, name))
            removed.append(name)
    return removed


def push_atomically(model_path: str, base: str) -> tuple[str, int]:
    """Copies the SavedModel at ``model_path`` to ``base/<version>`` atomically; returns (path, version)."""
    if not fileio.exists(os.path.join(model_path, "saved_model.pb")):
        raise GateError(f"no SavedModel at {model_path} (saved_model.pb is missing); nothing was pushed")
    fileio.makedirs(base)
    version = next_version(base)
    for name in remove_stale_pushes(base, version):
        logging.warning("Removed %s, left in %s by a push that did not finish", name, base)
    final = os.path.join(base, str(version))
    if "://" in base:  # an object store: no atomic rename, so copy in place with saved_model.pb last
        try:
            copy_saved_model(model_path, final)
        except BaseException:
            if fileio.exists(final):
                fileio.rmtree(final)
            raise
    else:
        tmp = os.path.join(base, f"{TMP_PREFIX}{version}-{os.getpid()}")
        try:
            copy_saved_model(model_path, tmp)
            fileio.rename(tmp, final, overwrite=False)
        finally:
            if fileio.exists(tmp):
                fileio.rmtree(tmp)
    logging.info("Pushed version %d to %s", version, final)
    return final, version


class _AtomicPusherExecutor(pusher_executor.Executor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:  # noqa: N802
        self._log_startup(input_dict, output_dict, exec_properties)
        model_push = artifact_utils.get_single_instance(output_dict[standard_component_specs.PUSHED_MODEL_KEY])
        if not self.CheckBlessing(input_dict):
            self._MarkNotPushed(model_push)
            return
        destination = pusher_pb2.PushDestination()
        proto_utils.json_to_proto(exec_properties[standard_component_specs.PUSH_DESTINATION_KEY], destination)
        if destination.WhichOneof("destination") != "filesystem":
            raise GateError("AtomicPusher pushes to a filesystem destination only")
        model_path = self.GetModelPath(input_dict)
        path, version = push_atomically(model_path, destination.filesystem.base_directory)
        io_utils.copy_dir(model_path, model_push.uri)  # the archive copy, as the standard Pusher keeps
        self._MarkPushed(model_push, pushed_destination=path, pushed_version=str(version))


class AtomicPusher(tfx.components.Pusher):
    """The standard Pusher with an atomic, versioned filesystem push (module docstring)."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(_AtomicPusherExecutor)
