"""In-graph tokenizers shared by Transform, training, evaluation and serving.

Every tokenizer here is made of TensorFlow graph ops, so the same ops run in the
Transform graph and inside the exported SavedModel (no train/serve skew).

Reserved ids, for every tokenizer: pad 0, unk 1, bos 2, eos 3. ``eos`` also
separates packed documents and starts a document for scoring and generation.
"""

from __future__ import annotations

import tensorflow as tf

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
