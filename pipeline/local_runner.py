"""Runs the pipeline on this machine with TFX's LocalDagRunner and Beam's DirectRunner.

Layout under the output directory:
  * ``pipeline_root/``: every component's artifacts;
  * ``metadata.sqlite``: ML Metadata (unless a MySQL connection is given);
  * ``serving_model/<model_name>/<version>/``: pushed SavedModels (TF Serving layout), with
    ``models.config``, ``batching.config`` and ``kubernetes.yaml`` in ``serving_model/`` once a
    model is pushed;
  * ``default_corpus/``: the built-in corpus, when no corpus is given.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional, Sequence

from ml_metadata.proto import metadata_store_pb2
from tfx import v1 as tfx

from pipeline import corpus as corpus_lib
from pipeline import report
from pipeline.config import PIPELINE_NAME, PipelineConfig
from pipeline.pipeline import create_ingest_pipeline, create_pipeline
from serving import tf_serving

MYSQL_ENV = ("DEEPSEEK_TFX_MYSQL_HOST", "DEEPSEEK_TFX_MYSQL_PORT", "DEEPSEEK_TFX_MYSQL_DATABASE",
             "DEEPSEEK_TFX_MYSQL_USER", "DEEPSEEK_TFX_MYSQL_PASSWORD")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Paths of one local deployment, all under ``output``."""

    output: str
    model_name: str = PipelineConfig.model_name

    @property
    def pipeline_root(self) -> str:
        return os.path.join(self.output, "pipeline_root")

    @property
    def metadata_path(self) -> str:
        return os.path.join(self.output, "metadata.sqlite")

    @property
    def serving_model_dir(self) -> str:
        return os.path.join(self.output, "serving_model", self.model_name)

    @property
    def default_corpus_dir(self) -> str:
        return os.path.join(self.output, "default_corpus")


IN_MEMORY_BELOW_BYTES = 64 << 20
"""Corpora smaller than this run the DirectRunner in memory (see default_beam_args)."""


def default_beam_args(corpus_bytes: Optional[int] = None) -> list[str]:
    """DirectRunner options for a corpus of ``corpus_bytes`` (None: unknown, e.g. on a bucket).

    Small corpora run in memory: worker start-up (each multi-processing worker
    imports TensorFlow and TFX) dominates, and a whole tiny-preset run on 80 KB
    measured 100.8 s in memory against 192.0 s with two worker processes. Larger
    ones run in multi-processing mode with one worker per core. ``--beam-arg``
    overrides either.
    """
    if corpus_bytes is not None and corpus_bytes < IN_MEMORY_BELOW_BYTES:
        return ["--runner=DirectRunner", "--direct_running_mode=in_memory", "--direct_num_workers=1"]
    return ["--runner=DirectRunner", "--direct_running_mode=multi_processing",
            f"--direct_num_workers={os.cpu_count() or 1}"]


def sqlite_connection(path: str) -> metadata_store_pb2.ConnectionConfig:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return tfx.orchestration.metadata.sqlite_metadata_connection_config(path)


def mysql_connection(env: dict) -> metadata_store_pb2.ConnectionConfig:
    """MySQL connection from DEEPSEEK_TFX_MYSQL_{HOST,PORT,DATABASE,USER,PASSWORD}."""
    missing = [k for k in MYSQL_ENV[:4] if not env.get(k)]
    if missing:
        raise ValueError(f"--metadata mysql needs the environment variables {missing}")
    config = metadata_store_pb2.ConnectionConfig()
    config.mysql.host = env["DEEPSEEK_TFX_MYSQL_HOST"]
    config.mysql.port = int(env["DEEPSEEK_TFX_MYSQL_PORT"])
    config.mysql.database = env["DEEPSEEK_TFX_MYSQL_DATABASE"]
    config.mysql.user = env["DEEPSEEK_TFX_MYSQL_USER"]
    config.mysql.password = env.get("DEEPSEEK_TFX_MYSQL_PASSWORD", "")
    return config


def backfill_spans(*, pipeline_name: str, pipeline_root: str, base: str, pattern: str, config: PipelineConfig,
                   metadata: metadata_store_pb2.ConnectionConfig, beam_args: Sequence[str]) -> list[int]:
    """Reads the spans of the ``last_spans`` window that no run has read yet; returns their numbers.

    The window is the span numbers newest-N+1 .. newest-1 found as ``span-<N>``
    directories under ``base`` (the newest span is read by the run itself).
    Each missing span runs ExampleGen and the data checks (create_ingest_pipeline),
    so its Examples are in ML Metadata, validated, before the span-window resolver looks.
    """
    spans = corpus_lib.span_numbers(base) if "{SPAN}" in pattern else []
    if config.last_spans <= 1 or not spans:
        return []
    newest = spans[-1]
    window = [s for s in spans if newest - config.last_spans < s < newest]
    done = report.ingested_spans(report.open_store(metadata), pipeline_name) if window else set()
    missing = [s for s in window if s not in done]
    for span in missing:
        tfx.orchestration.LocalDagRunner().run(create_ingest_pipeline(
            pipeline_name=pipeline_name, pipeline_root=pipeline_root, corpus_base=base, corpus_pattern=pattern,
            span=span, config=config, metadata_connection_config=metadata, beam_pipeline_args=beam_args))
    return missing


def run(
    *,
    output: str,
    config: PipelineConfig,
    corpus: Optional[str] = None,
    beam_args: Sequence[str] = (),
    metadata: Optional[metadata_store_pb2.ConnectionConfig] = None,
    pipeline_name: str = PIPELINE_NAME,
) -> dict:
    """Checks the corpus, runs the whole pipeline, and returns the MLMD run summary.

    Raises:
        components.text_corpus.CorpusError: the corpus cannot produce documents
            (raised before any component runs).
    """
    output = os.path.abspath(output)
    layout = Layout(output, config.model_name)
    if corpus is None:
        corpus = corpus_lib.write_default_corpus(layout.default_corpus_dir)
    base, pattern = corpus_lib.resolve(os.path.abspath(corpus) if "://" not in corpus else corpus)
    files, _ = corpus_lib.check(base, pattern)
    corpus_bytes = sum(os.path.getsize(f) for f in files) if "://" not in base else None
    metadata = metadata or sqlite_connection(layout.metadata_path)
    beam_args = [*default_beam_args(corpus_bytes), *beam_args]
    backfill_spans(pipeline_name=pipeline_name, pipeline_root=layout.pipeline_root, base=base, pattern=pattern,
                   config=config, metadata=metadata, beam_args=beam_args)
    pipeline = create_pipeline(
        pipeline_name=pipeline_name,
        pipeline_root=layout.pipeline_root,
        corpus_base=base,
        corpus_pattern=pattern,
        serving_model_dir=layout.serving_model_dir,
        config=config,
        metadata_connection_config=metadata,
        beam_pipeline_args=beam_args,
    )
    tfx.orchestration.LocalDagRunner().run(pipeline)
    summary = report.run_summary(report.open_store(metadata), pipeline_name)
    summary["corpus"] = os.path.join(base, pattern)
    if summary.get("pushed_model_path"):
        configs = tf_serving.write_configs(os.path.dirname(layout.serving_model_dir), config.model_name)
        summary["serve_command"] = configs.pop("docker")
        summary["serving_configs"] = configs
    if metadata.HasField("sqlite"):
        summary["metadata"] = metadata.sqlite.filename_uri
    else:
        summary["metadata"] = f"mysql://{metadata.mysql.host}:{metadata.mysql.port}/{metadata.mysql.database}"
    return summary
