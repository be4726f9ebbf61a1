# The pipeline image for Vertex AI Pipelines, Kubeflow Pipelines, Vertex AI Training and Dataflow workers:
# the official TFX 1.16.0 image (Python 3.10, TFX and its TensorFlow) plus this project, tensorflow-text and
# sentencepiece, installed against the project's pinned constraints.
#
#   docker build -t REGION-docker.pkg.dev/PROJECT/REPO/deepseek-tfx:TAG .
#   docker push REGION-docker.pkg.dev/PROJECT/REPO/deepseek-tfx:TAG
FROM tensorflow/tfx:1.16.0

WORKDIR /pipeline
COPY constraints.txt setup.py README.md ./
COPY components/ components/
COPY pipeline/ pipeline/
COPY serving/ serving/
COPY trainer_module/ trainer_module/
RUN python -m pip install --no-cache-dir -c constraints.txt -e . \
    && python -c "import tensorflow_text, sentencepiece, deepseek_tfx.pipeline, deepseek_tfx.components"

# tf.Transform 1.16 and TFMA 0.47 run on tf_keras (Keras 2). The project's packages set this themselves
# (deepseek_tfx.trainer_module), but in this image the entry point is TFX's own container launcher, which
# imports TensorFlow before any project code, so the image sets it for every step and Beam worker.
ENV TF_USE_LEGACY_KERAS=1 \
    PYTHONWARNINGS=ignore::FutureWarning
