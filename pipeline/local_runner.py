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

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Sequence

import tensorflow as tf
from ml_metadata.proto import metadata_store_pb2
from tfx import v1 as tfx
from tfx.dsl.compiler import compiler
from tfx.dsl.compiler.constants import PIPELINE_RUN_ID_PARAMETER_NAME
from tfx.orchestration.portable import runtime_parameter_utils

from deepseek_tfx.components import data_checks, mlmd
from deepseek_tfx.components.text_corpus import CorpusError
from deepseek_tfx.pipeline import corpus as corpus_lib
from deepseek_tfx.pipeline import console, report, run_lock, settings
from deepseek_tfx.pipeline import schema as schema_lib
from deepseek_tfx.pipeline.config import DATA_CHECKS, EXAMPLE_GEN, PIPELINE_NAME, PipelineConfig
from deepseek_tfx.pipeline.pipeline import create_ingest_pipeline, create_pipeline
from deepseek_tfx.serving import tf_serving

log = logging.getLogger(__name__)

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
    def schema_dir(self) -> str:
        """The pipeline's frozen schema (pipeline.schema)."""
        return os.path.join(self.output, "schema")

    @property
    def default_corpus_dir(self) -> str:
        return os.path.join(self.output, "default_corpus")


IN_MEMORY_BELOW_BYTES = 64 << 20
"""Corpora smaller than this run the DirectRunner in memory (see default_beam_args)."""


def default_beam_args(corpus_bytes: int | None = None) -> list[str]:
    """DirectRunner options for a corpus of ``corpus_bytes`` (None: unknown, e.g. on a bucket).

    Small corpora run in memory: worker start-up (each multi-processing worker
    imports TensorFlow and TFX) dominates small runs (BENCHMARKS.md, "The README's
    run command"). Larger
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
    try:
        config.mysql.port = int(env["DEEPSEEK_TFX_MYSQL_PORT"])
    except ValueError:
        raise ValueError(f"DEEPSEEK_TFX_MYSQL_PORT must be a port number, got {env['DEEPSEEK_TFX_MYSQL_PORT']!r}"
                         ) from None
    config.mysql.database = env["DEEPSEEK_TFX_MYSQL_DATABASE"]
    config.mysql.user = env["DEEPSEEK_TFX_MYSQL_USER"]
    config.mysql.password = env.get("DEEPSEEK_TFX_MYSQL_PASSWORD", "")
    return config


def is_remote(path: str) -> bool:
    """Whether ``path`` is a URI on another filesystem (``gs://bucket/out``) rather than a local path."""
    return "://" in path


def absolute(path: str) -> str:
    """A local path made absolute; a URI (``gs://bucket/out``) left as it is, never turned into a local path."""
    return path if is_remote(path) else os.path.abspath(path)


def metadata_connection(kind: str, output: str, env: dict) -> metadata_store_pb2.ConnectionConfig:
    """The ML Metadata store of ``--metadata kind``: OUTPUT/metadata.sqlite, or MySQL from ``env``.

    Raises:
        ValueError: SQLite asked for with a remote output (SQLite needs a local file), or MySQL variables
            missing or malformed (named).
    """
    if kind == "mysql":
        return mysql_connection(env)
    if is_remote(output):
        raise ValueError(f"--metadata sqlite keeps ML Metadata in OUTPUT/metadata.sqlite, a local file, which "
                         f"cannot live on {output}: use --metadata mysql with a remote --output")
    return sqlite_connection(Layout(absolute(output)).metadata_path)


def require_spans(corpus: str) -> None:
    """Retraining's precondition: a corpus laid out in ``span-N`` directories.

    Raises:
        CorpusError: no ``span-N`` directory under ``corpus``.
    """
    if not corpus_lib.span_numbers(corpus):
        raise CorpusError(f"retrain needs a corpus laid out in spans ({corpus}/span-1/, span-2/, ...); "
                          "found no span-N directory")


def remove_finished_checkpoints(store, pipeline_name: str) -> list[str]:
    """Deletes the checkpoint directories of finished Trainer executions; returns those it deleted."""
    removed = []
    for directory in report.finished_trainer_checkpoints(store, pipeline_name):
        try:
            if tf.io.gfile.exists(directory):
                tf.io.gfile.rmtree(directory)
                removed.append(directory)
                log.info("Removed the checkpoints of a finished training: %s", directory)
        except (OSError, tf.errors.OpError) as e:  # the model is pushed: a leftover directory is no failure
            log.warning("Could not remove the checkpoints in %s: %s", directory, e)
    return removed


def retain_pushed_versions(store, serving_model_dir: str, keep: int, pinned: int | None = None) -> list[int]:
    """Deletes the versions this pipeline pushed beyond the newest ``keep``; returns the deleted versions.

    Only versions recorded in ML Metadata as pushed (PushedModel artifacts) to ``serving_model_dir`` are
    candidates: a directory pushed by hand or by another pipeline (an operator's rollback target) and the
    ``pinned`` version always stay. ``keep`` 0 keeps everything.
    """
    if keep <= 0:
        return []
    ours = set()
    for pushed in mlmd.pushed_models(store):
        path = str(mlmd.prop(pushed, mlmd.PUSHED_DESTINATION_PROPERTY, "")).rstrip("/")
        version = str(mlmd.prop(pushed, mlmd.PUSHED_VERSION_PROPERTY, ""))
        if version.isdigit() and os.path.dirname(path) == serving_model_dir.rstrip("/"):
            ours.add(int(version))
    present = [v for v in sorted(ours) if tf.io.gfile.exists(os.path.join(serving_model_dir, str(v)))]
    removed = []
    for version in present[:-keep]:
        if version == pinned:
            continue
        tf.io.gfile.rmtree(os.path.join(serving_model_dir, str(version)))
        removed.append(version)
        log.info("Retention (keep %d): removed pushed version %d", keep, version)
    return removed


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
    done = mlmd.ingested_spans(mlmd.open_store(metadata), pipeline_name, EXAMPLE_GEN) if window else set()
    missing = [s for s in window if s not in done]
    for span in missing:
        tfx.orchestration.LocalDagRunner().run(create_ingest_pipeline(
            pipeline_name=pipeline_name, pipeline_root=pipeline_root, corpus_base=base, corpus_pattern=pattern,
            span=span, config=config, metadata_connection_config=metadata, beam_pipeline_args=beam_args))
    return missing


@dataclasses.dataclass(frozen=True)
class LocalRun:
    """A pipeline ready for LocalDagRunner, with where it reads and writes (see ``prepare``)."""

    pipeline: tfx.dsl.Pipeline
    config: PipelineConfig
    layout: Layout
    corpus_base: str
    corpus_pattern: str
    metadata: metadata_store_pb2.ConnectionConfig
    beam_args: list[str]

    @property
    def corpus(self) -> str:
        return os.path.join(self.corpus_base, self.corpus_pattern)


def docker_reachable(timeout: float = 5.0) -> tuple[bool, str]:
    """Whether a Docker engine answers here (InfraValidator starts TF Serving in it), and why not."""
    try:
        import docker  # noqa: PLC0415  (tfx's dependency; only this check needs it)
    except ImportError:
        return False, "the docker Python package is not installed"
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        docker.from_env(timeout=timeout).ping()
    except Exception as e:  # DockerException, connection refused, permission denied: all mean "not usable"
        return False, f"no Docker engine answers at {where} ({type(e).__name__})"
    return True, f"Docker engine at {where}"


def prepare(
    *,
    output: str,
    config: PipelineConfig,
    corpus: str | None = None,
    beam_args: Sequence[str] = (),
    metadata: metadata_store_pb2.ConnectionConfig | None = None,
    pipeline_name: str = PIPELINE_NAME,
    infra_validation: bool | None = None,
    eval_corpus: str | None = None,
) -> LocalRun:
    """Checks the corpus (writing the built-in one when none is given) and builds the pipeline.

    The Beam mode is chosen by the corpus size (default_beam_args); ``beam_args`` come after, so they win.
    TFX's InfraValidator runs before the Pusher when a Docker engine answers (``infra_validation`` None:
    docker_reachable decides, and a skip is logged with its reason). ``eval_corpus`` (checked like the corpus)
    is the Evaluator's fixed reference eval set (create_pipeline's ``eval_corpus``).

    Raises:
        components.text_corpus.CorpusError: the corpus cannot produce documents.
    """
    layout = Layout(absolute(output), config.model_name)
    if corpus is None:
        corpus = corpus_lib.write_default_corpus(layout.default_corpus_dir)
    base, pattern = corpus_lib.resolve(absolute(corpus))
    files, _ = corpus_lib.check(base, pattern)
    reference = None
    if eval_corpus is not None:
        try:
            reference = corpus_lib.resolve(absolute(eval_corpus))
            corpus_lib.check(*reference)
        except CorpusError as e:
            raise CorpusError(f"eval corpus: {e}") from None
    corpus_bytes = sum(corpus_lib.uncompressed_size(f) for f in files) if not is_remote(base) else None
    metadata = metadata or metadata_connection("sqlite", layout.output, {})
    beam_args = [*default_beam_args(corpus_bytes), *beam_args]
    if infra_validation is None:
        infra_validation, reason = docker_reachable()
        if not infra_validation:
            log.info("InfraValidator skipped: %s", reason)
    pipeline = create_pipeline(
        pipeline_name=pipeline_name,
        pipeline_root=layout.pipeline_root,
        corpus_base=base,
        corpus_pattern=pattern,
        serving_model_dir=layout.serving_model_dir,
        config=config,
        metadata_connection_config=metadata,
        beam_pipeline_args=beam_args,
        infra_validation=infra_validation,
        frozen_schema_dir=layout.schema_dir if schema_lib.is_frozen(layout.schema_dir) else None,
        eval_corpus=reference,
    )
    return LocalRun(pipeline, config, layout, base, pattern, metadata, beam_args)


def run(*, wait: bool = False, run_id: str | None = None, on_prepared=None, **options) -> dict:
    """Checks the corpus, runs the whole pipeline, and returns the MLMD run summary.

    ``options`` are prepare()'s keyword arguments (output, config, corpus, beam_args, metadata, pipeline_name).
    ``run_id`` names the run (default: console.new_run_id()); ``on_prepared(local_run)`` is called once the pipeline is
    built, before anything runs (the quiet console learns the components from it).
    The run holds the output directory's lock throughout (pipeline.run_lock), and on a MySQL store also the
    store's lock for the pipeline name: another run on the same output or pipeline raises RunLockedError at
    once, or is waited for with ``wait``.

    Spans of the ``last_spans`` window that no run has read are read first (backfill_spans).
    After a push, versions beyond ``keep_versions`` that this pipeline pushed are deleted
    (retain_pushed_versions) and TF Serving's configs are written beside the model directory.

    Raises:
        components.text_corpus.CorpusError: the corpus cannot produce documents
            (raised before any component runs).
    """
    output = absolute(options["output"])
    metadata = options.get("metadata")
    with contextlib.ExitStack() as locks:
        if not is_remote(output):
            locks.enter_context(run_lock.output_lock(output, wait=wait))
        if metadata is not None and metadata.HasField("mysql"):  # a store other outputs may share
            locks.enter_context(run_lock.store_lock(metadata.mysql, options.get("pipeline_name", PIPELINE_NAME),
                                                    wait=wait))
        local = prepare(**options)
        if on_prepared is not None:
            on_prepared(local)
        return _run(local, run_id or console.new_run_id())


def run_pipeline(pipeline: tfx.dsl.Pipeline, run_id: str | None = None) -> str:
    """Runs ``pipeline`` with LocalDagRunner under ``run_id`` (default: console.new_run_id()); returns that id.

    TFX names each run's ``pipeline_run`` context in ML Metadata after its run id; knowing it, the summary
    reads this run's executions, not the latest ones of whichever run (several runs can share a MySQL store).
    """
    run_id = run_id or console.new_run_id()
    ir = compiler.Compiler().compile(pipeline)
    runtime_parameter_utils.substitute_runtime_parameter(ir, {PIPELINE_RUN_ID_PARAMETER_NAME: run_id})
    tfx.orchestration.LocalDagRunner().run_with_ir(ir)
    return run_id


def _run(local: LocalRun, run_id: str) -> dict:
    pipeline_name, config = local.pipeline.pipeline_info.pipeline_name, local.config
    backfill_spans(pipeline_name=pipeline_name, pipeline_root=local.layout.pipeline_root, base=local.corpus_base,
                   pattern=local.corpus_pattern, config=config, metadata=local.metadata, beam_args=local.beam_args)
    try:
        run_pipeline(local.pipeline, run_id)
        failed_checks = None
    except Exception as e:  # the data checks stop a run by failing; any other failure is the caller's
        failed_checks = data_checks.DataChecksFailedError.reasons_in(e)
        if failed_checks is None:
            raise
        log.error("%s", e)
    store = mlmd.open_store(local.metadata)
    if failed_checks is not None:  # in ML Metadata, on the failed execution, for the summary and the report
        for execution in mlmd.run_executions(store, pipeline_name, DATA_CHECKS, run_id)[-1:]:
            execution.custom_properties[report.FAILED_CHECKS].string_value = json.dumps(failed_checks)
            store.put_executions([execution])
    summary = report.run_summary(store, pipeline_name, run_id)
    summary["corpus"] = local.corpus
    summary["config"] = {"preset": config.preset, "changed": settings.changes(config)}
    if summary.get("pushed_model_path"):
        serving_base = os.path.dirname(local.layout.serving_model_dir)
        try:
            pinned = tf_serving.pinned_version(serving_base, config.model_name)
        except tf_serving.PinError as e:  # the push happened; keep every version and the old configs
            log.error("Retention and TF Serving configs skipped: %s", e)
        else:
            summary["keep_versions"] = config.keep_versions
            summary["removed_versions"] = retain_pushed_versions(
                store, local.layout.serving_model_dir, config.keep_versions, pinned)
            configs = tf_serving.write_configs(serving_base, config.model_name, pinned)
            summary["serve_command"] = configs.pop("docker")
            summary["serving_configs"] = configs
        if config.data_checks.freeze_schema and not schema_lib.is_frozen(local.layout.schema_dir):
            schema_lib.freeze(store, local.layout.schema_dir, config.data_checks.range_margin)
            summary["schema_frozen_now"] = True
        if config.remove_checkpoints_after_push:
            summary["removed_checkpoints"] = remove_finished_checkpoints(store, pipeline_name)
    summary["schema"] = local.layout.schema_dir if schema_lib.is_frozen(local.layout.schema_dir) else None
    metadata = local.metadata
    if metadata.HasField("sqlite"):
        summary["metadata"] = metadata.sqlite.filename_uri
    else:
        summary["metadata"] = f"mysql://{metadata.mysql.host}:{metadata.mysql.port}/{metadata.mysql.database}"
    return summary
