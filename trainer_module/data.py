"""tf.data input: Transform's per-document ``token_ids`` packed into fixed blocks.

Transform maps one document to its ids; packing happens here (seqio / MaxText
style): documents are concatenated with ``EOS_ID`` after each one, cut into
blocks of ``context_len + 1`` tokens, and each block becomes (inputs, targets)
shifted by one. Reads are interleaved and prefetched; for a given seed the
order is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from deepseek_tfx.trainer_module.tokenizer import EOS_ID

TOKEN_IDS = "token_ids"
_PARSE_BATCH = 256


def _expand(patterns: Sequence[str]) -> list[str]:
    files = sorted({f for p in patterns for f in tf.io.gfile.glob(p)})
    if not files:
        raise FileNotFoundError(f"no transformed examples match {list(patterns)}")
    return files


def document_tokens(patterns: Sequence[str], *, shuffle: bool, seed: int, repeat: bool,
                    shuffle_buffer: int = 1024) -> tf.data.Dataset:
    """A stream of int64 token chunks: each parsed batch of documents, EOS-terminated, flattened."""
    files = _expand(patterns)
    ds = tf.data.Dataset.from_tensor_slices(files)
    if shuffle:
        ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.interleave(
        lambda f: tf.data.TFRecordDataset(f, compression_type="GZIP"),
        cycle_length=min(4, len(files)), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    spec = {TOKEN_IDS: tf.io.VarLenFeature(tf.int64)}

    def parse(serialized):
        ids = tf.RaggedTensor.from_sparse(tf.io.parse_example(serialized, spec)[TOKEN_IDS])
        eos = tf.fill([ids.nrows(), 1], tf.constant(EOS_ID, tf.int64))
        return tf.concat([ids, eos], axis=1).flat_values

    return ds.batch(_PARSE_BATCH).map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def packed_blocks(patterns: Sequence[str], context_len: int, batch_size: int, *, seed: int,
                  shuffle: bool = True, repeat: bool = True, shuffle_buffer: int = 2048
                  ) -> tf.data.Dataset:
    """Batches of (inputs [B, T], targets [B, T]) int64 from packed documents."""
    ds = document_tokens(patterns, shuffle=shuffle, seed=seed, repeat=repeat)
    ds = ds.unbatch().batch(context_len + 1, drop_remainder=True)
    ds = ds.map(lambda block: (block[:-1], block[1:]), num_parallel_calls=tf.data.AUTOTUNE)
    if shuffle:
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

