"""TextExampleGen: a FileBasedExampleGen that turns a text corpus into tf.Examples.

Each output example has one bytes feature, ``text``: a document (or a chunk of a
long one), UTF-8. Reading rules (formats, blank-line splitting, chunking, binary
and invalid-UTF-8 handling) are in ``components.text_corpus``.

Train/eval splitting is the standard ExampleGen hash partition of each serialized
example, so it is deterministic for a given corpus. Spans work as in every
FileBasedExampleGen: an input pattern with ``{SPAN}`` makes each new data drop a
new span.

Besides the standard ``split_names``, the output Examples artifact carries what
was read as custom properties (``corpus_files``, ``corpus_documents``,
``corpus_bytes``, ``corpus_replaced_invalid_utf8``, ...) and the same figures in
``corpus_summary.json`` at its root.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
from typing import Any

import apache_beam as beam
import tensorflow as tf
from tfx.components.example_gen import base_example_gen_executor
from tfx.components.example_gen.component import FileBasedExampleGen
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.proto import example_gen_pb2, range_config_pb2
from tfx.types import artifact_utils, channel, standard_artifacts, standard_component_specs
from tfx.types.component_spec import ExecutionParameter
from tfx.utils import proto_utils

from deepseek_tfx.components import text_corpus

log = logging.getLogger(__name__)
TEXT_FEATURE = "text"
SUMMARY_FILE = "corpus_summary.json"
MAX_DOCUMENT_CHARS_KEY = "max_document_chars"
TEXT_FIELD_KEY = "text_field"
MAX_LINE_BYTES_KEY = "max_line_bytes"
REQUIRE_EVERY_SPLIT_KEY = "require_every_split"
_SUMMARY_PATH_KEY = "_corpus_summary_path"
_SUMMARY_COUNTS = ("files", "skipped_files", "documents", "chunked_documents", "bytes",
                   "replaced_invalid_utf8")
_MAX_FILES_LISTED = 100


def text_to_example(text: str) -> bytes:
    """Serializes one document as a tf.Example with a ``text`` bytes feature."""
    example = tf.train.Example()
    example.features.feature[TEXT_FEATURE].bytes_list.value.append(text.encode("utf-8"))
    return example.SerializeToString(deterministic=True)


class _ReadFile(beam.DoFn):
    """File path -> serialized examples, plus one stats dict on the 'stats' output."""

    def __init__(self, max_document_chars: int, text_field: str, max_line_bytes: int):
        self._max_document_chars = max_document_chars
        self._text_field = text_field
        self._max_line_bytes = max_line_bytes

    def process(self, path: str):
        stats = text_corpus.FileStats(path=path)
        for doc in text_corpus.read_documents(path, stats, self._max_document_chars,
                                              self._text_field, self._max_line_bytes):
            yield text_to_example(doc)
        if stats.replaced_invalid_utf8:
            log.warning("%s: replaced %d invalid UTF-8 byte sequence(s) with U+FFFD",
                            path, stats.replaced_invalid_utf8)
        if stats.chunked_documents:
            log.info("%s: split %d long document(s) into chunks of at most %d characters",
                         path, stats.chunked_documents, self._max_document_chars)
        yield beam.pvalue.TaggedOutput("stats", dataclasses.asdict(stats))


class _MergeStats(beam.CombineFn):
    def create_accumulator(self):
        return {"files": 0, "documents": 0, "chunked_documents": 0, "bytes": 0,
                "replaced_invalid_utf8": 0, "files_with_invalid_utf8": []}

    def add_input(self, acc, stats):
        acc["files"] += 1
        for key in ("documents", "chunked_documents", "bytes", "replaced_invalid_utf8"):
            acc[key] += stats[key]
        if stats["replaced_invalid_utf8"] and len(acc["files_with_invalid_utf8"]) < _MAX_FILES_LISTED:
            acc["files_with_invalid_utf8"].append(stats["path"])
        return acc

    def merge_accumulators(self, accs):
        out = self.create_accumulator()
        for acc in accs:
            for key in ("files", "documents", "chunked_documents", "bytes", "replaced_invalid_utf8"):
                out[key] += acc[key]
            out["files_with_invalid_utf8"].extend(acc["files_with_invalid_utf8"])
        out["files_with_invalid_utf8"] = sorted(out["files_with_invalid_utf8"])[:_MAX_FILES_LISTED]
        return out

    def extract_output(self, acc):
        return acc


def _write_summary(summary: dict, path: str, pattern: str, skipped: list[str]) -> None:
    if summary["documents"] == 0:
        raise text_corpus.CorpusError(
            f"no documents in corpus {pattern!r}: its {summary['files']} text file(s) are empty "
            "or whitespace only")
    summary = {**summary, "pattern": pattern, "skipped_files": len(skipped),
               "skipped_file_names": skipped[:_MAX_FILES_LISTED]}
    with tf.io.gfile.GFile(path, "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    log.info("Corpus %s: %d file(s), %d document(s), %d bytes, %d invalid UTF-8 replaced",
                 pattern, summary["files"], summary["documents"], summary["bytes"],
                 summary["replaced_invalid_utf8"])


@beam.ptransform_fn
@beam.typehints.with_input_types(beam.Pipeline)
@beam.typehints.with_output_types(bytes)
def _TextToExample(pipeline: beam.Pipeline, exec_properties: dict[str, Any],  # noqa: N802
                   split_pattern: str) -> beam.pvalue.PCollection:
    pattern = os.path.join(exec_properties[standard_component_specs.INPUT_BASE_KEY], split_pattern)
    files, skipped = text_corpus.list_corpus_files(pattern)
    for path in skipped[:_MAX_FILES_LISTED]:
        log.warning("Skipping %s: not a supported text file (%s)", path,
                        ", ".join(text_corpus.SUPPORTED_SUFFIXES))
    results = (
        pipeline
        | "ListFiles" >> beam.Create(files)
        | "SpreadFiles" >> beam.Reshuffle()
        | "ReadDocuments" >> beam.ParDo(_ReadFile(
            exec_properties[MAX_DOCUMENT_CHARS_KEY], exec_properties[TEXT_FIELD_KEY],
            exec_properties.get(MAX_LINE_BYTES_KEY) or text_corpus.MAX_LINE_BYTES)
        ).with_outputs("stats", main="examples"))
    _ = (results.stats
         | "MergeStats" >> beam.CombineGlobally(_MergeStats())
         | "WriteSummary" >> beam.Map(_write_summary, exec_properties[_SUMMARY_PATH_KEY],
                                      pattern, skipped))
    return results.examples


def _split_is_empty(examples_uri: str, split: str) -> bool:
    files = tf.io.gfile.glob(os.path.join(examples_uri, f"Split-{split}", "*"))
    return not files or not any(True for _ in tf.data.TFRecordDataset(files, compression_type="GZIP").take(1))


def _check_splits_not_empty(examples_uri: str, exec_properties: dict, documents: int) -> None:
    """A corpus too small to put a document in every split fails here, with what is needed.

    (Downstream, an empty eval split would fail Transform with a bare ``KeyError: 'text'``.)
    """
    output_config = example_gen_pb2.Output()
    proto_utils.json_to_proto(exec_properties[standard_component_specs.OUTPUT_CONFIG_KEY], output_config)
    splits = output_config.split_config.splits
    total = sum(s.hash_buckets for s in splits)
    for split in splits:
        if _split_is_empty(examples_uri, split.name):
            share = split.hash_buckets / total
            other = "a larger" if split.name == "eval" else "a smaller"
            raise text_corpus.CorpusError(
                f"the corpus is too small: its {documents} document(s) left the {split.name!r} split empty "
                f"(it takes {share:.0%} of the documents by a hash of their text); give it at least "
                f"about {math.ceil(3 / share)} documents (paragraphs separated by blank lines, or .jsonl records), "
                f"or {other} --eval-fraction")


class Executor(base_example_gen_executor.BaseExampleGenExecutor):
    """Beam executor of TextExampleGen; records corpus figures on the Examples artifact."""

    def GetInputSourceToExamplePTransform(self) -> beam.PTransform:  # noqa: N802
        return _TextToExample

    def Do(self, input_dict, output_dict, exec_properties) -> None:  # noqa: N802
        examples = artifact_utils.get_single_instance(
            output_dict[standard_component_specs.EXAMPLES_KEY])
        summary_path = os.path.join(examples.uri, SUMMARY_FILE)
        exec_properties = {**exec_properties, _SUMMARY_PATH_KEY: summary_path}
        super().Do(input_dict, output_dict, exec_properties)
        with tf.io.gfile.GFile(summary_path) as f:
            summary = json.load(f)
        if exec_properties.get(REQUIRE_EVERY_SPLIT_KEY, 1):
            _check_splits_not_empty(examples.uri, exec_properties, summary["documents"])
        for key in _SUMMARY_COUNTS:
            examples.set_int_custom_property(f"corpus_{key}", int(summary[key]))
        examples.set_string_custom_property("corpus_pattern", summary["pattern"])


class TextExampleGenSpec(standard_component_specs.FileBasedExampleGenSpec):
    """FileBasedExampleGen's spec plus the text reader's parameters."""

    PARAMETERS = {
        **standard_component_specs.FileBasedExampleGenSpec.PARAMETERS,
        MAX_DOCUMENT_CHARS_KEY: ExecutionParameter(type=int),
        TEXT_FIELD_KEY: ExecutionParameter(type=str),
        MAX_LINE_BYTES_KEY: ExecutionParameter(type=int, optional=True),
        REQUIRE_EVERY_SPLIT_KEY: ExecutionParameter(type=int, optional=True),
    }


class TextExampleGen(FileBasedExampleGen):
    """Reads .txt/.md/.rst/.jsonl (optionally gzipped) files into train/eval tf.Examples.

    Args:
        input_base: directory the input pattern is relative to.
        input_pattern: glob under ``input_base``; may contain ``{SPAN}`` (and ``{VERSION}``).
        eval_fraction: share of documents hashed into the ``eval`` split.
        max_document_chars: longer documents are split into chunks of at most this size.
        text_field: field holding the text in ``.jsonl`` records.
        max_line_bytes: lines are read in pieces of at most this many bytes (text_corpus.read_documents).
        require_every_split: fail when a split is left empty (off where the splits of several spans are used
            together, as with a span window).
        range_config: optional span range (default: the latest span).
        single_split: put every document in this one split instead of hashing into train/eval (a reference
            eval corpus: ``"eval"``).
    """

    SPEC_CLASS = TextExampleGenSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(Executor)

    def __init__(self, input_base: str, input_pattern: str = "*", eval_fraction: float = 0.1,
                 max_document_chars: int = 4096, text_field: str = "text",
                 max_line_bytes: int = text_corpus.MAX_LINE_BYTES, require_every_split: bool = True,
                 range_config: range_config_pb2.RangeConfig | None = None, single_split: str | None = None):
        if not 0.0 < eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be within (0, 1), got {eval_fraction}")
        if max_document_chars < 64:
            raise ValueError(f"max_document_chars must be >= 64, got {max_document_chars}")
        eval_buckets = max(1, round(1000 * eval_fraction))
        input_config = example_gen_pb2.Input(splits=[
            example_gen_pb2.Input.Split(name=single_split or "single_split", pattern=input_pattern)])
        output_config = example_gen_pb2.Output() if single_split else example_gen_pb2.Output(  # input's split
            split_config=example_gen_pb2.SplitConfig(splits=[
                example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=1000 - eval_buckets),
                example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=eval_buckets),
            ]))
        spec = TextExampleGenSpec(
            input_base=input_base,
            input_config=input_config,
            output_config=output_config,
            custom_config=None,
            range_config=range_config,
            output_data_format=example_gen_pb2.FORMAT_TF_EXAMPLE,
            output_file_format=example_gen_pb2.FORMAT_TFRECORDS_GZIP,
            examples=channel.Channel(type=standard_artifacts.Examples),
            max_document_chars=max_document_chars,
            text_field=text_field,
            max_line_bytes=max_line_bytes,
            require_every_split=int(require_every_split),
        )
        # FileBasedExampleGen.__init__ builds its own spec; ours extends it, so
        # initialise the Beam component base directly.
        base_beam_component.BaseBeamComponent.__init__(self, spec=spec)
