"""TensorFlow Serving configuration for the Pusher's output directory.

The Pusher writes ``<base>/<model_name>/<version>/``; TF Serving polls
``<base>/<model_name>`` and serves the highest version.
"""

from __future__ import annotations

import os


def models_config(model_name: str, base_path: str) -> str:
    """A ``models.config`` (ModelServerConfig text proto) serving the latest version of one model."""
    return (
        "model_config_list {\n"
        "  config {\n"
        f'    name: "{model_name}"\n'
        f'    base_path: "{base_path}"\n'
        '    model_platform: "tensorflow"\n'
        "    model_version_policy { latest { num_versions: 1 } }\n"
        "  }\n"
        "}\n"
    )


def batching_config(max_batch_size: int = 8, batch_timeout_micros: int = 2000,
                    num_batch_threads: int = 2, max_enqueued_batches: int = 64) -> str:
    """A ``batching.config`` for ``--enable_batching``."""
    return (
        f"max_batch_size {{ value: {max_batch_size} }}\n"
        f"batch_timeout_micros {{ value: {batch_timeout_micros} }}\n"
        f"num_batch_threads {{ value: {num_batch_threads} }}\n"
        f"max_enqueued_batches {{ value: {max_enqueued_batches} }}\n"
    )


def docker_command(serving_dir: str, model_name: str) -> str:
    """The ``tensorflow/serving`` container command for the pushed directory (REST 8501, gRPC 8500)."""
    return (
        f"docker run --rm -p 8500:8500 -p 8501:8501 "
        f"-v {os.path.abspath(serving_dir)}:/models/{model_name} -e MODEL_NAME={model_name} "
        f"tensorflow/serving:2.16.1"
    )


def write_configs(serving_base: str, model_name: str) -> dict[str, str]:
    """Writes models.config and batching.config beside the model directory; returns their paths."""
    os.makedirs(serving_base, exist_ok=True)
    paths = {"models.config": os.path.join(serving_base, "models.config"),
             "batching.config": os.path.join(serving_base, "batching.config")}
    with open(paths["models.config"], "w", encoding="utf-8") as f:
        f.write(models_config(model_name, os.path.abspath(os.path.join(serving_base, model_name))))
    with open(paths["batching.config"], "w", encoding="utf-8") as f:
        f.write(batching_config())
    return paths
