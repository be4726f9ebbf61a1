"""TensorFlow Lite export (trainer_module/tflite_export.py) and its runner (serving/tflite_runner.py).

A tiny model is trained for a few seconds on tinyshakespeare's bytes (so its logits mean something), exported
as a SavedModel the way the Trainer exports, then converted; the TFLite model is compared with the SavedModel.
"""

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from deepseek_tfx.pipeline import cli
from deepseek_tfx.serving.tflite_runner import LiteGenerator
from deepseek_tfx.trainer_module import export, tflite_export
from deepseek_tfx.trainer_module.config import TrainConfig, get_preset
from deepseek_tfx.trainer_module.model import DeepSeekLM, token_nll
from deepseek_tfx.trainer_module.tokenizer import EOS_ID, ByteTokenizer
from deepseek_tfx.trainer_module.train_loop import TrainLoop, make_optimizer
from tests.export_helpers import TransformOutputStandIn

pytestmark = pytest.mark.slow

CONTEXT = 64
LOGIT_ATOL = 1e-4
"""float32 TFLite against the SavedModel's weights in TensorFlow: same math, other kernels and summation order."""


@pytest.fixture(scope="module")
def text(shakespeare) -> bytes:
    return shakespeare.read_bytes()


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, text) -> str:
    """A pushed-version-like SavedModel of the tiny preset trained 150 steps on the corpus's bytes."""
    tf.keras.utils.set_random_seed(0)
    config = get_preset("tiny").model.replace(vocab_size=260, context_len=CONTEXT)
    model = DeepSeekLM(config)
    model(tf.zeros([1, 4], tf.int64))
    cfg = TrainConfig(train_steps=150, batch_size=16, warmup_steps=10, precision="float32", jit_compile=False,
                      log_every=1000, checkpoint_every=0, eval_batches=0)
    ids = np.frombuffer(text[:200_000], np.uint8).astype(np.int64) + 4
    rows = len(ids) // (CONTEXT + 1)
    blocks = ids[: rows * (CONTEXT + 1)].reshape(rows, CONTEXT + 1)
    data = tf.data.Dataset.from_tensor_slices((blocks[:, :-1], blocks[:, 1:])).shuffle(rows, seed=0).repeat()
    TrainLoop(model, make_optimizer(model, cfg), tf.distribute.get_strategy(), cfg).train(
        data.batch(16, drop_remainder=True), cfg.train_steps)
    directory = str(tmp_path_factory.mktemp("pushed") / "1")
    export.export_serving_model(model, TransformOutputStandIn(), ByteTokenizer(), directory)
    return directory


@pytest.fixture(scope="module")
def exported(saved_model, tmp_path_factory) -> dict:
    """{quantize: export directory} for the three quantizations."""
    root = tmp_path_factory.mktemp("tflite")
    return {q: os.path.dirname(tflite_export.export_tflite(saved_model, str(root / q), q))
            for q in tflite_export.QUANTIZATIONS}


def _reference(saved_model):
    model, _ = tflite_export.load_pushed_model(saved_model)
    return model


def test_prefill_and_16_decode_steps_match_the_saved_model(saved_model, exported, text):
    reference = _reference(saved_model)
    lite = LiteGenerator(exported["none"])
    assert set(lite.interpreter.get_signature_list()) == {"prefill", "decode"}
    prompt = [EOS_ID] + [b + 4 for b in text[:20]]
    logits, cache, position = lite._fill(prompt)
    tokens = tf.constant([prompt], tf.int64)
    ref_logits, ref_caches = reference.prefill(tokens, cache_len=CONTEXT)
    np.testing.assert_allclose(logits, ref_logits[0, -1].numpy(), atol=LOGIT_ATOL, rtol=0)
    for step, byte in enumerate(text[20:36]):  # 16 decode steps, teacher-forced with the corpus's next bytes
        logits, cache = lite.step(byte + 4, cache, position + step)
        ref_step, ref_caches = reference.decode_step(tf.constant([byte + 4], tf.int64), ref_caches,
                                                     position + step)
        np.testing.assert_allclose(logits, ref_step[0].numpy(), atol=LOGIT_ATOL, rtol=0)
    assert np.abs(logits).max() > 1.0  # a trained model: logits far from uniform, so the check has teeth


def test_greedy_generation_equals_the_saved_models_generate(saved_model, exported):
    served = tf.saved_model.load(saved_model).signatures["generate"]
    for prompt in ("First Citizen:\n", "ROMEO"):
        expected = served(prompt=tf.constant([prompt]), max_new_tokens=tf.constant([32]),
                          temperature=tf.constant([0.0]), top_k=tf.constant([0]), seed=tf.constant([0]))
        want = expected["text"].numpy()[0].decode()
        got = LiteGenerator(exported["none"]).generate(prompt, 32)
        assert got == want and len(want) > 8


def _bits_per_byte(generator: LiteGenerator, data: bytes) -> float:
    """Bits per byte of ``data`` under the TFLite model, in prefill windows of context - 1 bytes after EOS."""
    nll, n = 0.0, 0
    step = CONTEXT - 1
    for start in range(0, len(data) - step, step):
        window = [EOS_ID] + [b + 4 for b in data[start:start + step]]
        tokens = np.zeros([1, CONTEXT], np.int32)
        tokens[0, :len(window)] = window
        logits = generator.prefill(tokens=tokens)["logits"][0, :len(window) - 1]
        nll += float(tf.reduce_sum(token_nll(logits, np.array(window[1:]))))
        n += len(window) - 1
    return nll / (math.log(2) * n)


def test_quantized_models_stay_within_stated_bits_per_byte_deltas(exported, text):
    """On held-out text (past the training bytes): float16 within 0.01 bits per byte of float32, dynamic-range
    int8 within 0.1; both files smaller than float32 (weights are most of the file: float16 under 65% of it,
    int8 under 45%; in this tiny model the graph and the float32 norms weigh more than in a real one)."""
    held_out = text[-6_300:]
    bpb = {q: _bits_per_byte(LiteGenerator(d), held_out) for q, d in exported.items()}
    assert bpb["none"] < 4.5  # it learned something: a uniform guess over bytes scores 8
    assert abs(bpb["float16"] - bpb["none"]) < 0.01
    assert abs(bpb["dynamic-int8"] - bpb["none"]) < 0.1
    size = {q: os.path.getsize(os.path.join(d, tflite_export.TFLITE_FILE)) for q, d in exported.items()}
    assert size["float16"] < 0.65 * size["none"] and size["dynamic-int8"] < 0.45 * size["none"]


def test_the_command_line_refuses_a_directory_that_is_not_a_model_and_leaves_nothing(tmp_path, capsys):
    """(The CLI's successful export runs in a fresh process in the SentencePiece test below.)"""
    missing = tmp_path / "nothing"
    assert cli.main(["export-tflite", "--model-dir", str(tmp_path), "--output", str(missing)]) == 1
    assert "not a deepseek-tfx model version" in capsys.readouterr().err
    assert not missing.exists() and not [p for p in os.listdir(tmp_path) if p.startswith(".tflite-")]
    with pytest.raises(SystemExit):
        cli.main(["export-tflite", "--model-dir", str(tmp_path), "--output", str(missing), "--quantize", "int4"])
    assert "invalid choice: 'int4'" in capsys.readouterr().err


def test_an_existing_output_is_replaced_only_when_it_is_an_earlier_export(saved_model, exported, tmp_path):
    # A directory with anything else in it (here a user's file) is refused before any work, and left as it was.
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with pytest.raises(tflite_export.ExportError, match=r"--output .*taken: exists and is not an earlier TFLite "
                                                        r"export \(it holds notes.txt\)"):
        tflite_export.export_tflite(saved_model, str(taken))
    assert os.listdir(taken) == ["notes.txt"] and (taken / "notes.txt").read_text() == "mine"
    with pytest.raises(tflite_export.ExportError, match="exists and is not a directory"):
        tflite_export.export_tflite(saved_model, str(taken / "notes.txt"))
    # An earlier export is replaced by the new one, and nothing is left beside it.
    again = tmp_path / "again"
    shutil.copytree(exported["dynamic-int8"], again)
    tflite_export.export_tflite(saved_model, str(again), "float16")
    assert json.loads((again / tflite_export.CONFIG_FILE).read_text())["quantize"] == "float16"
    assert sorted(os.listdir(tmp_path)) == ["again", "taken"]


class _SentencePieceTransform:
    """Transform stand-in for a SentencePiece tokenizer: token_ids and num_bytes of the ``text`` feature."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, features):
        text = tf.reshape(features["text"], [-1])
        return {"token_ids": self.tokenizer.tokenize(text).to_sparse(),
                "num_bytes": tf.strings.length(text, unit="BYTE")}

    def raw_feature_spec(self):
        return {"text": tf.io.FixedLenFeature([1], tf.string)}

    def transform_features_layer(self):
        return self


def test_a_sentencepiece_model_exports_with_its_tokenizer_and_generates_the_same_text(text, tmp_path):
    """The SavedModel's graph uses tensorflow_text's SentencePiece ops (export-tflite must load them); the export
    carries tokenizer.model, and the runner's sentencepiece encoding and decoding give the SavedModel's text."""
    from deepseek_tfx.components.tokenizer_gen import train_sentencepiece
    from deepseek_tfx.trainer_module.tokenizer import SentencePieceTokenizer

    lines = [line for line in text[:100_000].decode().split("\n") if line.strip()]
    proto, vocab = train_sentencepiece(lines, "bpe", 400)
    tokenizer = SentencePieceTokenizer(proto)
    tf.random.set_seed(3)
    model = DeepSeekLM(get_preset("tiny").model.replace(vocab_size=vocab, context_len=CONTEXT))
    model(tf.zeros([1, 4], tf.int64))
    pushed = str(tmp_path / "pushed" / "1")
    export.export_serving_model(model, _SentencePieceTransform(tokenizer), tokenizer, pushed)
    lite_dir = str(tmp_path / "lite")
    done = subprocess.run(  # a fresh process, as a user runs it: nothing has loaded tensorflow_text's ops yet
        [sys.executable, "-c", "import sys; from deepseek_tfx.pipeline import cli; sys.exit(cli.main(sys.argv[1:]))",
         "export-tflite", "--model-dir", pushed, "--output", lite_dir], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "wrote" in done.stdout
    written = sorted(os.listdir(lite_dir))
    assert written == sorted([tflite_export.CONFIG_FILE, tflite_export.TFLITE_FILE, "tokenizer.model"])
    assert open(os.path.join(lite_dir, "tokenizer.model"), "rb").read() == proto
    served = tf.saved_model.load(pushed).signatures["generate"]
    want = served(prompt=tf.constant(["ROMEO:"]), max_new_tokens=tf.constant([16]), temperature=tf.constant([0.0]),
                  top_k=tf.constant([0]), seed=tf.constant([0]))["text"].numpy()[0].decode()
    assert LiteGenerator(lite_dir).generate("ROMEO:", 16) == want and want


def test_the_pipeline_step_after_the_pusher_exports_only_what_was_pushed(saved_model, tmp_path):
    from tfx.types import standard_artifacts

    from deepseek_tfx.components import tflite_exporter

    def run(pushed: int, name: str):
        source = standard_artifacts.PushedModel()
        source.uri = str(tmp_path / name / "pushed")
        source.set_int_custom_property("pushed", pushed)
        source.set_string_custom_property("pushed_destination", saved_model if pushed else "")
        output = standard_artifacts.Model()
        output.uri = str(tmp_path / name / "tflite")
        tflite_exporter._Executor().Do({"pushed_model": [source]}, {"tflite_model": [output]},
                                       {"quantize": "dynamic-int8"})
        return output

    exported = run(1, "pushed")
    assert exported.get_int_custom_property("exported") == 1
    assert exported.get_string_custom_property("quantize") == "dynamic-int8"
    assert LiteGenerator(exported.uri).generate("ROMEO", 4)  # a working model in the artifact
    skipped = run(0, "not_pushed")
    assert skipped.get_int_custom_property("exported") == 0 and not os.path.exists(skipped.uri)
