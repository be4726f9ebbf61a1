"""The test suite. Importing the project first sets TF_USE_LEGACY_KERAS before TensorFlow loads."""

import deepseek_tfx.trainer_module  # noqa: F401
