"""The pipeline for TFX's own command line, local engine (as in the TFX templates).

    tfx pipeline create --engine local --pipeline_path local_runner.py
    tfx run create --engine local --pipeline_name deepseek-tfx

The tfx CLI runs this file with no arguments, so its settings come from the environment:
DEEPSEEK_TFX_OUTPUT (default ./deepseek_tfx_output), DEEPSEEK_TFX_CORPUS (default: the built-in corpus),
DEEPSEEK_TFX_CONFIG (a config file, as --config takes), DEEPSEEK_TFX_PRESET (default: PipelineConfig's) and
DEEPSEEK_TFX_TRAIN_STEPS (default: the preset's).
It builds the same pipeline as ``deepseek-tfx run`` (deepseek_tfx.pipeline.local_runner.prepare: the corpus
pre-flight, the layout under the output directory, the Beam mode) and runs it with LocalDagRunner.
``deepseek-tfx run`` does more around the same run: it reads spans a ``--last-spans`` window needs first, then
prints the run summary and, after a push, applies retention (--keep-versions) and writes TF Serving's configs.
"""

import os

from deepseek_tfx.pipeline import local_runner  # first: the project package sets TF_USE_LEGACY_KERAS
from deepseek_tfx.pipeline.settings import config_from_env
from tfx import v1 as tfx


def run() -> None:
    local = local_runner.prepare(output=os.environ.get("DEEPSEEK_TFX_OUTPUT", "deepseek_tfx_output"),
                                 config=config_from_env(os.environ),
                                 corpus=os.environ.get("DEEPSEEK_TFX_CORPUS") or None)
    tfx.orchestration.LocalDagRunner().run(local.pipeline)


if __name__ == "__main__":
    run()
