"""TensorFlow Serving configuration and clients for pushed models."""

import os

# tft 1.16 and TFMA 0.47 run on tf_keras (Keras 2); this must be set before
# TensorFlow is first imported, so every package of the project sets it.
os.environ["TF_USE_LEGACY_KERAS"] = "1"
