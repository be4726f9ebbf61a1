"""In-graph tokenizers shared by Transform, training, evaluation and serving.

Every tokenizer here is made of TensorFlow graph ops, so the same ops run in the
Transform graph and inside the exported SavedModel (no train/serve skew):

* ``sentencepiece`` (default): a SentencePiece BPE or unigram model learned from
  the corpus by the TokenizerGen component, applied with ``tensorflow_text``.
  Byte fallback makes every input encodable; with identity normalization, no
  dummy prefix and extra whitespace kept, ``detokenize(tokenize(x)) == x`` for
  valid UTF-8 (spaces, runs of spaces, tabs, newlines included).
* ``byte``: ids are UTF-8 bytes + 4; core TensorFlow ops only.

Reserved ids, for every tokenizer: pad 0, unk 1, bos 2, eos 3. ``eos`` also
separates packed documents and starts a document for scoring and generation.

Invalid UTF-8: the corpus reader replaces it with U+FFFD before tokenization.
Text that reaches a tokenizer directly (serving) with invalid bytes: the byte
tokenizer keeps the raw bytes; SentencePiece sees U+FFFD for each invalid byte
sequence (its normalizer's rule). Detokenized output is always valid UTF-8:
any invalid byte sequence produced by byte-fallback pieces becomes U+FFFD.
"""

from __future__ import annotations

import hashlib
import json
import os

import tensorflow as tf

MODEL_FILE = "tokenizer.model"
TOKENIZER_DIR_KEY = "tokenizer_dir"
"""custom_config key under which Transform and the Trainer receive the Tokenizer artifact's directory."""
INFO_FILE = "tokenizer.json"

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
NUM_RESERVED = 4


class ByteTokenizer:
    """Lossless byte-level tokenizer: id = UTF-8 byte + 4.

    Uses only core TensorFlow ops. Every byte string, valid UTF-8 or not, maps to
    ids and back exactly; ``detokenize`` drops reserved ids and, when asked,
    replaces invalid UTF-8 in its output with U+FFFD so that clients always get
    valid text.
    """

    kind = "byte"
    vocab_size = 256 + NUM_RESERVED
    fingerprint = "byte"
    """Equal for two tokenizers exactly when they map text to the same ids."""

    def tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        """Maps strings [B] to int64 ids [B, (n)]."""
        text = tf.convert_to_tensor(text, tf.string)
        pieces = tf.strings.bytes_split(text)  # [B, (n)] one-byte strings
        values = tf.reshape(tf.io.decode_raw(pieces.flat_values, tf.uint8), [-1])
        return pieces.with_flat_values(tf.cast(values, tf.int64) + NUM_RESERVED)

    def detokenize(self, ids, replace_invalid_utf8: bool = True) -> tf.Tensor:
        """Maps ids [B, (n)] (ragged or dense) to strings [B]."""
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids)
        ids = tf.cast(ids, tf.int64)
        keep = tf.ragged.boolean_mask(ids, ids >= NUM_RESERVED)
        table = tf.constant([bytes([b]) for b in range(256)])
        pieces = tf.gather(table, keep - NUM_RESERVED)
        text = tf.strings.reduce_join(pieces, axis=-1)
        if replace_invalid_utf8:
            text = tf.strings.unicode_transcode(
                text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
            )
        return text


def _valid_utf8(text: tf.Tensor) -> tf.Tensor:
    return tf.strings.unicode_transcode(text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)


class SentencePieceTokenizer:
    """A learned SentencePiece model applied in-graph with tensorflow_text.

    Args:
        model_proto: the serialized SentencePiece ModelProto (``tokenizer.model``).
    """

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes):
        import sentencepiece  # noqa: PLC0415
        import tensorflow_text as tf_text  # noqa: PLC0415  (registers the custom ops)

        self.model_proto = model_proto
        self.fingerprint = "sentencepiece:" + hashlib.sha256(model_proto).hexdigest()
        self.sp = tf_text.SentencepieceTokenizer(model=model_proto, out_type=tf.int32)
        # Read from the proto, not the op: this also works while a graph is being traced.
        self.vocab_size = sentencepiece.SentencePieceProcessor(model_proto=model_proto).get_piece_size()

    def tokenize(self, text: tf.Tensor) -> tf.RaggedTensor:
        """Maps strings [B] to int64 ids [B, (n)]."""
        return tf.cast(self.sp.tokenize(tf.convert_to_tensor(text, tf.string)), tf.int64)

    def detokenize(self, ids) -> tf.Tensor:
        """Maps ids [B, (n)] (ragged or dense) to valid UTF-8 strings [B], dropping reserved ids."""
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(ids)
        ids = tf.cast(ids, tf.int64)
        keep = tf.ragged.boolean_mask(ids, ids >= NUM_RESERVED)
        return _valid_utf8(self.sp.detokenize(tf.cast(keep, tf.int32)))


def load_tokenizer(directory: str | None):
    """The tokenizer stored by TokenizerGen in ``directory`` (None: the byte tokenizer)."""
    if directory is None:
        return ByteTokenizer()
    with tf.io.gfile.GFile(os.path.join(directory, INFO_FILE)) as f:
        kind = json.load(f)["type"]
    if kind == "byte":
        return ByteTokenizer()
    with tf.io.gfile.GFile(os.path.join(directory, MODEL_FILE), "rb") as f:
        return SentencePieceTokenizer(f.read())
