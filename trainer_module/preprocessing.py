"""Transform's ``preprocessing_fn``: one document in, its token ids and sizes out.

Outputs per document:
  * ``token_ids``: int64, variable length (a VarLenFeature after Transform).
  * ``num_bytes``: int64, UTF-8 bytes of the text (the denominator of bits per byte).
  * ``num_chars``, ``replacement_chars``: int64, characters, and how many of them are U+FFFD (what
    ExampleGen put in place of invalid UTF-8); the data checks (components.data_checks) read their
    share from Transform's post-transform statistics.

``stats_options_updater_fn`` makes those statistics count ``token_ids`` as categorical, so they hold the
token frequencies that the drift check compares between spans.

Packing ids into training blocks is not done here: it belongs to the Trainer's
tf.data input, so one tokenized dataset serves any context length.
"""

from __future__ import annotations

import tensorflow as tf

from deepseek_tfx.trainer_module.tokenizer import TOKENIZER_DIR_KEY, load_tokenizer

TEXT = "text"
TOKEN_IDS = "token_ids"
REPLACEMENT_CHAR = 0xFFFD


def preprocessing_fn(inputs: dict, custom_config: dict | None = None) -> dict:
    """Tokenizes with the tokenizer in ``custom_config['tokenizer_dir']`` (the Tokenizer artifact)."""
    text = inputs[TEXT]
    if isinstance(text, tf.SparseTensor):
        text = tf.sparse.to_dense(text, default_value="")
    text = tf.reshape(text, [-1])
    ids = load_tokenizer((custom_config or {}).get(TOKENIZER_DIR_KEY)).tokenize(text)
    chars = tf.strings.unicode_decode(text, "UTF-8", errors="replace")  # [B, (chars)]
    return {
        TOKEN_IDS: ids.to_sparse(),
        "num_bytes": tf.cast(tf.strings.length(text, unit="BYTE"), tf.int64),
        "num_chars": tf.cast(chars.row_lengths(), tf.int64),
        "replacement_chars": tf.reduce_sum(tf.cast(tf.equal(chars, REPLACEMENT_CHAR), tf.int64), axis=1),
    }


def stats_options_updater_fn(stats_type, stats_options):
    """Transform's statistics options: post-transform ``token_ids`` are categorical (top-k token counts)."""
    from tensorflow_metadata.proto.v0 import schema_pb2  # noqa: PLC0415

    if stats_type.name != "POST_TRANSFORM" or stats_options.schema is None:
        return stats_options
    schema = schema_pb2.Schema()
    schema.CopyFrom(stats_options.schema)
    for feature in schema.feature:
        if feature.name == TOKEN_IDS:
            feature.int_domain.is_categorical = True
    stats_options.schema = schema
    return stats_options
