"""Pipeline definition (create_pipeline), configuration, runners and the CLI."""

import deepseek_tfx.trainer_module  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
