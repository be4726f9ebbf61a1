"""Exports the trained model as a SavedModel with fixed, explicit signatures.

Signatures (names fixed: clients, the Evaluator and TF Serving rely on them). Every
input has the batch dimension B first and all inputs of one call agree on it, so
TF Serving's request batching (``--enable_batching``) can merge concurrent calls:
  * ``serving_default``: ``examples`` [B] (serialized tf.Example with a ``text``
    feature, the TFX contract used by the Evaluator) -> per example ``nll_sum``
    (nats), ``num_tokens`` and ``num_bytes``.
  * ``generate``: ``prompt`` [B] string and, per row, ``max_new_tokens`` [B] int32,
    ``temperature`` [B] float32 (0 = greedy), ``top_k`` [B] int32 (0 = no cut),
    ``seed`` [B] int32 -> ``text`` [B], the generated continuation.
  * ``score``: ``text`` [B] string -> ``perplexity`` and ``bits_per_byte`` [B].

Limits (``ServingConfig``, recorded in ``assets.extra/deepseek_config.json``) are
enforced in the graph: an empty batch, ``generate`` or ``score`` batches over
``max_batch_size``, a ``score`` text or ``serving_default`` example over
``max_text_bytes``, ``max_new_tokens`` outside [0, limit], a NaN, negative or
infinite ``temperature``, a negative ``top_k`` or inputs of unequal batch sizes
are INVALID_ARGUMENT errors naming the input and the limit. A prompt longer than
``max_prompt_bytes`` keeps its last bytes (cut at a character boundary) before
tokenization. ``serving_default`` takes any batch size (the Evaluator's batches).

Tokenization runs through the Transform graph (the same ops Transform applied
to the training data) and detokenization through the tokenizer's graph ops, so
the SavedModel needs only TensorFlow (and tensorflow_text) to serve.

Scoring: a document's ids are predicted from ``[EOS] + ids[:-1]`` in
consecutive windows of ``context_len`` tokens, each window scored
independently, ``score_chunk_windows`` windows per model call so that memory
does not grow with the text. Generation: the prompt is prefixed with EOS (the
document separator used in training), truncated from the left to
``context_len - 1`` tokens, run once through the model to fill the cache (MLA
caches only the compressed latent and the rotary key), then continued with one
cached decode step per new token until the row's ``max_new_tokens`` or an EOS.
Each row samples from its own seed, so a row's text does not depend on the rows
batched with it. When the cache is full, generation restarts the cache from the
last half context of text; rows of one batch share that restart point, so only
a generation that outlasts the context can differ with its batch mates.
"""

from __future__ import annotations

import json
import math
import os

import tensorflow as tf

from deepseek_tfx.trainer_module.config import ServingConfig
from deepseek_tfx.trainer_module.model import DeepSeekLM, token_nll
from deepseek_tfx.trainer_module.tokenizer import EOS_ID, MODEL_FILE, PAD_ID

CONFIG_FILE = "deepseek_config.json"
WARMUP_FILE = "tf_serving_warmup_requests"
"""TF Serving replays these requests (PredictionLog records in assets.extra/) when it loads a version, before
marking it AVAILABLE: the first real request does not pay for the first run, and a version whose
``generate`` or ``score`` fails never becomes AVAILABLE (InfraValidator's load check sees that too)."""
EXAMPLE_PROMPTS = ("", "First Citizen:\n")
"""The export's own example prompts (an empty prompt included): its warmup requests."""


def score_ids(model: DeepSeekLM, ids: tf.RaggedTensor, context_len: int, chunk_windows: int = 8):
    """Returns (nll_sum float32 [B], num_tokens int64 [B]) for documents of ids [B, (n)].

    The model runs on ``chunk_windows`` windows of ``context_len`` tokens at a time (a while loop), so the
    logits held at once do not grow with the documents' length.
    """
    ids = tf.cast(ids, tf.int64)
    batch = ids.nrows()
    lengths = ids.row_lengths()
    eos = tf.fill([batch, 1], tf.constant(EOS_ID, tf.int64))
    inputs = tf.concat([eos, ids], axis=1)[:, :-1]
    n_windows = tf.maximum(tf.constant(1, tf.int64), tf.cast(tf.math.ceil(
        tf.cast(tf.reduce_max(tf.concat([lengths, [0]], 0)), tf.float32) / context_len), tf.int64))
    width = n_windows * context_len
    x = tf.reshape(inputs.to_tensor(PAD_ID, shape=[batch, width]), [-1, context_len])
    y = tf.reshape(ids.to_tensor(PAD_ID, shape=[batch, width]), [-1, context_len])
    mask = tf.reshape(tf.sequence_mask(lengths, width), [-1, context_len])
    used = tf.where(tf.reduce_any(mask, axis=1))[:, 0]  # windows holding any token
    x, y, mask = tf.gather(x, used), tf.gather(y, used), tf.gather(mask, used)
    rows = used // n_windows  # the document each window belongs to

    def body(start, nll_sum):
        end = start + chunk_windows
        nll = token_nll(model(x[start:end], training=False), y[start:end])
        per_window = tf.reduce_sum(nll * tf.cast(mask[start:end], tf.float32), axis=1)
        return end, nll_sum + tf.math.unsorted_segment_sum(per_window, rows[start:end], batch)

    _, nll_sum = tf.while_loop(lambda start, _: start < tf.shape(x, out_type=tf.int64)[0], body,
                               [tf.constant(0, tf.int64), tf.zeros([batch], tf.float32)])
    return nll_sum, lengths


def _sample(logits, temperature, top_k, seed, step):
    """Per row: greedy when temperature is 0, else top-k sampling at that temperature from the row's seed.

    logits [B, V] f32; temperature [B] f32; top_k, seed [B] int32. Each row draws from
    ``stateless_categorical`` with seed (its seed, step) on its own, so its sample does not depend on the other
    rows of the batch.
    """
    greedy = tf.argmax(logits, axis=-1)
    vocab = tf.shape(logits)[-1]
    k = tf.where(top_k > 0, tf.minimum(top_k, vocab), vocab)  # [B]
    scaled = logits / tf.maximum(temperature, 1e-6)[:, None]
    kth = tf.gather(tf.math.top_k(scaled, k=tf.reduce_max(k)).values, k - 1, batch_dims=1)[:, None]
    scaled = tf.where(scaled < kth, tf.constant(-1e9, scaled.dtype), scaled)
    sampled = tf.map_fn(
        lambda row: tf.random.stateless_categorical(row[0][None, :], 1, seed=tf.stack([row[1], step]))[0, 0],
        (scaled, seed), fn_output_signature=tf.int64)
    return tf.where(temperature > 0, sampled, greedy)


def _keep_last_bytes(text, limit: int):
    """Each string's last ``limit`` bytes, cut at a UTF-8 character boundary (leading continuation bytes
    dropped); strings within the limit are unchanged."""
    start = tf.maximum(tf.strings.length(text) - limit, 0)
    cut = tf.strings.substr(text, start, tf.fill(tf.shape(text), limit))
    head = tf.io.decode_raw(tf.strings.substr(tf.strings.join([cut, "AAA"]), 0, 3), tf.uint8)  # [B, 3]
    continuation = tf.cast(tf.equal(tf.bitwise.bitwise_and(head, 0xC0), 0x80), tf.int32)
    skip = tf.reduce_sum(tf.math.cumprod(continuation, axis=1), axis=1)
    return tf.where(start > 0, tf.strings.substr(cut, skip, tf.fill(tf.shape(text), limit)), text)


def _require(condition, *message):
    """An assertion that fails with INVALID_ARGUMENT and ``message`` (strings and tensors)."""
    return tf.debugging.Assert(condition, list(message), summarize=8)


class _Untracked:
    """Holds an object without SavedModel tracking it."""

    def __init__(self, obj):
        self.obj = obj


class LanguageModelModule(tf.Module):
    """What the SavedModel holds: the model's variables, the Transform layer and the detokenizer.

    The Keras model itself is not tracked: tf_keras would serialize its own
    call traces (autograph-converting them at export), which the signatures
    do not need. Its variables are tracked, so the signatures capture them.
    """

    def __init__(self, model: DeepSeekLM, tft_layer, raw_feature_spec, tokenizer,
                 limits: ServingConfig | None = None, stop_at_eos: bool = True):
        super().__init__(name="deepseek_lm")
        self._model = _Untracked(model)
        self.model_variables = list(model.variables)
        self.tft_layer = tft_layer
        self._raw_feature_spec = raw_feature_spec
        self._tokenizer = tokenizer
        if hasattr(tokenizer, "sp"):  # the SentencePiece op's resource must be tracked to be saved
            self.sentencepiece = tokenizer.sp
        self._context_len = model.config.context_len
        self._limits = limits or ServingConfig()
        self._stop_at_eos = stop_at_eos  # False only for benchmarks that need every new token

    @property
    def model(self) -> DeepSeekLM:
        return self._model.obj

    @property
    def limits(self) -> ServingConfig:
        return self._limits

    def _raw_text(self, text):
        """Shapes a [B] string batch as the schema's ``text`` feature (e.g. [B, 1])."""
        return {"text": tf.reshape(text, [-1, *self._raw_feature_spec["text"].shape])}

    def _tokenize(self, text):
        ids = self.tft_layer(self._raw_text(text))["token_ids"]
        return tf.RaggedTensor.from_sparse(ids)

    def _score_features(self, features):
        transformed = self.tft_layer(features)
        ids = tf.RaggedTensor.from_sparse(transformed["token_ids"])
        nll_sum, num_tokens = score_ids(self.model, ids, self._context_len, self._limits.score_chunk_windows)
        return nll_sum, num_tokens, tf.reshape(transformed["num_bytes"], [-1])

    def _batch_checks(self, name, batch, limit_batch: bool = True):
        checks = [_require(batch > 0, f"{name}: empty batch; send at least one row")]
        if limit_batch:
            limit = self._limits.max_batch_size
            checks.append(_require(batch <= limit, f"{name}: batch of", batch,
                                   f"rows is over the model limit max_batch_size={limit}; "
                                   "split the request"))
        return checks

    def _text_checks(self, name, text):
        limit = self._limits.max_text_bytes
        longest = tf.reduce_max(tf.concat([tf.reshape(tf.strings.length(text), [-1]), [0]], 0))
        return [_require(longest <= limit, f"{name}: a text of", longest,
                         f"bytes is over the model limit max_text_bytes={limit}")]

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve_examples(self, examples):
        features = tf.io.parse_example(examples, self._raw_feature_spec)
        checks = self._batch_checks("examples", tf.size(examples), limit_batch=False)
        checks += self._text_checks("examples", features["text"])
        with tf.control_dependencies(checks):
            features = {k: tf.identity(v) for k, v in features.items()}
        nll_sum, num_tokens, num_bytes = self._score_features(features)
        return {"nll_sum": nll_sum, "num_tokens": num_tokens, "num_bytes": num_bytes}

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def score(self, text):
        with tf.control_dependencies(self._batch_checks("text", tf.size(text)) + self._text_checks("text", text)):
            text = tf.identity(text)
        nll_sum, num_tokens, num_bytes = self._score_features(self._raw_text(text))
        tokens = tf.cast(num_tokens, tf.float32)
        return {
            "perplexity": tf.exp(tf.math.divide_no_nan(nll_sum, tokens)),
            "bits_per_byte": tf.math.divide_no_nan(nll_sum, math.log(2) * tf.cast(num_bytes, tf.float32)),
        }

    def _generate_checks(self, prompt, max_new_tokens, temperature, top_k, seed):
        batch = tf.size(prompt)
        checks = self._batch_checks("prompt", batch)
        for name, value in (("max_new_tokens", max_new_tokens), ("temperature", temperature),
                            ("top_k", top_k), ("seed", seed)):
            checks.append(_require(tf.equal(tf.size(value), batch), f"{name}: has", tf.size(value),
                                   "values for", batch, "prompts; send one value per prompt"))
        limit = self._limits.max_new_tokens
        checks.append(_require(tf.reduce_all((max_new_tokens >= 0) & (max_new_tokens <= limit)),
                               f"max_new_tokens: each value must be within [0, {limit}] "
                               f"(the model limit max_new_tokens={limit}); got", max_new_tokens))
        checks.append(_require(tf.reduce_all(tf.math.is_finite(temperature) & (temperature >= 0)),
                               "temperature: each value must be a finite number >= 0 (0 = greedy); got",
                               temperature))
        checks.append(_require(tf.reduce_all(top_k >= 0), "top_k: each value must be >= 0 (0 = no cut); got",
                               top_k))
        return checks

    @tf.function(autograph=False, input_signature=[
        tf.TensorSpec([None], tf.string, name="prompt"),
        tf.TensorSpec([None], tf.int32, name="max_new_tokens"),
        tf.TensorSpec([None], tf.float32, name="temperature"),
        tf.TensorSpec([None], tf.int32, name="top_k"),
        tf.TensorSpec([None], tf.int32, name="seed"),
    ])
    def generate(self, prompt, max_new_tokens, temperature, top_k, seed):
        with tf.control_dependencies(self._generate_checks(prompt, max_new_tokens, temperature, top_k, seed)):
            prompt = tf.identity(prompt)
        t = self._context_len
        ids = self._tokenize(_keep_last_bytes(prompt, self._limits.max_prompt_bytes))
        batch = ids.nrows()
        eos = tf.fill([batch, 1], tf.constant(EOS_ID, tf.int64))
        ids = tf.concat([eos, ids], axis=1)
        # Left-truncate to context_len - 1 (one cache slot stays free), then left-pad to a common
        # length; PAD slots are masked out of attention, so padding does not change the result.
        lengths = tf.minimum(ids.row_lengths(), t - 1)
        ids = tf.ragged.boolean_mask(
            ids, tf.ragged.range(ids.row_lengths()) >= tf.expand_dims(ids.row_lengths() - lengths, 1))
        longest = tf.reduce_max(lengths)
        pad = tf.RaggedTensor.from_row_lengths(
            tf.fill([tf.reduce_sum(longest - lengths)], tf.constant(PAD_ID, tf.int64)), longest - lengths)
        tokens = tf.concat([pad, ids], axis=1).to_tensor()
        steps = tf.reduce_max(max_new_tokens)
        logits, caches, valid = self._prefill(tokens)
        position = tf.cast(longest, tf.int32)
        # Fixed-size loop state, so a step costs the same at every position: the last t tokens of text
        # (for the slide) and the new ids in a buffer of the longest row's length.
        window = tf.concat([tf.fill([batch, t - longest], tf.constant(PAD_ID, tf.int64)), tokens], axis=1)
        generated = tf.fill([batch, steps], tf.constant(PAD_ID, tf.int64))

        def body(i, generated, window, caches, valid, position, logits, done):
            nxt = _sample(logits, temperature, top_k, seed, i)
            nxt = tf.where(done, tf.constant(PAD_ID, tf.int64), nxt)
            if self._stop_at_eos:
                done = tf.logical_or(done, tf.equal(nxt, EOS_ID))
            done = tf.logical_or(done, i + 1 >= max_new_tokens)  # the row's own budget is spent
            generated = tf.tensor_scatter_nd_update(
                generated, tf.stack([tf.range(batch), tf.fill([batch], tf.cast(i, batch.dtype))], axis=1), nxt)
            window = tf.concat([window[:, 1:], nxt[:, None]], axis=1)

            def step():
                now_valid = tf.logical_or(valid, tf.cast(tf.one_hot(position, t), tf.bool)[None, :])
                new_logits, new_caches = self.model.decode_step(nxt, caches, position, now_valid)
                return new_logits, new_caches, now_valid, position + 1

            def slide():  # cache full: restart from the last half context of text
                new_logits, new_caches, new_valid = self._prefill(window[:, -(t // 2):])
                return new_logits, new_caches, new_valid, tf.constant(t // 2, tf.int32)

            logits, caches, valid, position = tf.cond(position < t, step, slide)
            return i + 1, generated, window, caches, valid, position, logits, done

        state = [tf.constant(0), generated, window, caches, valid, position, logits, max_new_tokens <= 0]
        invariants = tf.nest.map_structure(lambda x: tf.TensorShape([None] * len(x.shape)), state)
        invariants[0] = invariants[5] = tf.TensorShape([])
        state = tf.while_loop(
            lambda i, *rest: tf.logical_and(i < steps, tf.logical_not(tf.reduce_all(rest[-1]))),
            body, state, shape_invariants=invariants)
        return {"text": self._tokenizer.detokenize(state[1][:, :state[0]])}

    def _prefill(self, tokens):
        """Runs the prompt [B, L] (L < context_len) into a context_len-slot cache.

        Returns (last-position logits [B, V], caches, valid-slot mask [B, context_len]).
        """
        t = self._context_len
        mask = tf.not_equal(tokens, PAD_ID)
        logits, caches = self.model.prefill(tokens, cache_len=t, key_mask=mask)
        valid = tf.pad(mask, [[0, 0], [0, t - tf.shape(tokens)[1]]])
        return logits[:, -1, :], caches, valid


def warmup_requests(signatures, limits: ServingConfig | None = None) -> list:
    """PredictRequests of the example prompts for ``generate`` (up to 4 greedy tokens) and ``score``, kept within
    ``limits`` (so warmup, which must succeed for the version to load, never asks for more than they allow)."""
    from tensorflow_serving.apis import predict_pb2  # noqa: PLC0415  (a tfx dependency; only the export needs it)

    limits = limits or ServingConfig()
    prompts = [p for p in EXAMPLE_PROMPTS if len(p.encode()) <= limits.max_text_bytes][:limits.max_batch_size]
    n = len(prompts)
    inputs = {"generate": {"prompt": prompts, "max_new_tokens": [min(4, limits.max_new_tokens)] * n,
                           "temperature": [0.0] * n, "top_k": [0] * n, "seed": [0] * n},
              "score": {"text": prompts}}
    requests = []
    for name, values in inputs.items():
        dtypes = {spec.name: spec.dtype for spec in tf.nest.flatten(signatures[name].structured_input_signature)}
        request = predict_pb2.PredictRequest()
        request.model_spec.signature_name = name
        for key, value in values.items():
            request.inputs[key].CopyFrom(tf.make_tensor_proto(value, dtype=dtypes[key], shape=[n]))
        requests.append(request)
    return requests


def write_warmup_requests(path: str, signatures, limits: ServingConfig | None = None) -> None:
    """Writes ``warmup_requests`` as TF Serving's warmup file (TFRecord of PredictionLog)."""
    from tensorflow_serving.apis import prediction_log_pb2  # noqa: PLC0415

    with tf.io.TFRecordWriter(path) as writer:
        for request in warmup_requests(signatures, limits):
            log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())


def read_export_config(export_dir: str) -> dict | None:
    """The ``assets.extra/deepseek_config.json`` an export wrote (None when it is missing)."""
    path = os.path.join(export_dir, "assets.extra", CONFIG_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def export_serving_model(model: DeepSeekLM, tf_transform_output, tokenizer, export_dir: str,
                         extra_config: dict | None = None, limits: ServingConfig | None = None) -> None:
    """Writes the SavedModel with the signatures listed in this module's docstring."""
    limits = limits or ServingConfig()
    raw_spec = {k: v for k, v in tf_transform_output.raw_feature_spec().items() if k == "text"}
    module = LanguageModelModule(model, tf_transform_output.transform_features_layer(), raw_spec,
                                 tokenizer, limits)
    signatures = {
        "serving_default": module.serve_examples.get_concrete_function(),
        "generate": module.generate.get_concrete_function(),
        "score": module.score.get_concrete_function(),
    }
    tf.saved_model.save(module, export_dir, signatures=signatures)
    extra = os.path.join(export_dir, "assets.extra")
    tf.io.gfile.makedirs(extra)
    write_warmup_requests(os.path.join(extra, WARMUP_FILE), signatures, limits)
    if getattr(tokenizer, "model_proto", None):  # for exports without TensorFlow (export-tflite)
        with tf.io.gfile.GFile(os.path.join(extra, MODEL_FILE), "wb") as f:
            f.write(tokenizer.model_proto)
    with tf.io.gfile.GFile(os.path.join(extra, CONFIG_FILE), "w") as f:
        json.dump({"model": model.config.to_dict(), "tokenizer": tokenizer.kind,
                   "tokenizer_fingerprint": tokenizer.fingerprint, "vocab_size": tokenizer.vocab_size,
                   "serving": limits.to_dict(), **(extra_config or {})},
                  f, indent=2, sort_keys=True)
