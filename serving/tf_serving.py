"""TensorFlow Serving configuration for the Pusher's output directory.

The Pusher writes ``<base>/<model_name>/<version>/``; TF Serving polls
``<base>/<model_name>`` and serves the highest version.
"""

from __future__ import annotations

import os

import yaml

SERVING_IMAGE = "tensorflow/serving:2.16.1"
"""The TF Serving release that matches the TensorFlow the model is exported with."""


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
        f"{SERVING_IMAGE}"
    )


def kubernetes_manifest(model_name: str, claim_name: str, replicas: int = 1,
                        image: str = SERVING_IMAGE) -> str:
    """A Deployment, Service and ConfigMap serving ``<claim>/<model_name>/<version>/`` with TF Serving.

    The pushed directory must be on a PersistentVolumeClaim named ``claim_name``
    (mounted read-only at /models; the Pusher writes ``<base>/<model_name>``, so
    copy or sync the serving base there). TF Serving polls it and loads new
    versions as the Pusher renames them into place. Readiness waits until the
    model reports AVAILABLE over REST.
    """
    labels = {"app": f"{model_name}-serving"}
    config_map = f"{model_name}-serving-config"
    documents = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": config_map},
         "data": {"batching.config": batching_config()}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"{model_name}-serving"},
         "spec": {
             "replicas": replicas, "selector": {"matchLabels": labels},
             "template": {"metadata": {"labels": labels}, "spec": {
                 "containers": [{
                     "name": "tensorflow-serving", "image": image,
                     "env": [{"name": "MODEL_NAME", "value": model_name}],
                     "args": ["--enable_batching=true", "--batching_parameters_file=/config/batching.config",
                              "--file_system_poll_wait_seconds=30"],
                     "ports": [{"name": "grpc", "containerPort": 8500}, {"name": "http", "containerPort": 8501}],
                     "readinessProbe": {"httpGet": {"path": f"/v1/models/{model_name}", "port": 8501},
                                        "initialDelaySeconds": 10, "periodSeconds": 10},
                     "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
                     "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True},
                                      {"name": "config", "mountPath": "/config", "readOnly": True}],
                 }],
                 "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": claim_name}},
                             {"name": "config", "configMap": {"name": config_map}}],
             }},
         }},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{model_name}-serving"},
         "spec": {"selector": labels, "ports": [{"name": "grpc", "port": 8500, "targetPort": 8500},
                                                {"name": "http", "port": 8501, "targetPort": 8501}]}},
    ]
    return yaml.safe_dump_all(documents, sort_keys=False)


def write_configs(serving_base: str, model_name: str, claim_name: str = "deepseek-models") -> dict[str, str]:
    """Writes models.config, batching.config and kubernetes.yaml beside the model directory.

    Returns their paths and, under ``docker``, the container command.
    """
    os.makedirs(serving_base, exist_ok=True)
    contents = {
        "models.config": models_config(model_name, os.path.abspath(os.path.join(serving_base, model_name))),
        "batching.config": batching_config(),
        "kubernetes.yaml": kubernetes_manifest(model_name, claim_name),
    }
    paths = {}
    for name, text in contents.items():
        paths[name] = os.path.join(serving_base, name)
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write(text)
    paths["docker"] = docker_command(os.path.join(serving_base, model_name), model_name)
    return paths
