"""Trainer side: Transform preprocessing_fn, the model, its input pipeline, run_fn and export.

This is also the one place that sets ``TF_USE_LEGACY_KERAS``: tf.Transform 1.16 and
TFMA 0.47 run on tf_keras (Keras 2), and the variable must be set before TensorFlow is
first imported. Every other package of the project (and so every entry point: the CLI,
the root-level runners, the component executors, ``bench/`` and the tests) imports this
package first, in its own ``__init__``.
"""

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
