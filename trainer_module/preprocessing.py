"""Transform's ``preprocessing_fn``: one document in, its token ids and byte count out.

Outputs per document:
  * ``token_ids``: int64, variable length (a VarLenFeature after Transform).
  * ``num_bytes``: int64, UTF-8 bytes of the text (the denominator of bits per byte).

Packing ids into training blocks is not done here: it belongs to the Trainer's
tf.data input, so one tokenized dataset serves any context length.
"""

from __future__ import annotations

import tensorflow as tf

from deepseek_tfx.trainer_module.tokenizer import TOKENIZER_DIR_KEY, load_tokenizer

TEXT = "text"


def preprocessing_fn(inputs: dict, custom_config: dict | None = None) -> dict:
    """Tokenizes with the tokenizer in ``custom_config['tokenizer_dir']`` (the Tokenizer artifact)."""
    text = inputs[TEXT]
    if isinstance(text, tf.SparseTensor):
        text = tf.sparse.to_dense(text, default_value="")
    text = tf.reshape(text, [-1])
    ids = load_tokenizer((custom_config or {}).get(TOKENIZER_DIR_KEY)).tokenize(text)
    return {
        "token_ids": ids.to_sparse(),
        "num_bytes": tf.cast(tf.strings.length(text, unit="BYTE"), tf.int64),
    }
