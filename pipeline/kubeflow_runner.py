"""Compiles the pipeline for Vertex AI Pipelines or Kubeflow Pipelines, and submits or schedules it.

Compilation uses TFX's ``KubeflowV2DagRunner`` on the same ``create_pipeline``
as the local runner, with the resolvers that compile there (see
``create_pipeline(portable_resolvers=True)``): a PipelineJob JSON for Vertex, the
pipeline spec as YAML for Kubeflow Pipelines (v2 backend). Submission goes
through the engines' own clients, passed in so that they can be replaced:
``google.cloud.aiplatform`` (``PipelineJob.submit`` / ``create_schedule``) and
``kfp.Client`` (``create_run_from_pipeline_package`` / ``create_recurring_run``).

kfp itself is not in this project's pinned environment: every kfp 2 release
needs protobuf >= 4.21, and tensorflow-metadata 1.16 on Python 3.10 needs
protobuf < 4.21. Compiling needs only ``kfp-pipeline-spec`` (pinned). Submitting
to Kubeflow needs ``pip install 'kfp>=2,<3'`` in a separate environment (or on
Python 3.11), or the ``kfp`` CLI with the compiled YAML.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

import yaml
from tfx import v1 as tfx

from deepseek_tfx.components.tokenizer_consumers import vertex_training_config
from deepseek_tfx.pipeline.config import PIPELINE_NAME, ConfigError, PipelineConfig
from deepseek_tfx.pipeline.pipeline import create_pipeline

ENGINES = ("vertex", "kubeflow")


@dataclasses.dataclass(frozen=True)
class RemoteLayout:
    """Paths of one Vertex / Kubeflow deployment, under ``pipeline_root`` (mirrors local_runner.Layout).

    ``serving_dir`` overrides the Pusher's destination (default ``PIPELINE_ROOT/serving_model/<model_name>``).
    """

    pipeline_root: str
    model_name: str = PipelineConfig.model_name
    serving_dir: str | None = None

    @property
    def root(self) -> str:
        return self.pipeline_root.rstrip("/")

    @property
    def serving_model_dir(self) -> str:
        return self.serving_dir or f"{self.root}/serving_model/{self.model_name}"

    @property
    def temp_location(self) -> str:
        """Dataflow's temp and staging location."""
        return f"{self.root}/tmp"


def dataflow_beam_args(project: str, region: str, temp_location: str, image: str) -> list[str]:
    """Beam options that run the data components on Dataflow with the pipeline image as SDK container."""
    return ["--runner=DataflowRunner", f"--project={project}", f"--region={region}",
            f"--temp_location={temp_location}", f"--sdk_container_image={image}",
            "--experiments=use_runner_v2"]


def build_pipeline(*, image: str, pipeline_root: str, corpus: str, corpus_pattern: str, config: PipelineConfig,
                   serving_dir: str | None = None, beam_args: Sequence[str] = (),
                   vertex_training_replicas: int | None = None, vertex_machine_type: str | None = None,
                   vertex_accelerator_type: str | None = None, vertex_accelerator_count: int = 0,
                   dataflow: bool = False,
                   project: str | None = None, region: str | None = None,
                   pipeline_name: str = PIPELINE_NAME, eval_corpus: str | None = None):
    """The pipeline as it compiles for Vertex AI / Kubeflow Pipelines (portable resolvers, remote paths).

    Args:
        image: the pipeline image (see the Dockerfile) every step runs in.
        pipeline_root: where the engine writes artifacts (e.g. gs://bucket/root).
        corpus: directory (e.g. gs://bucket/corpus) the pattern is relative to; it is read
            when the pipeline runs, not now.
        corpus_pattern: glob under ``corpus``; ``span-{SPAN}/*`` (the default on the command
            line) selects the latest span at each run, as locally.
        serving_dir: the Pusher's destination, ``<serving_dir>/<numeric version>/`` (default: RemoteLayout's).
        beam_args: extra Beam options (after the Dataflow ones, so they win).
        vertex_training_replicas: train as a Vertex AI custom job with this many replicas.
        vertex_machine_type, vertex_accelerator_type, vertex_accelerator_count: each replica's machine and
            accelerators (see vertex_training_config); only with ``vertex_training_replicas``.
        dataflow: run the Beam-based components on Dataflow.
        project, region: Google Cloud project and region (needed by the two options above).
        eval_corpus: a directory (e.g. gs://bucket/reference) whose files are the Evaluator's fixed reference eval
            set, read whole by ReferenceExampleGen (create_pipeline's ``eval_corpus``); the default reference,
            the first blessed run's data, needs a resolver that does not compile here.

    Raises:
        ConfigError: a cloud option without ``project`` and ``region``.
    """
    if (vertex_training_replicas is not None or dataflow) and not (project and region):
        raise ConfigError("--vertex-training-replicas and --dataflow need --project and --region")
    machine_options = (vertex_machine_type, vertex_accelerator_type, vertex_accelerator_count)
    if vertex_training_replicas is None and any(machine_options):
        raise ConfigError("--vertex-machine-type and --vertex-accelerator-* describe the Vertex AI training job: "
                          "they need --vertex-training-replicas")
    layout = RemoteLayout(pipeline_root, config.model_name, serving_dir)
    vertex = (vertex_training_config(project, region, image, vertex_training_replicas, vertex_machine_type,
                                     vertex_accelerator_type, vertex_accelerator_count)
              if vertex_training_replicas is not None else None)
    beam = [*(dataflow_beam_args(project, region, layout.temp_location, image) if dataflow else []), *beam_args]
    return create_pipeline(
        pipeline_name=pipeline_name, pipeline_root=pipeline_root, corpus_base=runtime_parameter("corpus", corpus),
        corpus_pattern=corpus_pattern, serving_model_dir=layout.serving_model_dir, config=config,
        beam_pipeline_args=beam, portable_resolvers=True, vertex_training=vertex,
        eval_corpus=(eval_corpus.rstrip("/"), "*") if eval_corpus else None,
        # Runtime parameters with the compiled values as defaults (0: the compiled bound). TFX 1.16 takes one only
        # as a plain parameter of a component, not inside a proto: the corpus pattern (in ExampleGen's
        # input_config) is fixed here, and the steps and bounds are parameters of their own (README).
        runtime={"train_steps": runtime_parameter("train_steps", config.resolved_train_steps),
                 "max_bits_per_byte": runtime_parameter("max_bits_per_byte", 0.0),
                 "max_perplexity": runtime_parameter("max_perplexity", 0.0)})



def runtime_defaults(pipeline) -> dict:
    """Each RuntimeParameter of ``pipeline``'s components by name, with its default."""
    return {value.name: value.default for component in pipeline.components
            for value in component.exec_properties.values()
            if isinstance(value, tfx.dsl.experimental.RuntimeParameter)}


def runtime_parameter(name: str, default):
    """A TFX RuntimeParameter named ``name`` with the type and default of ``default``."""
    return tfx.dsl.experimental.RuntimeParameter(name=name, ptype=type(default), default=default)


def dag_runner(image: str, output_filename: str | None = None):
    """TFX's KubeflowV2DagRunner with the pipeline image as every step's image."""
    return tfx.orchestration.experimental.KubeflowV2DagRunner(
        config=tfx.orchestration.experimental.KubeflowV2DagRunnerConfig(default_image=image),
        output_filename=output_filename)


def compile_pipeline(*, engine: str, image: str, output: str | None = None,
                     pipeline_name: str = PIPELINE_NAME, **options) -> str:
    """Compiles the pipeline for ``engine``; writes it to ``output`` and returns its path.

    Args:
        engine: ``vertex`` (PipelineJob JSON) or ``kubeflow`` (pipeline spec YAML).
        image: the pipeline image (see the Dockerfile) every step runs in.
        output: the file to write (default: ``<pipeline name>.json`` or ``.yaml``).
        **options: the rest of ``build_pipeline``'s arguments.

    Raises:
        ConfigError: an unknown engine, or as ``build_pipeline``.
    """
    if engine not in ENGINES:
        raise ConfigError(f"--engine must be one of {ENGINES}, got {engine!r}")
    pipeline = build_pipeline(image=image, pipeline_name=pipeline_name, **options)
    output = output or f"{pipeline_name}.{'json' if engine == 'vertex' else 'yaml'}"
    defaults = runtime_defaults(pipeline)
    job = dag_runner(image).run(pipeline, parameter_values=defaults, write_out=False)
    # The defaults also go into the spec itself, so the Kubeflow YAML (the spec alone) carries them too.
    for name, spec in job["pipelineSpec"]["root"].get("inputDefinitions", {}).get("parameters", {}).items():
        spec["defaultValue"] = defaults[name]
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w", encoding="utf-8") as f:
        if engine == "vertex":
            json.dump(job, f, indent=2, sort_keys=True)
        else:
            yaml.safe_dump(job["pipelineSpec"], f, sort_keys=False)
    return output


def submit_vertex(package: str, *, project: str, region: str, pipeline_root: str,
                  schedule: str | None = None, aiplatform: Any = None,
                  display_name: str = PIPELINE_NAME) -> Any:
    """Runs (or, with a cron ``schedule``, schedules) a compiled PipelineJob on Vertex AI Pipelines."""
    if aiplatform is None:
        from google.cloud import aiplatform  # noqa: PLC0415
    aiplatform.init(project=project, location=region)
    job = aiplatform.PipelineJob(display_name=display_name, template_path=package, pipeline_root=pipeline_root,
                                 enable_caching=True)
    if schedule:
        return job.create_schedule(cron=schedule, display_name=f"{display_name}-schedule")
    job.submit()
    return job


def submit_kubeflow(package: str, *, host: str, schedule: str | None = None, client_factory: Any = None,
                    experiment: str = PIPELINE_NAME, run_name: str = PIPELINE_NAME) -> Any:
    """Runs (or, with a cron ``schedule``, schedules) a compiled pipeline on Kubeflow Pipelines."""
    if client_factory is None:
        # `from kfp import Client`, not `kfp.Client`: the pinned kfp-pipeline-spec leaves an empty `kfp` namespace
        # package, where the import succeeds and only the attribute is missing; this way both cases are ImportError.
        try:
            from kfp import Client  # noqa: PLC0415
        except ImportError as e:
            raise RuntimeError(
                "submitting to Kubeflow needs kfp>=2, which cannot share this environment with TFX 1.16 on "
                "Python 3.10 (protobuf pins); install it elsewhere and run `kfp run create` with the compiled "
                f"package {package}") from e
        client_factory = Client
    client = client_factory(host=host)
    if schedule:
        experiment_id = client.create_experiment(name=experiment).experiment_id
        # KFP's cron has six fields (seconds first); a five-field cron gets "0" seconds.
        cron = schedule if len(schedule.split()) == 6 else f"0 {schedule}"
        return client.create_recurring_run(experiment_id=experiment_id, job_name=f"{run_name}-schedule",
                                           cron_expression=cron, pipeline_package_path=package)
    return client.create_run_from_pipeline_package(package, arguments={}, run_name=run_name,
                                                   experiment_name=experiment, enable_caching=True)
