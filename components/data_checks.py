"""DataChecks: the gate between a new span and training, on TensorFlow Data Validation.

ExampleValidator checks the raw examples against the pipeline's schema; a text
corpus needs more than a raw schema can say (a column of free text is always
"a string"). DataChecks reads Transform's post-transform statistics of the data
about to be trained on and fails the check, with each reason named, when:

* ExampleValidator found anomalies in the raw examples;
* documents are longer or shorter in bytes, or in tokens, than the frozen
  ranges allow (``text_schema``: a TFDV schema with ``int_domain`` on
  ``num_bytes`` and ``value_count`` on ``token_ids``, frozen from the first
  pushed run's statistics; see ``text_constraints``);
* U+FFFD, which ExampleGen puts in place of invalid UTF-8, is more than
  ``max_replacement_share`` of the characters;
* the token frequencies moved further than ``max_token_drift`` (Jensen-Shannon
  divergence, TFDV's drift comparator) from those of the data the last blessed model was
  trained on (``baseline_statistics``, from
  components.baseline_resolver.BlessedDataStatisticsStrategy).

Its output, an ExampleAnomalies artifact, holds the TFDV Anomalies and the
custom properties ``passed`` and ``reasons`` (a JSON list). When a check fails,
the execution fails with DataChecksFailedError naming every reason (the anomalies
are still written to the output's directory): the Trainer runs after DataChecks
(an upstream dependency, not an input, so a rerun's Trainer stays cached when
only the checks ran again), so a failed check trains and pushes nothing.
"""

from __future__ import annotations

import json
import math
import os

from absl import logging
from tfx import types
from tfx.dsl.components.base import base_component, base_executor, executor_spec
from tfx.dsl.io import fileio
from tfx.types import artifact_utils, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ComponentSpec, ExecutionParameter
from tfx.utils import io_utils

STATISTICS_KEY = "statistics"  # Transform's post_transform_stats
SCHEMA_KEY = "text_schema"  # the frozen ranges (optional)
BASELINE_STATISTICS_KEY = "baseline_statistics"  # the blessed model's post_transform_stats (optional)
RAW_ANOMALIES_KEY = "raw_anomalies"  # ExampleValidator's anomalies
ANOMALIES_KEY = "anomalies"
CHECKS_KEY = "checks"
PASSED, REASONS = "passed", "reasons"

STATS_FILE = "FeatureStats.pb"
ANOMALIES_FILE = "SchemaDiff.pb"  # ExampleValidator's name for it
SCHEMA_FILE = "schema.pbtxt"  # ImportSchemaGen's name for it
TOKEN_IDS, NUM_BYTES, NUM_CHARS, REPLACEMENT_CHARS = "token_ids", "num_bytes", "num_chars", "replacement_chars"


class DataCheckError(ValueError):
    """The data checks cannot be made (missing statistics, a bad frozen schema); the message says which."""


class DataChecksFailedError(RuntimeError):
    """The data failed the checks; ``reasons`` names each failure."""

    PREFIX = "the data checks failed, so nothing was trained or pushed: "

    def __init__(self, reasons: list[str]):
        super().__init__(self.PREFIX + "; ".join(reasons))
        self.reasons = list(reasons)

    @classmethod
    def reasons_in(cls, error: BaseException) -> list[str] | None:
        """The reasons of a DataChecksFailedError in ``error``'s chain (None when there is none)."""
        seen = set()
        while error is not None and id(error) not in seen:
            seen.add(id(error))
            if isinstance(error, cls):
                return error.reasons
            if cls.PREFIX in str(error):  # re-raised by the orchestrator as another type
                return str(error).split(cls.PREFIX, 1)[1].strip().splitlines()[0].split("; ")
            error = error.__cause__ or error.__context__
        return None


def load_statistics(uri: str):
    """The DatasetFeatureStatisticsList in an ExampleStatistics artifact directory (Transform's layout)."""
    from tensorflow_metadata.proto.v0 import statistics_pb2  # noqa: PLC0415

    path = os.path.join(uri, STATS_FILE)
    if not fileio.exists(path):
        raise DataCheckError(f"no statistics at {path}: Transform's post-transform statistics are needed "
                             "(was it run with disable_statistics?)")
    with fileio.open(path, "rb") as f:
        return statistics_pb2.DatasetFeatureStatisticsList.FromString(f.read())


def _feature(statistics, name: str):
    for feature in statistics.datasets[0].features:
        if list(feature.path.step) == [name]:
            return feature
    raise DataCheckError(f"the post-transform statistics have no feature {name!r} "
                         "(trainer_module.preprocessing makes it)")


def _common(feature):
    return getattr(feature, feature.WhichOneof("stats")).common_stats


def replacement_share(statistics) -> float:
    """U+FFFD characters as a share of all characters (means over the same documents, so a ratio of sums)."""
    chars = _feature(statistics, NUM_CHARS).num_stats.mean
    return _feature(statistics, REPLACEMENT_CHARS).num_stats.mean / chars if chars else 0.0


def text_constraints(statistics, margin: float):
    """The frozen ranges: observed document bytes and token counts, widened by ``margin`` each way."""
    from tensorflow_metadata.proto.v0 import schema_pb2  # noqa: PLC0415

    schema = schema_pb2.Schema()
    num_bytes = _feature(statistics, NUM_BYTES).num_stats
    feature = schema.feature.add(name=NUM_BYTES, type=schema_pb2.INT)
    feature.int_domain.min = max(0, math.floor(num_bytes.min / margin))
    feature.int_domain.max = math.ceil(num_bytes.max * margin)
    tokens = _common(_feature(statistics, TOKEN_IDS))
    feature = schema.feature.add(name=TOKEN_IDS, type=schema_pb2.INT)
    feature.value_count.min = max(1, math.floor(tokens.min_num_values / margin))
    feature.value_count.max = math.ceil(tokens.max_num_values * margin)
    return schema


def _validation_schema(statistics, text_schema, drift: float | None):
    """The schema TFDV validates with: what the statistics hold, the frozen ranges, the drift comparator."""
    import tensorflow_data_validation as tfdv  # noqa: PLC0415

    schema = tfdv.infer_schema(statistics)
    frozen = {f.name: f for f in (text_schema.feature if text_schema is not None else [])}
    for feature in schema.feature:
        for field in ("int_domain", "value_count", "domain"):  # inferred from this very data: not constraints
            feature.ClearField(field)
        if feature.name in frozen:
            for field in ("int_domain", "value_count"):
                if frozen[feature.name].HasField(field):
                    getattr(feature, field).CopyFrom(getattr(frozen[feature.name], field))
        if feature.name == TOKEN_IDS:
            feature.int_domain.is_categorical = True  # the statistics hold its top-k frequencies
            if drift is not None:
                feature.drift_comparator.jensen_shannon_divergence.threshold = drift
    return schema


def check(statistics, *, max_replacement_share: float | None, max_token_drift: float | None, text_schema=None,
          baseline=None):
    """(reasons, Anomalies): why ``statistics`` fail the checks (empty when they pass) and TFDV's anomalies.

    The thresholds are pipeline.config.DataChecksConfig's; None turns a check off.
    """
    import tensorflow_data_validation as tfdv  # noqa: PLC0415

    drift = max_token_drift if baseline is not None else None
    anomalies = tfdv.validate_statistics(statistics, _validation_schema(statistics, text_schema, drift),
                                         previous_statistics=baseline if drift is not None else None)
    reasons = [f"{name}: {info.description or info.short_description}"
               for name, info in sorted(anomalies.anomaly_info.items())]
    if max_replacement_share is not None:
        share = replacement_share(statistics)
        if share > max_replacement_share:
            reasons.append(f"{REPLACEMENT_CHARS}: {share:.2%} of the characters are U+FFFD, the mark of invalid "
                           f"UTF-8 (data_checks.max_replacement_share is {max_replacement_share:g})")
    return reasons, anomalies


def raw_anomaly_reasons(uri: str, split_names: str) -> list[str]:
    """ExampleValidator's anomalies in an ExampleAnomalies artifact (its ``uri`` and ``split_names`` property),
    one reason per split and feature."""
    from tensorflow_data_validation.utils import anomalies_util  # noqa: PLC0415

    reasons = []
    for split in artifact_utils.decode_split_names(split_names):
        path = os.path.join(uri, f"Split-{split}", ANOMALIES_FILE)
        if not fileio.exists(path):
            continue
        anomalies = anomalies_util.load_anomalies_binary(path)
        reasons += [f"{split} split, {name}: {info.description or info.short_description}"
                    for name, info in sorted(anomalies.anomaly_info.items())]
    return reasons


def read_schema(uri: str, name: str = SCHEMA_FILE):
    """The TFDV schema in file ``name`` of directory ``uri`` (a Schema artifact's file by default)."""
    from tensorflow_metadata.proto.v0 import schema_pb2  # noqa: PLC0415

    path = os.path.join(uri, name)
    if not fileio.exists(path):
        raise DataCheckError(f"no schema at {path}")
    return io_utils.parse_pbtxt_file(path, schema_pb2.Schema())


class _Executor(base_executor.BaseExecutor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:  # noqa: N802
        checks = json.loads(exec_properties[CHECKS_KEY])
        statistics = load_statistics(artifact_utils.get_single_uri(input_dict[STATISTICS_KEY]))
        schemas = input_dict.get(SCHEMA_KEY) or []
        baselines = input_dict.get(BASELINE_STATISTICS_KEY) or []
        reasons = [reason for a in input_dict.get(RAW_ANOMALIES_KEY) or []
                   for reason in raw_anomaly_reasons(a.uri, a.split_names)]
        text_reasons, anomalies = check(
            statistics, max_replacement_share=checks.get("max_replacement_share"),
            max_token_drift=checks.get("max_token_drift"),
            text_schema=read_schema(schemas[0].uri) if schemas else None,
            baseline=load_statistics(baselines[0].uri) if baselines else None)
        reasons += text_reasons
        output = artifact_utils.get_single_instance(output_dict[ANOMALIES_KEY])
        output.split_names = artifact_utils.encode_split_names(["train"])
        split_dir = artifact_utils.get_split_uri([output], "train")
        fileio.makedirs(split_dir)
        io_utils.write_bytes_file(os.path.join(split_dir, ANOMALIES_FILE), anomalies.SerializeToString())
        output.set_int_custom_property(PASSED, int(not reasons))
        output.set_string_custom_property(REASONS, json.dumps(reasons))
        logging.info("Data checks: %s (frozen ranges: %s; drift compared with %s)",
                     "passed" if not reasons else "FAILED: " + "; ".join(reasons),
                     "yes" if schemas else "not yet frozen", baselines[0].uri if baselines else "nothing")
        if reasons:
            raise DataChecksFailedError(reasons)


class DataChecksSpec(ComponentSpec):
    PARAMETERS = {CHECKS_KEY: ExecutionParameter(type=str)}
    INPUTS = {
        STATISTICS_KEY: ChannelParameter(type=standard_artifacts.ExampleStatistics),
        SCHEMA_KEY: ChannelParameter(type=standard_artifacts.Schema, optional=True),
        BASELINE_STATISTICS_KEY: ChannelParameter(type=standard_artifacts.ExampleStatistics, optional=True),
        RAW_ANOMALIES_KEY: ChannelParameter(type=standard_artifacts.ExampleAnomalies, optional=True),
    }
    OUTPUTS = {ANOMALIES_KEY: ChannelParameter(type=standard_artifacts.ExampleAnomalies)}


class DataChecks(base_component.BaseComponent):
    """Checks the data about to be trained on (module docstring); ``anomalies`` says whether it passed.

    Args:
        statistics: Transform's post-transform statistics of this run's data.
        checks: the thresholds (pipeline.config.DataChecksConfig.to_dict()).
        text_schema: the frozen ranges (a Schema from ImportSchemaGen); None before the schema is frozen.
        baseline_statistics: the post-transform statistics of the last blessed model's data; None: no drift check.
        raw_anomalies: ExampleValidator's output.
    """

    SPEC_CLASS = DataChecksSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(_Executor)

    def __init__(self, statistics, checks: dict, text_schema=None, baseline_statistics=None, raw_anomalies=None):
        super().__init__(spec=DataChecksSpec(
            statistics=statistics, text_schema=text_schema, baseline_statistics=baseline_statistics,
            raw_anomalies=raw_anomalies, checks=json.dumps(checks, sort_keys=True),
            anomalies=types.Channel(type=standard_artifacts.ExampleAnomalies)))
