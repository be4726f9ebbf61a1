"""Packing Transform's per-document ids into training blocks."""

import numpy as np
import tensorflow as tf

from deepseek_tfx.trainer_module import data
from deepseek_tfx.trainer_module.tokenizer import EOS_ID


def write_transformed(path, docs):
    with tf.io.TFRecordWriter(str(path), options="GZIP") as writer:
        for ids in docs:
            example = tf.train.Example()
            example.features.feature["token_ids"].int64_list.value.extend(ids)
            example.features.feature["num_bytes"].int64_list.value.append(len(ids))
            writer.write(example.SerializeToString())


def test_blocks_are_documents_joined_by_eos_with_shifted_targets(tmp_path):
    docs = [[10, 11, 12], [20, 21], [30, 31, 32, 33]]
    write_transformed(tmp_path / "part.gz", docs)
    ds = data.packed_blocks([str(tmp_path / "*.gz")], context_len=4, batch_size=1, seed=0,
                            shuffle=False, repeat=False)
    stream = [10, 11, 12, EOS_ID, 20, 21, EOS_ID, 30, 31, 32, 33, EOS_ID]
    blocks = [(x.numpy()[0].tolist(), y.numpy()[0].tolist()) for x, y in ds]
    assert blocks == [(stream[0:4], stream[1:5]), (stream[5:9], stream[6:10])]


def test_shuffled_stream_is_deterministic_for_a_seed(tmp_path):
    rng = np.random.default_rng(0)
    docs = [rng.integers(4, 260, size=rng.integers(5, 40)).tolist() for _ in range(200)]
    write_transformed(tmp_path / "a.gz", docs[:100])
    write_transformed(tmp_path / "b.gz", docs[100:])

    def first_batches(seed):
        ds = data.packed_blocks([str(tmp_path / "*.gz")], 16, 4, seed=seed, shuffle_buffer=64)
        return [x.numpy() for x, _ in ds.take(3)]

    np.testing.assert_array_equal(first_batches(1), first_batches(1))
    assert not np.array_equal(first_batches(1), first_batches(2))
