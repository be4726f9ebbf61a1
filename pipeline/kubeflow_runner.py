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

import json
import os
from typing import Any, Optional, Sequence

from pipeline.config import PIPELINE_NAME, PipelineConfig
from pipeline.pipeline import create_pipeline

ENGINES = ("vertex", "kubeflow")


def dataflow_beam_args(project: str, region: str, temp_location: str, image: str) -> list[str]:
    """Beam options that run the data components on Dataflow with the pipeline image as SDK container."""
    return ["--runner=DataflowRunner", f"--project={project}", f"--region={region}",
            f"--temp_location={temp_location}", f"--sdk_container_image={image}",
            "--experiments=use_runner_v2"]


def compile_pipeline(*, engine: str, image: str, pipeline_root: str, corpus: str, corpus_pattern: str,
                     serving_dir: str,
                     config: PipelineConfig, output: Optional[str] = None,
                     beam_args: Sequence[str] = (), vertex_training: Optional[dict] = None,
                     pipeline_name: str = PIPELINE_NAME) -> str:
    """Compiles the pipeline for ``engine``; writes it to ``output`` and returns its path.

    Args:
        engine: ``vertex`` (PipelineJob JSON) or ``kubeflow`` (pipeline spec YAML).
        image: the pipeline image (see the Dockerfile) every step runs in.
        pipeline_root: where the engine writes artifacts (e.g. gs://bucket/root).
        corpus: directory (e.g. gs://bucket/corpus) the pattern is relative to; it is read
            when the pipeline runs, not now.
        corpus_pattern: glob under ``corpus``; ``span-{SPAN}/*`` (the default on the command
            line) selects the latest span at each run, as locally.
        serving_dir: the Pusher's destination, ``<serving_dir>/<numeric version>/``.
    """
    from tfx import v1 as tfx  # noqa: PLC0415

    if engine not in ENGINES:
        raise ValueError(f"--engine must be one of {ENGINES}, got {engine!r}")
    pipeline = create_pipeline(
        pipeline_name=pipeline_name, pipeline_root=pipeline_root, corpus_base=corpus, corpus_pattern=corpus_pattern,
        serving_model_dir=serving_dir, config=config, beam_pipeline_args=list(beam_args),
        portable_resolvers=True, vertex_training=vertex_training)
    output = output or f"{pipeline_name}.{'json' if engine == 'vertex' else 'yaml'}"
    runner = tfx.orchestration.experimental.KubeflowV2DagRunner(
        config=tfx.orchestration.experimental.KubeflowV2DagRunnerConfig(default_image=image))
    job = runner.run(pipeline, write_out=False)
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w", encoding="utf-8") as f:
        if engine == "vertex":
            json.dump(job, f, indent=2, sort_keys=True)
        else:
            import yaml  # noqa: PLC0415

            yaml.safe_dump(job["pipelineSpec"], f, sort_keys=False)
    return output


def submit_vertex(package: str, *, project: str, region: str, pipeline_root: str,
                  schedule: Optional[str] = None, aiplatform: Any = None,
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


def submit_kubeflow(package: str, *, host: str, schedule: Optional[str] = None, client_factory: Any = None,
                    experiment: str = PIPELINE_NAME, run_name: str = PIPELINE_NAME) -> Any:
    """Runs (or, with a cron ``schedule``, schedules) a compiled pipeline on Kubeflow Pipelines."""
    if client_factory is None:
        try:
            import kfp  # noqa: PLC0415
        except ImportError as e:
            raise RuntimeError(
                "submitting to Kubeflow needs kfp>=2, which cannot share this environment with TFX 1.16 on "
                "Python 3.10 (protobuf pins); install it elsewhere and run `kfp run create` with the compiled "
                f"package {package}") from e
        client_factory = kfp.Client
    client = client_factory(host=host)
    if schedule:
        experiment_id = client.create_experiment(name=experiment).experiment_id
        # KFP's cron has six fields (seconds first); a five-field cron gets "0" seconds.
        cron = schedule if len(schedule.split()) == 6 else f"0 {schedule}"
        return client.create_recurring_run(experiment_id=experiment_id, job_name=f"{run_name}-schedule",
                                           cron_expression=cron, pipeline_package_path=package)
    return client.create_run_from_pipeline_package(package, arguments={}, run_name=run_name,
                                                   experiment_name=experiment, enable_caching=True)
