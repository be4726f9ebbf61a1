"""TensorFlow Lite export of a pushed model: ``prefill`` and ``decode`` signatures for on-device generation.

    deepseek-tfx export-tflite --model-dir VERSION_DIR --output DIR [--quantize none|float16|dynamic-int8]

Reads the SavedModel version the Pusher wrote (its weights and ``assets.extra/deepseek_config.json``),
rebuilds the decoder in float32 and converts two functions with static shapes (batch 1, a cache of
``context_len`` slots; L layers):

* ``prefill``: ``tokens`` int32 [1, T] (the prompt, right-padded to T = context_len) -> ``logits`` float32
  [1, T, V] (row i predicts token i + 1: read row ``length - 1``) and the cache ``cache_0`` / ``cache_1``
  [L, 1, T, ...] (MLA: the compressed latent c_kv [C] and the rotary key k_pe [R] per slot). Padding right
  of the prompt is never attended: attention is causal, and ``decode`` attends slots <= ``position`` only.
* ``decode``: ``token`` int32 [1] at ``position`` int32 [1] and the cache -> ``logits`` [1, V] and the
  updated cache (the token's latent written at ``position``).

MoE layers run every expert on the token and zero the gates of the unchosen ones (``DeepSeekMoE.all_experts``):
the dropless dispatch's sort and per-expert split have data-dependent shapes. Only TensorFlow Lite builtin
ops are used (the conversion allows no others, so a Select TF op would fail it).

Written to ``--output``: ``model.tflite``, ``tokenizer.model`` (SentencePiece; none for the byte tokenizer)
and ``tflite_config.json`` (model config, tokenizer kind, quantization, EOS / PAD / reserved ids).
``serving/tflite_runner.py`` generates text from them with ``tf.lite.Interpreter`` and ``sentencepiece``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import tensorflow as tf

from deepseek_tfx.trainer_module import export
from deepseek_tfx.trainer_module.config import ModelConfig
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.tokenizer import EOS_ID, MODEL_FILE, NUM_RESERVED, PAD_ID

QUANTIZATIONS = ("none", "float16", "dynamic-int8")
TFLITE_FILE = "model.tflite"
CONFIG_FILE = "tflite_config.json"


class ExportError(ValueError):
    """The model directory or an option cannot be exported; the message says which and why."""


def load_pushed_model(model_dir: str) -> tuple[DeepSeekLM, dict]:
    """The float32 decoder of a pushed SavedModel version, with its weights, and the export's config."""
    config = export.read_export_config(model_dir)
    if config is None:
        raise ExportError(f"{model_dir}: not a deepseek-tfx model version (no assets.extra/{export.CONFIG_FILE}); "
                          "pass a version directory of the serving directory, e.g. .../serving_model/3")
    import tensorflow_text  # noqa: F401, PLC0415  (registers the SentencePiece ops the SavedModel's graph uses)

    model = DeepSeekLM(ModelConfig.from_dict(config["model"]), dtype="float32")
    model(tf.zeros([1, 4], tf.int64))
    model.set_weights([v.numpy() for v in tf.saved_model.load(model_dir).model_variables])
    return model, config


class LiteModule(tf.Module):
    """The two static-shape functions the converter turns into signatures."""

    def __init__(self, model: DeepSeekLM):
        super().__init__()
        self.model = model
        for moe in model.moe_layers():
            moe.all_experts = True
        t = model.config.context_len
        caches = model.prefill(tf.zeros([1, t], tf.int64), cache_len=t)[1]
        shapes = [[len(caches), *c.shape] for c in caches[0]]
        self.prefill = tf.function(self._prefill, input_signature=[
            tf.TensorSpec([1, t], tf.int32, name="tokens")], autograph=False)
        self.decode = tf.function(self._decode, input_signature=[
            tf.TensorSpec([1], tf.int32, name="token"), tf.TensorSpec([1], tf.int32, name="position"),
            tf.TensorSpec(shapes[0], tf.float32, name="cache_0"),
            tf.TensorSpec(shapes[1], tf.float32, name="cache_1")], autograph=False)

    def _prefill(self, tokens):
        logits, caches = self.model.prefill(tf.cast(tokens, tf.int64), cache_len=self.model.config.context_len)
        return {"logits": logits, "cache_0": tf.stack([c[0] for c in caches]),
                "cache_1": tf.stack([c[1] for c in caches])}

    def _decode(self, token, position, cache_0, cache_1):
        caches = list(zip(tf.unstack(cache_0), tf.unstack(cache_1), strict=True))
        logits, caches = self.model.decode_step(tf.cast(token, tf.int64), caches, position[0])
        return {"logits": logits, "cache_0": tf.stack([c[0] for c in caches]),
                "cache_1": tf.stack([c[1] for c in caches])}


def convert(model: DeepSeekLM, quantize: str = "none") -> bytes:
    """The ``.tflite`` flatbuffer of ``model`` with the ``prefill`` and ``decode`` signatures."""
    if quantize not in QUANTIZATIONS:
        raise ExportError(f"--quantize must be one of {', '.join(QUANTIZATIONS)}, got {quantize!r}")
    module = LiteModule(model)
    with tempfile.TemporaryDirectory() as tmp:
        tf.saved_model.save(module, tmp, signatures={"prefill": module.prefill.get_concrete_function(),
                                                     "decode": module.decode.get_concrete_function()})
        converter = tf.lite.TFLiteConverter.from_saved_model(tmp, signature_keys=["prefill", "decode"])
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if quantize != "none":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]  # dynamic-range int8 weights
        if quantize == "float16":
            converter.target_spec.supported_types = [tf.float16]
        return converter.convert()


def export_tflite(model_dir: str, output_dir: str, quantize: str = "none", tokenizer_model: str | None = None) -> str:
    """Writes model.tflite, the tokenizer and tflite_config.json into ``output_dir``; returns the .tflite path.

    The files are written into a temporary directory beside ``output_dir`` and moved into place at the end,
    so a failed export leaves nothing half-written. An existing ``output_dir`` is replaced only when it is empty
    or holds an earlier export and nothing else; any other existing directory or file is refused, untouched.
    """
    _check_replaceable(output_dir)
    model, config = load_pushed_model(model_dir)
    kind = config.get("tokenizer")
    sp_model = tokenizer_model or os.path.join(model_dir, "assets.extra", MODEL_FILE)
    if kind == "sentencepiece" and not tf.io.gfile.exists(sp_model):
        raise ExportError(f"{model_dir}: its SentencePiece model is not in assets.extra/{MODEL_FILE} (exports "
                          "before this version did not copy it): pass --tokenizer-model with the TokenizerGen "
                          "artifact's tokenizer.model")
    flatbuffer = convert(model, quantize)
    parent = os.path.dirname(os.path.abspath(output_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".tflite-", dir=parent)
    try:
        with open(os.path.join(staging, TFLITE_FILE), "wb") as f:
            f.write(flatbuffer)
        if kind == "sentencepiece":
            tf.io.gfile.copy(sp_model, os.path.join(staging, MODEL_FILE))
        with open(os.path.join(staging, CONFIG_FILE), "w") as f:
            json.dump({"model": config["model"], "tokenizer": kind, "quantize": quantize,
                       "source": os.path.abspath(model_dir), "eos_id": EOS_ID, "pad_id": PAD_ID,
                       "num_reserved": NUM_RESERVED}, f, indent=2, sort_keys=True)
        _check_replaceable(output_dir)  # again: something may have appeared while converting
        previous = None
        if os.path.exists(output_dir):  # an earlier export: moved aside, removed once the new one is in place
            previous = tempfile.mkdtemp(prefix=".tflite-old-", dir=parent)
            os.replace(output_dir, os.path.join(previous, "export"))
        try:
            os.replace(staging, output_dir)
        except BaseException:
            if previous:  # put the earlier export back (kept aside if even that fails)
                os.replace(os.path.join(previous, "export"), output_dir)
                shutil.rmtree(previous, ignore_errors=True)
            raise
        if previous:
            shutil.rmtree(previous, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return os.path.join(output_dir, TFLITE_FILE)


def _check_replaceable(output_dir: str) -> None:
    """Raises ExportError unless ``output_dir`` is absent, empty or an earlier export (only this module's files)."""
    if not os.path.lexists(output_dir):
        return
    if not os.path.isdir(output_dir) or os.path.islink(output_dir):
        raise ExportError(f"--output {output_dir}: exists and is not a directory; choose a new path")
    entries = set(os.listdir(output_dir))
    foreign = sorted(entries - {TFLITE_FILE, CONFIG_FILE, MODEL_FILE})
    if entries and (foreign or CONFIG_FILE not in entries):
        what = f"holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}" if foreign else \
            f"has no {CONFIG_FILE}"
        raise ExportError(f"--output {output_dir}: exists and is not an earlier TFLite export (it {what}); "
                          "nothing was written: choose a new path or an empty directory, or remove it yourself")
