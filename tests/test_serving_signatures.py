"""The exported signatures as TF Serving drives them: batchable, bounded, and strict about their inputs.

TF Serving's ``--enable_batching`` merges concurrent requests along the first dimension and refuses
rank-0 inputs. No server binary runs here, so the signatures are driven through TensorFlow's own batching
op (``tf.nondifferentiable_batch_function``, the kernel family with the same input checks) by concurrent
requests of different sizes.
"""

import base64
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

from deepseek_tfx.pipeline import cli
from deepseek_tfx.serving import client
from deepseek_tfx.serving.client import generate_tensors
from deepseek_tfx.trainer_module import export
from deepseek_tfx.trainer_module.config import ServingConfig
from deepseek_tfx.trainer_module.tokenizer import EOS_ID, ByteTokenizer
from tests.export_helpers import TransformOutputStandIn, tiny_model

CONTEXT = 32
LIMITS = ServingConfig(max_batch_size=8, max_new_tokens=16, max_text_bytes=400, max_prompt_bytes=16,
                       score_chunk_windows=2)


@pytest.fixture(scope="module")
def model():
    return tiny_model(CONTEXT, seed=3)


@pytest.fixture(scope="module")
def export_dir(model, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("export"))
    export.export_serving_model(model, TransformOutputStandIn(), ByteTokenizer(), path, limits=LIMITS)
    return path


@pytest.fixture(scope="module")
def signatures(export_dir):
    loaded = tf.saved_model.load(export_dir)
    yield loaded.signatures  # the signatures need `loaded` alive: it owns the variables
    del loaded


def _examples(texts):
    return [tf.train.Example(features=tf.train.Features(feature={"text": tf.train.Feature(
        bytes_list=tf.train.BytesList(value=[t.encode()]))})).SerializeToString() for t in texts]


def _requests(name):
    """Three requests of 1, 2 and 3 rows for signature ``name``, rows with different options."""
    texts = [["Speak, speak."], ["O Romeo", "é café ☕"], ["", "ab", "First Citizen:\nBefore we proceed"]]
    if name == "score":
        return [{"text": tf.constant(t)} for t in texts]
    if name == "serving_default":
        return [{"examples": tf.constant(_examples(t))} for t in texts]
    requests = []
    for i, prompts in enumerate(texts):
        rows = len(prompts)
        requests.append({"prompt": tf.constant(prompts),
                         "max_new_tokens": tf.constant([3 + 2 * r + i for r in range(rows)], tf.int32),
                         "temperature": tf.constant([0.0, 1.0, 0.7][:rows], tf.float32),
                         "top_k": tf.constant([0, 0, 5][:rows], tf.int32),
                         "seed": tf.constant([11 + r + 5 * i for r in range(rows)], tf.int32)})
    return requests


def _numpy(outputs):
    return {k: v.numpy() for k, v in outputs.items()}


def test_every_input_of_every_signature_has_a_batch_dimension(signatures):
    for name in ("serving_default", "generate", "score"):
        specs = signatures[name].structured_input_signature[1]
        assert specs, name
        for spec in specs.values():
            assert spec.shape.rank == 1 and spec.shape[0] is None, (name, spec)
        for spec in signatures[name].structured_outputs.values():
            assert spec.shape.rank == 1, (name, spec)


@pytest.mark.parametrize("name", ["generate", "score", "serving_default"])
def test_concurrent_requests_batched_by_tensorflows_batching_op_get_their_own_answers(signatures, name):
    signature = signatures[name]
    specs = signature.structured_input_signature[1]
    names = sorted(specs)
    sizes_seen = []

    def record(batch):  # the size of each merged batch the op ran
        sizes_seen.append(int(batch))
        return batch

    @tf.nondifferentiable_batch_function(num_batch_threads=1, max_batch_size=LIMITS.max_batch_size,
                                         batch_timeout_micros=3_000_000, autograph=False)
    def batched(*tensors):
        outputs = signature(**dict(zip(names, tensors, strict=True)))
        size = tf.py_function(record, [tf.shape(tensors[0])[0]], tf.int32)
        with tf.control_dependencies([size]):
            return [tf.identity(outputs[k]) for k in sorted(outputs)]

    call = tf.function(lambda *tensors: batched(*tensors), input_signature=[specs[n] for n in names],
                       autograph=False).get_concrete_function()
    requests = _requests(name)
    expected = [_numpy(signature(**request)) for request in requests]  # each request alone
    start = threading.Barrier(len(requests))

    def send(request):
        start.wait()
        return call(*[request[n] for n in names])

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        answers = list(pool.map(send, requests))
    assert sizes_seen == [6], "the three requests (1 + 2 + 3 rows) were not merged into one batch of 6"
    for request, answer, alone in zip(requests, answers, expected, strict=True):
        got = dict(zip(sorted(alone), [a.numpy() for a in answer], strict=True))
        rows = len(next(iter(request.values())).numpy())
        for key, value in alone.items():
            assert got[key].shape == (rows,), key
            if value.dtype == object:
                assert got[key].tolist() == value.tolist(), key
            else:
                np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-4, err_msg=key)


def test_rows_of_one_generate_call_equal_each_row_alone(signatures):
    request = _requests("generate")[2]
    together = signatures["generate"](**request)["text"].numpy().tolist()
    for row in range(3):
        alone = signatures["generate"](**{k: v[row:row + 1] for k, v in request.items()})["text"].numpy()
        assert alone.tolist() == [together[row]], row


def _generate(signatures, prompts=("a",), **changes):
    request = {**generate_tensors(list(prompts), 4), **changes}
    return signatures["generate"](**request)


BAD_GENERATE = [
    ({"temperature": [float("nan")]}, r"temperature: each value must be a finite number >= 0"),
    ({"temperature": [-1.0]}, r"temperature: each value must be a finite number >= 0"),
    ({"temperature": [float("inf")]}, r"temperature: each value must be a finite number >= 0"),
    ({"top_k": [-1]}, r"top_k: each value must be >= 0"),
    ({"max_new_tokens": [-1]}, r"max_new_tokens: each value must be within \[0, 16\]"),
    ({"max_new_tokens": [17]}, r"max_new_tokens: each value must be within \[0, 16\] .*max_new_tokens=16"),
    ({"seed": [1, 2]}, r"seed: has\] \[2\] \[values for\] \[1\]"),
]


@pytest.mark.parametrize(("change", "message"), BAD_GENERATE, ids=[m[:20] for _, m in BAD_GENERATE])
def test_bad_generate_options_are_invalid_argument_naming_the_input(signatures, change, message):
    (key, value), = change.items()
    dtype = tf.float32 if key == "temperature" else tf.int32
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _generate(signatures, **{key: tf.constant(value, dtype)})


def test_empty_and_oversized_batches_are_invalid_argument(signatures):
    with pytest.raises(tf.errors.InvalidArgumentError, match="prompt: empty batch"):
        _generate(signatures, prompts=[], **{k: tf.zeros([0], v.dtype) for k, v in
                                             generate_tensors(["a"]).items() if k != "prompt"})
    with pytest.raises(tf.errors.InvalidArgumentError, match="text: empty batch"):
        signatures["score"](text=tf.zeros([0], tf.string))
    with pytest.raises(tf.errors.InvalidArgumentError, match="examples: empty batch"):
        signatures["serving_default"](examples=tf.zeros([0], tf.string))
    nine = ["x"] * 9
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rows is over the model limit max_batch_size=8"):
        signatures["generate"](**generate_tensors(nine, 2))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"text: batch of\] \[9\]"):
        signatures["score"](text=tf.constant(nine))
    assert len(signatures["generate"](**generate_tensors(nine[:8], 2))["text"]) == 8
    # serving_default serves the Evaluator's batches, of any size.
    assert signatures["serving_default"](examples=tf.constant(_examples(nine)))["nll_sum"].shape == (9,)


def test_texts_over_the_byte_limit_are_invalid_argument(signatures):
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"text: a text of\] \[401\] .*max_text_bytes=400"):
        signatures["score"](text=tf.constant(["ok", "x" * 401]))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"examples: a text of\] \[401\]"):
        signatures["serving_default"](examples=tf.constant(_examples(["x" * 401])))
    assert signatures["score"](text=tf.constant(["x" * 400]))["perplexity"].shape == (1,)


def test_a_long_prompt_keeps_its_last_bytes_cut_at_a_character_boundary(signatures):
    # 16 bytes are kept; "é" is 2 bytes, so a cut inside one drops its continuation byte.
    tail = "xé" * 5 + "tail"  # 19 bytes: the cut falls after the first "xé", inside no character
    kept = tail.encode()[-16:]
    assert kept.decode("utf-8", errors="strict")  # the expected kept part is whole characters
    odd = "é" * 20  # 40 bytes: the last 16 are 8 whole "é"
    greedy = {"temperature": tf.constant([0.0]), "max_new_tokens": tf.constant([6])}
    for prompt, same_as in [(tail, kept.decode()), ("é" + odd, "é" * 8), ("é" * 9 + "a", "é" * 7 + "a")]:
        assert (_generate(signatures, [prompt], **greedy)["text"].numpy()
                == _generate(signatures, [same_as], **greedy)["text"].numpy()), prompt
    # A prompt of 3-byte characters cut mid-character: the partial character is dropped, not decoded.
    cut = export._keep_last_bytes(tf.constant(["☕" * 10, "short", "aé" * 20]), 16).numpy().tolist()
    assert cut == [("☕" * 5).encode(), b"short", ("aé" * 5).encode()]


def test_score_in_chunks_equals_one_model_call_per_text(model):
    ids = tf.ragged.constant([list(range(4, 4 + 150)), list(range(10, 40)), []], dtype=tf.int64)
    chunked = export.score_ids(model, ids, CONTEXT, chunk_windows=2)
    whole = export.score_ids(model, ids, CONTEXT, chunk_windows=100)
    np.testing.assert_allclose(chunked[0].numpy(), whole[0].numpy(), rtol=1e-5)
    assert chunked[1].numpy().tolist() == [150, 30, 0]
    # The first text's windows, scored one model call each.
    inputs = tf.concat([[EOS_ID], tf.range(4, 4 + 149, dtype=tf.int64)], 0)[None]
    expected = 0.0
    for start in range(0, 150, CONTEXT):
        x, y = inputs[:, start:start + CONTEXT], tf.range(4 + start, 4 + min(150, start + CONTEXT), dtype=tf.int64)
        logits = model(x, training=False)[0]
        expected += float(tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits)))
    assert abs(float(chunked[0][0]) - expected) < 1e-3 * expected


SERVE_IN_FRESH_PROCESS = r"""
import base64, json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (as TF Serving has the ops)
from tensorflow_serving.apis import predict_pb2
model = tf.saved_model.load(sys.argv[1])
answers = []
for kind, request in json.loads(sys.argv[2]):
    if kind == "grpc":  # a serialized PredictRequest: tensors as sent
        proto = predict_pb2.PredictRequest.FromString(base64.b64decode(request))
        signature = model.signatures[proto.model_spec.signature_name]
        inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in proto.inputs.items()}
    else:  # REST: TF Serving stacks "instances" rows, or takes "inputs" columns as they are
        signature = model.signatures[request.get("signature_name", "serving_default")]
        specs = signature.structured_input_signature[1]
        columns = request.get("inputs") or {k: [row[k] for row in request["instances"]] for k in specs}
        inputs = {k: tf.constant(v, specs[k].dtype) for k, v in columns.items()}
    outputs = signature(**inputs)
    answers.append({k: [x.decode("utf-8") if isinstance(x, bytes) else float(x) for x in v.numpy().tolist()]
                    for k, v in outputs.items()})
project = sorted(m for m in sys.modules if m.split(".")[0] in ("deepseek_tfx", "tfx"))
print(json.dumps({"answers": answers, "project_modules": project}))
"""


def readme_request_bodies() -> list[dict]:
    """The JSON request bodies the README shows."""
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8").read()
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", readme, flags=re.S)]


def test_every_readme_request_body_and_the_grpc_request_work_against_a_fresh_process_load(export_dir, signatures):
    bodies = readme_request_bodies()
    assert {("inputs" in b and "columns") or "rows" for b in bodies} == {"columns", "rows"}
    assert {b["signature_name"] for b in bodies} == {"generate", "score"}
    grpc = client.grpc_request("deepseek", ["ROMEO:", "JULIET:"], max_new_tokens=5, temperature=0.5, seed=2)
    requests = [["rest", b] for b in bodies]
    requests.append(["grpc", base64.b64encode(grpc.SerializeToString()).decode()])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", SERVE_IN_FRESH_PROCESS, export_dir, json.dumps(requests)],
                            capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["project_modules"] == []
    assert len(answer["answers"]) == len(requests)
    for body, got in zip(bodies, answer["answers"], strict=False):
        rows = len(body.get("instances") or next(iter(body["inputs"].values())))
        assert got and all(len(v) == rows for v in got.values()), body
    # the columns and rows bodies of generate are the same request: the same texts
    generate_answers = [got["text"] for b, got in zip(bodies, answer["answers"], strict=False)
                        if b["signature_name"] == "generate"]
    assert len(generate_answers) == 2 and generate_answers[0] == generate_answers[1]
    # ... and what this process computes for it
    columns = next(b for b in bodies if "inputs" in b)["inputs"]
    here = signatures["generate"](**{k: tf.constant(v, client.GENERATE_DTYPES[k]) for k, v in columns.items()})
    assert [t.decode() for t in here["text"].numpy().tolist()] == generate_answers[0]
    grpc_here = signatures["generate"](**generate_tensors(["ROMEO:", "JULIET:"], 5, 0.5, 0, 2))["text"]
    assert answer["answers"][-1]["text"] == [t.decode() for t in grpc_here.numpy().tolist()]


def test_generate_command_loads_a_version_directory_and_reports_bad_options(export_dir, capsys):
    assert cli.main(["generate", "--model-dir", export_dir, "--max-new-tokens", "4", "ab", "c"]) == 0
    out = capsys.readouterr().out  # prompt + continuation, one per prompt (random weights: any bytes)
    assert out.startswith("ab") and "\nc" in out and len(out) > len("ab\nc\n")
    assert cli.main(["generate", "--model-dir", export_dir, "--max-new-tokens", "4", "--temperature", "nan",
                     "ab"]) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert err.startswith(f"deepseek-tfx: error: {export_dir}: temperature: each value must be a finite number")
    assert "Traceback" not in err and len(err.splitlines()) == 1
