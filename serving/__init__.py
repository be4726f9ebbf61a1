"""TensorFlow Serving configuration and clients for pushed models."""

import deepseek_tfx.trainer_module  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
