"""Clients for a TensorFlow Serving server that serves a pushed model's ``generate`` signature.

Every input of ``generate`` is a batch with one value per prompt (so TF Serving's
request batching can merge calls); the clients repeat the options for each prompt.

REST: ``POST {server}/v1/models/{model}:predict`` in either request format, the
columnar one (``"inputs"``: one list per input, the default) or the row one
(``"instances"``: one object per prompt, the format Vertex AI endpoints use).
gRPC: ``PredictionService/Predict`` through ``tensorflow-serving-api``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence

GENERATE = "generate"
REST_FORMATS = ("columns", "rows")
GENERATE_DTYPES = {"prompt": "string", "max_new_tokens": "int32", "temperature": "float32", "top_k": "int32",
                   "seed": "int32"}
"""The dtype of each ``generate`` input, as the exported signature declares it."""


def generate_inputs(prompts: Sequence[str], max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                    seed: int = 0) -> dict[str, list]:
    """The ``generate`` inputs by name, each a list with one value per prompt."""
    n = len(prompts)
    return {"prompt": list(prompts), "max_new_tokens": [int(max_new_tokens)] * n,
            "temperature": [float(temperature)] * n, "top_k": [int(top_k)] * n, "seed": [int(seed)] * n}


def generate_tensors(prompts: Sequence[str], max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
                     seed: int = 0) -> dict:
    """``generate_inputs`` as tensors of the signature's dtypes, each of shape [len(prompts)]."""
    import tensorflow as tf  # noqa: PLC0415  (heavy; REST needs none of it)

    inputs = generate_inputs(prompts, max_new_tokens, temperature, top_k, seed)
    return {k: tf.constant(v, GENERATE_DTYPES[k], shape=[len(v)]) for k, v in inputs.items()}


def generate_request(prompts: Sequence[str], max_new_tokens: int = 64, temperature: float = 0.0,
                     top_k: int = 0, seed: int = 0, rest_format: str = "columns") -> dict:
    """The JSON body for TF Serving's REST predict endpoint, in the columnar or the row format."""
    if rest_format not in REST_FORMATS:
        raise ValueError(f"rest_format must be one of {REST_FORMATS}, got {rest_format!r}")
    inputs = generate_inputs(prompts, max_new_tokens, temperature, top_k, seed)
    if rest_format == "columns":
        return {"signature_name": GENERATE, "inputs": inputs}
    rows = [dict(zip(inputs, values, strict=True)) for values in zip(*inputs.values(), strict=True)]
    return {"signature_name": GENERATE, "instances": rows}


def parse_generate_response(body: dict) -> list[str]:
    """Texts from a REST predict response, either format.

    TF Serving answers the columnar format with ``"outputs"`` and the row format with ``"predictions"``; with
    a single named output (``text``) it gives the values directly, else one object per name or row.
    """
    if "outputs" in body:
        outputs = body["outputs"]
        return list(outputs["text"] if isinstance(outputs, dict) else outputs)
    return [row["text"] if isinstance(row, dict) else row for row in body["predictions"]]


def rest_url(server: str) -> str:
    """``server`` as an http(s) base URL: ``localhost:8501`` becomes ``http://localhost:8501``."""
    if "://" not in server:
        return f"http://{server.rstrip('/')}"
    if not server.startswith(("http://", "https://")):
        raise ValueError(f"the REST server must be http://HOST:PORT or https://HOST:PORT (or HOST:PORT), "
                         f"got {server!r}")
    return server.rstrip("/")


def rest_generate(server: str, model: str, prompts: Sequence[str], timeout: float = 60.0,
                  rest_format: str = "columns", **options) -> list[str]:
    """Calls ``generate`` over REST; ``server`` is like ``http://localhost:8501`` (or ``localhost:8501``)."""
    request = urllib.request.Request(
        f"{rest_url(server)}/v1/models/{model}:predict",
        data=json.dumps(generate_request(prompts, rest_format=rest_format, **options)).encode("utf-8"),
        headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return parse_generate_response(json.loads(response.read().decode("utf-8")))
    except urllib.error.HTTPError as e:  # keep the server's own message (e.g. which input was refused)
        raise urllib.error.HTTPError(e.url, e.code, f"{e.reason}: {_server_error(e)}", e.headers, None) from None


def _server_error(error) -> str:
    """The ``error`` field of a TF Serving error body, else the body's start."""
    body = error.read().decode("utf-8", errors="replace")
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body[:200]


def grpc_request(model: str, prompts: Sequence[str], **options):
    """The gRPC ``PredictRequest`` for ``generate``: one tensor of shape [len(prompts)] per input."""
    import tensorflow as tf  # noqa: PLC0415  (heavy; REST needs none of it)
    from tensorflow_serving.apis import predict_pb2  # noqa: PLC0415

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = GENERATE
    for name, values in generate_inputs(prompts, **options).items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(values, dtype=GENERATE_DTYPES[name], shape=[len(values)]))
    return request


def grpc_generate(target: str, model: str, prompts: Sequence[str], timeout: float = 60.0, **options) -> list[str]:
    """Calls ``generate`` over gRPC; ``target`` is like ``localhost:8500``."""
    import grpc  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    from tensorflow_serving.apis import prediction_service_pb2_grpc  # noqa: PLC0415

    request = grpc_request(model, prompts, **options)
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(request, timeout)
    return [t.decode("utf-8") for t in tf.make_ndarray(response.outputs["text"]).tolist()]


def local_generate(model_dir: str, prompts: Sequence[str], **options) -> list[str]:
    """Calls ``generate`` of the SavedModel at ``model_dir`` (a pushed version directory) in this process."""
    import tensorflow as tf  # noqa: PLC0415
    import tensorflow_text  # noqa: F401, PLC0415  (registers the SentencePiece ops the model uses)

    model = tf.saved_model.load(model_dir)
    outputs = model.signatures[GENERATE](**generate_tensors(prompts, **options))
    return [t.decode("utf-8") for t in outputs["text"].numpy().tolist()]
