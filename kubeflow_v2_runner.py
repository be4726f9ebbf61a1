"""The pipeline for TFX's own command line, Vertex AI / Kubeflow Pipelines V2 engine (as in the TFX templates).

    tfx pipeline compile --engine vertex --pipeline_path kubeflow_v2_runner.py
    tfx pipeline create --engine vertex --pipeline_path kubeflow_v2_runner.py [--build_image]
    tfx run create --engine vertex --pipeline_name deepseek-tfx --project PROJECT --region REGION

The tfx CLI runs this file with no arguments, so its settings come from the environment:
DEEPSEEK_TFX_IMAGE (the pipeline image, built from the Dockerfile), DEEPSEEK_TFX_PIPELINE_ROOT (e.g.
gs://bucket/root) and DEEPSEEK_TFX_CORPUS (e.g. gs://bucket/corpus) are required; DEEPSEEK_TFX_CORPUS_PATTERN
(default span-{SPAN}/*), DEEPSEEK_TFX_CONFIG (a config file, as --config takes), DEEPSEEK_TFX_PRESET,
DEEPSEEK_TFX_TRAIN_STEPS and DEEPSEEK_TFX_OUTPUT_FILE (default deepseek-tfx.json) are optional. It compiles the
same pipeline as ``deepseek-tfx compile --engine vertex``
(deepseek_tfx.pipeline.kubeflow_runner.build_pipeline).
"""

import os
import sys

from deepseek_tfx.pipeline import kubeflow_runner  # first: the project package sets TF_USE_LEGACY_KERAS
from deepseek_tfx.pipeline.settings import config_from_env

REQUIRED = ("DEEPSEEK_TFX_IMAGE", "DEEPSEEK_TFX_PIPELINE_ROOT", "DEEPSEEK_TFX_CORPUS")


def run() -> None:
    missing = [name for name in REQUIRED if not os.environ.get(name)]
    if missing:
        sys.exit(f"kubeflow_v2_runner.py needs the environment variables {', '.join(missing)}")
    image = os.environ["DEEPSEEK_TFX_IMAGE"]
    pipeline = kubeflow_runner.build_pipeline(
        image=image, pipeline_root=os.environ["DEEPSEEK_TFX_PIPELINE_ROOT"], corpus=os.environ["DEEPSEEK_TFX_CORPUS"],
        corpus_pattern=os.environ.get("DEEPSEEK_TFX_CORPUS_PATTERN", "span-{SPAN}/*"),
        config=config_from_env(os.environ))
    kubeflow_runner.dag_runner(image, os.environ.get("DEEPSEEK_TFX_OUTPUT_FILE", "deepseek-tfx.json")).run(
        pipeline, parameter_values=kubeflow_runner.runtime_defaults(pipeline))  # the runtime parameters' defaults


if __name__ == "__main__":
    run()
