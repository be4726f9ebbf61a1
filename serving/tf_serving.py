"""TensorFlow Serving configuration for the Pusher's output directory.

The Pusher writes ``<base>/<model_name>/<version>/``; TF Serving polls
``<base>/<model_name>`` and serves the highest version, or the pinned one:
``pin_version`` records a version in ``<base>/<model_name>.pin.json`` and every
later ``write_configs`` keeps ``models.config`` on it (and retention keeps its
directory) until ``unpin_version``.
"""

from __future__ import annotations

import json
import os
import time

import yaml

from deepseek_tfx.components.model_gate import numeric_versions
from deepseek_tfx.trainer_module.config import ServingConfig
from deepseek_tfx.trainer_module.export import read_export_config

SERVING_VERSION = "2.16.1"
SERVING_IMAGE = f"tensorflow/serving:{SERVING_VERSION}"
"""The TF Serving release that matches the TensorFlow the model is exported with."""


class PinError(ValueError):
    """A version cannot be pinned; the message says why."""


def pin_file(serving_base: str, model_name: str) -> str:
    return os.path.join(serving_base, f"{model_name}.pin.json")


def pinned_version(serving_base: str, model_name: str) -> int | None:
    """The version pinned for ``model_name`` under ``serving_base``, or None.

    Raises:
        PinError: the pin file is not one ``pin_version`` wrote.
    """
    path = pin_file(serving_base, model_name)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return int(json.load(f)["version"])
    except (ValueError, KeyError, TypeError) as e:
        raise PinError(f"{path} is not a pin file written by serve-config ({type(e).__name__}: {e}); run "
                       "`deepseek-tfx serve-config --unpin` or `--pin VERSION` to replace it") from None


def pin_version(serving_base: str, model_name: str, version: int) -> None:
    """Makes ``models.config`` serve ``version`` from now on, until unpinned (the version directory must exist)."""
    model_dir = os.path.join(serving_base, model_name, str(version))
    if not os.path.exists(os.path.join(model_dir, "saved_model.pb")):
        raise PinError(f"cannot pin version {version}: {model_dir} holds no SavedModel (saved_model.pb)")
    with open(pin_file(serving_base, model_name), "w", encoding="utf-8") as f:
        json.dump({"version": int(version), "pinned_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, f)


def unpin_version(serving_base: str, model_name: str) -> bool:
    """Lifts the pin (TF Serving goes back to the latest version); False when nothing was pinned."""
    path = pin_file(serving_base, model_name)
    if not os.path.exists(path):
        return False
    os.remove(path)
    return True


def models_config(model_name: str, base_path: str, pinned: int | None = None) -> str:
    """A ``models.config`` (ModelServerConfig text proto): the latest version of one model, or ``pinned``."""
    policy = f"specific {{ versions: {pinned} }}" if pinned is not None else "latest { num_versions: 1 }"
    return (
        "model_config_list {\n"
        "  config {\n"
        f'    name: "{model_name}"\n'
        f'    base_path: "{base_path}"\n'
        '    model_platform: "tensorflow"\n'
        f"    model_version_policy {{ {policy} }}\n"
        "  }\n"
        "}\n"
    )


def batching_config(max_batch_size: int = ServingConfig().max_batch_size, batch_timeout_micros: int = 2000,
                    num_batch_threads: int = 2, max_enqueued_batches: int = 64) -> str:
    """A ``batching.config`` for ``--enable_batching`` that matches what the signatures accept.

    ``max_batch_size`` is the export's own limit (``ServingConfig.max_batch_size``): TF Serving then refuses
    a larger request itself ("Task size ... is larger than maximum input batch size"), and the graph refuses
    it too, naming the limit. Any size up to it is accepted (no ``allowed_batch_sizes``), and no padding is
    needed: every input is a [B] vector with no other dimension (``pad_variable_length_inputs: false``).
    """
    return (
        f"max_batch_size {{ value: {max_batch_size} }}\n"
        f"batch_timeout_micros {{ value: {batch_timeout_micros} }}\n"
        f"num_batch_threads {{ value: {num_batch_threads} }}\n"
        f"max_enqueued_batches {{ value: {max_enqueued_batches} }}\n"
        "pad_variable_length_inputs: false\n"
    )


CONTAINER_BASE = "/models"
"""Where the deployments mount the serving base (models.config, batching.config and <model_name>/)."""

SERVER_ARGS = [f"--model_config_file={CONTAINER_BASE}/models.config", "--model_config_file_poll_wait_seconds=60",
               "--enable_batching=true", f"--batching_parameters_file={CONTAINER_BASE}/batching.config"]
"""TF Serving's flags in both deployments: the models.config beside the models (re-read every minute, so a pin
takes effect without a restart; it overrides MODEL_NAME) and the batching.config that matches the model."""


def docker_command(serving_base: str, model_name: str) -> str:
    """The ``tensorflow/serving`` container command for the serving base directory (REST 8501, gRPC 8500)."""
    return (
        f"docker run --rm -p 8500:8500 -p 8501:8501 -v {os.path.abspath(serving_base)}:{CONTAINER_BASE} "
        f"-e MODEL_NAME={model_name} {SERVING_IMAGE} {' '.join(SERVER_ARGS)}"
    )


def readiness_path(model_name: str) -> str:
    """The REST path the readiness probe polls: the model's metadata, which TF Serving answers with 200 only
    once a version is loaded and AVAILABLE (404 "Servable not found" before), unlike ``/v1/models/NAME``,
    which answers 200 while a version is still loading."""
    return f"/v1/models/{model_name}/metadata"


def kubernetes_manifest(model_name: str, claim_name: str, replicas: int = 1, image: str = SERVING_IMAGE) -> str:
    """A Deployment and a Service serving ``<claim>/<model_name>/<version>/`` with TF Serving.

    The serving base (models.config, batching.config, ``<model_name>/<version>/``)
    must be on a PersistentVolumeClaim named ``claim_name``, mounted read-only at
    /models (copy or sync the serving base there). TF Serving reads models.config
    from it (a pin included) and loads new versions as the Pusher renames them
    into place. Readiness waits until a version is loaded (``readiness_path``).
    """
    labels = {"app": f"{model_name}-serving"}
    documents = [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"{model_name}-serving"},
         "spec": {
             "replicas": replicas, "selector": {"matchLabels": labels},
             "template": {"metadata": {"labels": labels}, "spec": {
                 "containers": [{
                     "name": "tensorflow-serving", "image": image,
                     "env": [{"name": "MODEL_NAME", "value": model_name}],
                     "args": [*SERVER_ARGS, "--file_system_poll_wait_seconds=30"],
                     "ports": [{"name": "grpc", "containerPort": 8500}, {"name": "http", "containerPort": 8501}],
                     "readinessProbe": {"httpGet": {"path": readiness_path(model_name), "port": 8501},
                                        "initialDelaySeconds": 10, "periodSeconds": 10},
                     "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
                     "volumeMounts": [{"name": "models", "mountPath": CONTAINER_BASE, "readOnly": True}],
                 }],
                 "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": claim_name}}],
             }},
         }},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": f"{model_name}-serving"},
         "spec": {"selector": labels, "ports": [{"name": "grpc", "port": 8500, "targetPort": 8500},
                                                {"name": "http", "port": 8501, "targetPort": 8501}]}},
    ]
    return yaml.safe_dump_all(documents, sort_keys=False)


def write_configs(serving_base: str, model_name: str, pinned: int | None = None,
                  claim_name: str = "deepseek-models") -> dict[str, str]:
    """Writes models.config, batching.config and kubernetes.yaml beside the model directory.

    ``models.config`` serves ``pinned`` (see ``pinned_version``) or the latest version, from the path the
    deployments mount (CONTAINER_BASE); ``batching.config``'s batch size is the served version's own limit.
    Returns the files' paths and, under ``docker``, the container command.
    """
    os.makedirs(serving_base, exist_ok=True)
    model_dir = os.path.join(serving_base, model_name)
    versions = numeric_versions(model_dir)
    served = pinned if pinned is not None else (versions[-1] if versions else None)
    exported = read_export_config(os.path.join(model_dir, str(served))) if served is not None else None
    limits = ServingConfig.from_dict(exported["serving"]) if exported and "serving" in exported else ServingConfig()
    contents = {
        "models.config": models_config(model_name, f"{CONTAINER_BASE}/{model_name}", pinned),
        "batching.config": batching_config(limits.max_batch_size),
        "kubernetes.yaml": kubernetes_manifest(model_name, claim_name),
    }
    paths = {}
    for name, text in contents.items():
        paths[name] = os.path.join(serving_base, name)
        with open(paths[name], "w", encoding="utf-8") as f:
            f.write(text)
    paths["docker"] = docker_command(serving_base, model_name)
    return paths
