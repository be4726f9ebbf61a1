"""Exports the trained model as a SavedModel with fixed, explicit signatures.

Signatures (names fixed: clients, the Evaluator and TF Serving rely on them):
  * ``serving_default``: ``examples`` (serialized tf.Example with a ``text``
    feature, the TFX contract used by the Evaluator) -> per example ``nll_sum``
    (nats), ``num_tokens`` and ``num_bytes``.
  * ``generate``: ``prompt`` [B] string, ``max_new_tokens`` int32, ``temperature``
    float32 (0 = greedy), ``top_k`` int32 (0 = no cut), ``seed`` int32 ->
    ``text`` [B], the generated continuation.
  * ``score``: ``text`` [B] string -> ``perplexity`` and ``bits_per_byte`` [B].

Tokenization runs through the Transform graph (the same ops Transform applied
to the training data) and detokenization through the tokenizer's graph ops, so
the SavedModel needs only TensorFlow (and tensorflow_text) to serve.

Scoring: a document's ids are predicted from ``[EOS] + ids[:-1]`` in
consecutive windows of ``context_len`` tokens, each window scored
independently. Generation: the prompt is prefixed with EOS (the document
separator used in training), truncated from the left to ``context_len - 1``
tokens, run once through the model to fill the cache (MLA caches only the
compressed latent and the rotary key), then continued with one cached decode
step per new token until ``max_new_tokens`` or an EOS. When the cache is full,
generation restarts the cache from the last half context of text.
"""

from __future__ import annotations

import json
import math
import os

import tensorflow as tf

from deepseek_tfx.trainer_module.model import DeepSeekLM, token_nll
from deepseek_tfx.trainer_module.tokenizer import EOS_ID, PAD_ID

CONFIG_FILE = "deepseek_config.json"


def score_ids(model: DeepSeekLM, ids: tf.RaggedTensor, context_len: int):
    """Returns (nll_sum float32 [B], num_tokens int64 [B]) for documents of ids [B, (n)]."""
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
    nll = token_nll(model(x, training=False), y) * tf.cast(mask, tf.float32)
    per_window = tf.reduce_sum(nll, axis=1)
    nll_sum = tf.math.unsorted_segment_sum(per_window, used // n_windows, batch)
    return nll_sum, lengths


def _sample(logits, temperature, top_k, seed, step):
    """Greedy when temperature <= 0, else top-k sampling at that temperature. logits [B, V] f32."""
    greedy = tf.argmax(logits, axis=-1)
    vocab = tf.shape(logits)[-1]
    k = tf.where(top_k > 0, tf.minimum(top_k, vocab), vocab)
    scaled = logits / tf.maximum(temperature, 1e-6)
    kth = tf.math.top_k(scaled, k=k).values[:, -1:]
    scaled = tf.where(scaled < kth, tf.constant(-1e9, scaled.dtype), scaled)
    sampled = tf.random.stateless_categorical(scaled, 1, seed=tf.stack([seed, step]))[:, 0]
    return tf.where(temperature > 0, sampled, greedy)


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
                 max_new_tokens_limit: int = 512, stop_at_eos: bool = True):
        super().__init__(name="deepseek_lm")
        self._model = _Untracked(model)
        self.model_variables = list(model.variables)
        self.tft_layer = tft_layer
        self._raw_feature_spec = raw_feature_spec
        self._tokenizer = tokenizer
        if hasattr(tokenizer, "sp"):  # the SentencePiece op's resource must be tracked to be saved
            self.sentencepiece = tokenizer.sp
        self._context_len = model.config.context_len
        self._max_new_tokens_limit = max_new_tokens_limit
        self._stop_at_eos = stop_at_eos  # False only for benchmarks that need every new token

    @property
    def model(self) -> DeepSeekLM:
        return self._model.obj

    def _raw_text(self, text):
        """Shapes a [B] string batch as the schema's ``text`` feature (e.g. [B, 1])."""
        return {"text": tf.reshape(text, [-1, *self._raw_feature_spec["text"].shape])}

    def _tokenize(self, text):
        ids = self.tft_layer(self._raw_text(text))["token_ids"]
        return tf.RaggedTensor.from_sparse(ids)

    def _score_features(self, features):
        transformed = self.tft_layer(features)
        ids = tf.RaggedTensor.from_sparse(transformed["token_ids"])
        nll_sum, num_tokens = score_ids(self.model, ids, self._context_len)
        return nll_sum, num_tokens, tf.reshape(transformed["num_bytes"], [-1])

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
    def serve_examples(self, examples):
        features = tf.io.parse_example(examples, self._raw_feature_spec)
        nll_sum, num_tokens, num_bytes = self._score_features(features)
        return {"nll_sum": nll_sum, "num_tokens": num_tokens, "num_bytes": num_bytes}

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def score(self, text):
        nll_sum, num_tokens, num_bytes = self._score_features(self._raw_text(text))
        tokens = tf.cast(num_tokens, tf.float32)
        return {
            "perplexity": tf.exp(tf.math.divide_no_nan(nll_sum, tokens)),
            "bits_per_byte": tf.math.divide_no_nan(nll_sum, math.log(2) * tf.cast(num_bytes, tf.float32)),
        }

    @tf.function(autograph=False, input_signature=[
        tf.TensorSpec([None], tf.string, name="prompt"),
        tf.TensorSpec([], tf.int32, name="max_new_tokens"),
        tf.TensorSpec([], tf.float32, name="temperature"),
        tf.TensorSpec([], tf.int32, name="top_k"),
        tf.TensorSpec([], tf.int32, name="seed"),
    ])
    def generate(self, prompt, max_new_tokens, temperature, top_k, seed):
        t = self._context_len
        ids = self._tokenize(prompt)
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
        steps = tf.clip_by_value(max_new_tokens, 0, self._max_new_tokens_limit)
        logits, caches, valid = self._prefill(tokens)
        position = tf.cast(longest, tf.int32)
        # Fixed-size loop state, so a step costs the same at every position: the last t tokens of text
        # (for the slide) and the new ids in a buffer of the clipped length.
        window = tf.concat([tf.fill([batch, t - longest], tf.constant(PAD_ID, tf.int64)), tokens], axis=1)
        generated = tf.fill([batch, steps], tf.constant(PAD_ID, tf.int64))

        def body(i, generated, window, caches, valid, position, logits, done):
            nxt = _sample(logits, temperature, top_k, seed, i)
            nxt = tf.where(done, tf.constant(PAD_ID, tf.int64), nxt)
            if self._stop_at_eos:
                done = tf.logical_or(done, tf.equal(nxt, EOS_ID))
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

        state = [tf.constant(0), generated, window, caches, valid, position, logits, tf.zeros([batch], tf.bool)]
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


def read_export_config(export_dir: str) -> dict | None:
    """The ``assets.extra/deepseek_config.json`` an export wrote (None when it is missing)."""
    path = os.path.join(export_dir, "assets.extra", CONFIG_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def export_serving_model(model: DeepSeekLM, tf_transform_output, tokenizer, export_dir: str,
                         extra_config: dict | None = None, max_new_tokens_limit: int = 512) -> None:
    """Writes the SavedModel with the signatures listed in this module's docstring."""
    raw_spec = {k: v for k, v in tf_transform_output.raw_feature_spec().items() if k == "text"}
    module = LanguageModelModule(model, tf_transform_output.transform_features_layer(), raw_spec,
                                 tokenizer, max_new_tokens_limit)
    signatures = {
        "serving_default": module.serve_examples.get_concrete_function(),
        "generate": module.generate.get_concrete_function(),
        "score": module.score.get_concrete_function(),
    }
    tf.saved_model.save(module, export_dir, signatures=signatures)
    extra = os.path.join(export_dir, "assets.extra")
    tf.io.gfile.makedirs(extra)
    with tf.io.gfile.GFile(os.path.join(extra, CONFIG_FILE), "w") as f:
        json.dump({"model": model.config.to_dict(), "tokenizer": tokenizer.kind,
                   "tokenizer_fingerprint": tokenizer.fingerprint, "vocab_size": tokenizer.vocab_size,
                   "max_new_tokens_limit": max_new_tokens_limit, **(extra_config or {})},
                  f, indent=2, sort_keys=True)
