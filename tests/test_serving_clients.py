"""The REST and gRPC clients' success paths, against in-process stand-ins for tensorflow_model_server.

Both stubs listen on 127.0.0.1 only, on a port the OS picks, record what the client sent, answer the way TF
Serving answers, and are shut down when their test ends.
"""

import http.server
import json
import threading
import urllib.error

import pytest

from deepseek_tfx.pipeline import cli
from deepseek_tfx.serving import client

TIMEOUT = 10.0  # seconds, for every client call: a stuck stub fails the test instead of hanging it


class _RestStub(http.server.HTTPServer):
    """TF Serving's REST predict endpoint: records each request and answers with ``status`` and ``reply``."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _RestHandler)
        self.requests = []
        self.status = 200
        self.reply = {"outputs": {"text": []}}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _RestHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append({
            "method": self.command, "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()}, "raw": raw, "json": json.loads(raw)})
        body = json.dumps(self.server.reply).encode("utf-8")
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # keep the test output quiet
        pass


@pytest.fixture
def rest_stub():
    server = _RestStub()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_rest_generate_posts_the_predict_request_and_reads_the_named_output(rest_stub):
    rest_stub.reply = {"outputs": {"text": [" world", "ld!"]}}
    texts = client.rest_generate(rest_stub.url, "deepseek", ["hello", "wor"], timeout=TIMEOUT,
                                 max_new_tokens=5, temperature=0.75, top_k=3, seed=9)
    assert texts == [" world", "ld!"]
    [request] = rest_stub.requests
    assert request["method"] == "POST"
    assert request["path"] == "/v1/models/deepseek:predict"
    assert request["headers"]["content-type"] == "application/json"
    body = request["json"]
    assert body == client.generate_request(["hello", "wor"], max_new_tokens=5, temperature=0.75, top_k=3, seed=9)
    assert body == {"signature_name": "generate",  # one value per prompt: TF Serving's batching needs a batch dim
                    "inputs": {"prompt": ["hello", "wor"], "max_new_tokens": [5, 5], "temperature": [0.75, 0.75],
                               "top_k": [3, 3], "seed": [9, 9]}}
    inputs = body["inputs"]
    assert [type(inputs[k][1]) for k in ("max_new_tokens", "temperature", "top_k", "seed")] == [int, float, int, int]


def test_rest_generate_sends_rows_in_the_instances_format(rest_stub):
    rest_stub.reply = {"predictions": [" one", " two"]}  # TF Serving's row answer for a single output
    texts = client.rest_generate(rest_stub.url, "deepseek", ["a", "b"], timeout=TIMEOUT, rest_format="rows",
                                 max_new_tokens=3, temperature=0.5, seed=4)
    assert texts == [" one", " two"]
    [request] = rest_stub.requests
    row = {"max_new_tokens": 3, "temperature": 0.5, "top_k": 0, "seed": 4}
    assert request["json"] == {"signature_name": "generate",
                               "instances": [{"prompt": "a", **row}, {"prompt": "b", **row}]}
    assert client.parse_generate_response({"predictions": [{"text": "x"}]}) == ["x"]  # several outputs: objects


def test_a_server_without_a_scheme_means_http_and_another_scheme_is_refused(rest_stub):
    rest_stub.reply = {"outputs": ["!"]}
    host_port = rest_stub.url.removeprefix("http://")
    assert client.rest_generate(host_port, "deepseek", ["a"], timeout=TIMEOUT) == ["!"]
    assert rest_stub.requests[0]["path"] == "/v1/models/deepseek:predict"
    with pytest.raises(ValueError, match=r"http://HOST:PORT .* got 'grpc://localhost:8500'"):
        client.rest_generate("grpc://localhost:8500", "deepseek", ["a"], timeout=TIMEOUT)


def test_rest_generate_sends_float_temperature_and_reads_the_single_output_form(rest_stub):
    rest_stub.reply = {"outputs": ["é!"]}  # one output: TF Serving gives the list directly
    texts = client.rest_generate(rest_stub.url + "/", "other-model", ["x"], timeout=TIMEOUT, temperature=1)
    assert texts == ["é!"]
    [request] = rest_stub.requests
    assert request["path"] == "/v1/models/other-model:predict"  # the trailing slash of the server is dropped
    assert b'"temperature": [1.0]' in request["raw"]  # an int temperature goes out as a JSON float
    assert request["json"] == {"signature_name": "generate",
                               "inputs": {"prompt": ["x"], "max_new_tokens": [64], "temperature": [1.0], "top_k": [0],
                                          "seed": [0]}}
    assert type(request["json"]["inputs"]["temperature"][0]) is float


def test_rest_generate_raises_on_an_http_error_status(rest_stub):
    rest_stub.status = 404
    rest_stub.reply = {"error": "Servable not found for request: Latest(deepseek)"}
    with pytest.raises(urllib.error.HTTPError) as error:
        client.rest_generate(rest_stub.url, "deepseek", ["hello"], timeout=TIMEOUT)
    assert error.value.code == 404
    assert "Servable not found for request: Latest(deepseek)" in str(error.value)  # the server's own words
    assert len(rest_stub.requests) == 1


def test_generate_command_prints_prompt_and_text_from_the_rest_server(rest_stub, capsys):
    rest_stub.reply = {"outputs": {"text": [" world", ", then"]}}
    code = cli.main(["generate", "--server", rest_stub.url, "--model", "deepseek", "--max-new-tokens", "6",
                     "--temperature", "0.5", "--top-k", "4", "--seed", "2", "hello", "and"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == "hello world\nand, then\n"
    [request] = rest_stub.requests
    assert request["path"] == "/v1/models/deepseek:predict"
    assert request["json"] == client.generate_request(["hello", "and"], max_new_tokens=6, temperature=0.5, top_k=4,
                                                      seed=2)


def test_generate_command_fails_when_the_rest_server_answers_500(rest_stub, capsys):
    rest_stub.status = 500
    rest_stub.reply = {"error": "boom"}
    code = cli.main(["generate", "--server", rest_stub.url, "hello"])
    out, err = capsys.readouterr()
    assert code == cli.EXIT_FAILED == 1
    assert out == ""
    assert err.startswith(f"deepseek-tfx: error: {rest_stub.url}: ")
    assert "500" in err


def test_generate_command_fails_when_the_server_answers_too_few_texts(rest_stub, capsys):
    rest_stub.reply = {"outputs": {"text": [" one"]}}
    code = cli.main(["generate", "--server", rest_stub.url, "first", "second"])
    out, err = capsys.readouterr()
    assert code == cli.EXIT_FAILED and out == ""
    assert err == f"deepseek-tfx: error: {rest_stub.url}: answered 1 text(s) for 2 prompt(s)\n"


@pytest.fixture
def grpc_stub():
    """An in-process PredictionService: records each PredictRequest and answers ``texts`` (or ``abort``)."""
    from concurrent import futures

    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    class Servicer(prediction_service_pb2_grpc.PredictionServiceServicer):
        def __init__(self):
            self.requests = []
            self.texts = []
            self.abort = None

        def Predict(self, request, context):  # noqa: N802 (the gRPC service's method name)
            recorded = predict_pb2.PredictRequest()
            recorded.CopyFrom(request)
            self.requests.append(recorded)
            if self.abort:
                context.abort(*self.abort)
            response = predict_pb2.PredictResponse()
            response.model_spec.CopyFrom(request.model_spec)
            response.outputs["text"].CopyFrom(
                tf.make_tensor_proto([t.encode("utf-8") for t in self.texts], dtype=tf.string))
            return response

    servicer = Servicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    assert port, "could not bind a port on 127.0.0.1"
    server.start()
    servicer.target = f"127.0.0.1:{port}"
    try:
        yield servicer
    finally:
        server.stop(grace=None).wait(timeout=5)


def test_grpc_generate_sends_typed_inputs_and_decodes_the_text_output(grpc_stub):
    import numpy as np
    import tensorflow as tf
    from tensorflow.core.framework import types_pb2

    grpc_stub.texts = [" world", "ld — é"]
    texts = client.grpc_generate(grpc_stub.target, "deepseek", ["hello", "wor"], timeout=TIMEOUT,
                                 max_new_tokens=5, temperature=0.75, top_k=3, seed=9)
    assert texts == [" world", "ld — é"]
    [request] = grpc_stub.requests
    assert request.model_spec.name == "deepseek"
    assert request.model_spec.signature_name == "generate"
    assert set(request.inputs) == {"prompt", "max_new_tokens", "temperature", "top_k", "seed"}

    prompt = request.inputs["prompt"]
    assert prompt.dtype == types_pb2.DT_STRING
    assert tf.make_ndarray(prompt).tolist() == [b"hello", b"wor"]
    expected = {"max_new_tokens": (types_pb2.DT_INT32, np.int32, 5),
                "temperature": (types_pb2.DT_FLOAT, np.float32, 0.75),
                "top_k": (types_pb2.DT_INT32, np.int32, 3),
                "seed": (types_pb2.DT_INT32, np.int32, 9)}
    for name, (dtype, np_dtype, value) in expected.items():
        tensor = request.inputs[name]
        assert tensor.dtype == dtype, name
        array = tf.make_ndarray(tensor)
        assert array.shape == (2,) and array.dtype == np_dtype, name  # one value per prompt, as the signature takes
        assert array.tolist() == [value, value], name


def test_grpc_generate_sends_the_defaults_and_raises_on_an_rpc_error(grpc_stub):
    import grpc
    import tensorflow as tf

    grpc_stub.texts = ["!"]
    assert client.grpc_generate(grpc_stub.target, "m", ["a"], timeout=TIMEOUT) == ["!"]
    inputs = grpc_stub.requests[0].inputs
    assert {k: tf.make_ndarray(inputs[k]).tolist() for k in ("max_new_tokens", "temperature", "top_k", "seed")} == {
        "max_new_tokens": [64], "temperature": [0.0], "top_k": [0], "seed": [0]}

    grpc_stub.abort = (grpc.StatusCode.NOT_FOUND, "Servable not found for request: Latest(m)")
    with pytest.raises(grpc.RpcError) as error:
        client.grpc_generate(grpc_stub.target, "m", ["a"], timeout=TIMEOUT)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_generate_command_prints_prompt_and_text_from_the_grpc_server(grpc_stub, capsys):
    grpc_stub.texts = [" there"]
    code = cli.main(["generate", "--grpc", grpc_stub.target, "--model", "deepseek", "--max-new-tokens", "2", "hi"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == "hi there\n"
    assert grpc_stub.requests[0].model_spec.name == "deepseek"
