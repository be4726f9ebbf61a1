import tensorflow as tf

from deepseek_tfx.trainer_module.tokenizer import EOS_ID, NUM_RESERVED, ByteTokenizer

TEXTS = ["Hello, world!", "", "  runs  of\tspaces\n\n\nand newlines", "漢字とかな 🙂 e\u0301", "x" * 5000]


def test_ids_are_utf8_bytes_offset_by_reserved_ids():
    ids = ByteTokenizer().tokenize(tf.constant(["aé"]))
    assert ids.to_list() == [[ord("a") + NUM_RESERVED, 0xC3 + NUM_RESERVED, 0xA9 + NUM_RESERVED]]


def test_round_trip_is_exact_for_valid_utf8():
    tok = ByteTokenizer()
    back = tok.detokenize(tok.tokenize(tf.constant(TEXTS))).numpy()
    assert [b.decode("utf-8") for b in back] == TEXTS


def test_invalid_utf8_round_trips_raw_and_is_replaced_for_clients():
    tok = ByteTokenizer()
    raw = b"ok\xff\xfe!"
    ids = tok.tokenize(tf.constant([raw]))
    assert tok.detokenize(ids, replace_invalid_utf8=False).numpy()[0] == raw
    assert tok.detokenize(ids).numpy()[0].decode("utf-8") == "ok\ufffd\ufffd!"


def test_detokenize_drops_reserved_ids():
    tok = ByteTokenizer()
    ids = tf.constant([[EOS_ID, ord("h") + NUM_RESERVED, 0, ord("i") + NUM_RESERVED]], tf.int64)
    assert tok.detokenize(ids).numpy()[0] == b"hi"
