"""Clients for a TensorFlow Serving server that serves a pushed model's ``generate`` signature.

REST: ``POST {server}/v1/models/{model}:predict`` with the columnar ("inputs")
request format, the one that allows the batch of prompts and the scalar
options side by side. gRPC: ``PredictionService/Predict`` through
``tensorflow-serving-api``.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Sequence

GENERATE = "generate"


def generate_request(prompts: Sequence[str], max_new_tokens: int = 64, temperature: float = 0.0,
                     top_k: int = 0, seed: int = 0) -> dict:
    """The JSON body for TF Serving's REST predict endpoint (columnar format)."""
    return {
        "signature_name": GENERATE,
        "inputs": {
            "prompt": list(prompts),
            "max_new_tokens": int(max_new_tokens),
            "temperature": float(temperature),
            "top_k": int(top_k),
            "seed": int(seed),
        },
    }


def parse_generate_response(body: dict) -> list[str]:
    """Texts from a REST predict response (one named output: TF Serving maps "outputs" to it directly)."""
    outputs = body["outputs"]
    return list(outputs["text"] if isinstance(outputs, dict) else outputs)


def rest_generate(server: str, model: str, prompts: Sequence[str], timeout: float = 60.0, **options) -> list[str]:
    """Calls ``generate`` over REST; ``server`` is like ``http://localhost:8501``."""
    request = urllib.request.Request(
        f"{server.rstrip('/')}/v1/models/{model}:predict",
        data=json.dumps(generate_request(prompts, **options)).encode("utf-8"),
        headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return parse_generate_response(json.loads(response.read().decode("utf-8")))


def grpc_generate(target: str, model: str, prompts: Sequence[str], timeout: float = 60.0,
                  max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0, seed: int = 0
                  ) -> list[str]:
    """Calls ``generate`` over gRPC; ``target`` is like ``localhost:8500``."""
    import grpc  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc  # noqa: PLC0415

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = GENERATE
    request.inputs["prompt"].CopyFrom(tf.make_tensor_proto(list(prompts), dtype=tf.string))
    request.inputs["max_new_tokens"].CopyFrom(tf.make_tensor_proto(max_new_tokens, dtype=tf.int32))
    request.inputs["temperature"].CopyFrom(tf.make_tensor_proto(temperature, dtype=tf.float32))
    request.inputs["top_k"].CopyFrom(tf.make_tensor_proto(top_k, dtype=tf.int32))
    request.inputs["seed"].CopyFrom(tf.make_tensor_proto(seed, dtype=tf.int32))
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(request, timeout)
    return [t.decode("utf-8") for t in tf.make_ndarray(response.outputs["text"]).tolist()]
