"""The learned tokenizer: parity with the sentencepiece package, lossless round trips, bad configs."""

import json
import logging

import pytest
import sentencepiece as spm
import tensorflow as tf
from tfx.types import standard_artifacts

from deepseek_tfx.components.text_example_gen import text_to_example
from deepseek_tfx.components.tokenizer_gen import Executor, Tokenizer, TokenizerError, train_sentencepiece
from deepseek_tfx.trainer_module.config import ConfigError, TokenizerConfig
from deepseek_tfx.trainer_module.tokenizer import INFO_FILE, SentencePieceTokenizer, load_tokenizer

HELD_OUT = [
    "It was the best of times, it was the worst of times.",
    "机器学习是人工智能的一个分支。日本語のテキストも、かなとカナ。",
    "emoji 🙂🚀 and flags 🇫🇷",
    "combining accents: e\u0301 a\u0300 n\u0303, precomposed é",
    "\ttabs\tand    runs of   spaces   ",
    "new\nlines\n\n\nand blank ones\n",
    "x" * 5000,
    "",
]


@pytest.fixture(scope="module")
def model(shakespeare):
    lines = [line for line in shakespeare.read_text().split("\n") if line.strip()]
    proto, size = train_sentencepiece(lines[: len(lines) * 9 // 10], "bpe", 1024)
    assert size == 1024
    return proto


def test_in_graph_ids_equal_the_sentencepiece_package(model):
    reference = spm.SentencePieceProcessor(model_proto=model)
    ids = SentencePieceTokenizer(model).tokenize(tf.constant(HELD_OUT)).to_list()
    assert ids == [reference.encode(text) for text in HELD_OUT]
    assert reference.pad_id() == 0 and reference.unk_id() == 1
    assert reference.bos_id() == 2 and reference.eos_id() == 3


def test_detokenize_tokenize_is_the_identity_on_valid_utf8(model):
    tok = SentencePieceTokenizer(model)
    back = tok.detokenize(tok.tokenize(tf.constant(HELD_OUT))).numpy()
    assert [b.decode("utf-8") for b in back] == HELD_OUT
    assert tok.tokenize(tf.constant(["漢"])).to_list()[0] != [1]  # byte fallback, never unk


def test_invalid_utf8_becomes_replacement_characters(model):
    tok = SentencePieceTokenizer(model)
    ids = tok.tokenize(tf.constant([b"ok\xff\xfe!"]))
    assert 1 not in ids.to_list()[0]
    assert tok.detokenize(ids).numpy()[0].decode("utf-8") == "ok\ufffd\ufffd!"


def test_unigram_is_selectable(shakespeare):
    lines = shakespeare.read_text().split("\n")[:3000]
    proto, _ = train_sentencepiece([line for line in lines if line], "unigram", 600)
    reference = spm.SentencePieceProcessor(model_proto=proto)
    assert reference.get_piece_size() == 600
    text = "To be, or not to be"
    assert reference.decode(reference.encode(text)) == text


def test_vocabulary_sizes_that_cannot_work(caplog):
    with pytest.raises(ConfigError, match=r"TokenizerConfig.vocab_size: must be >= 261"):
        TokenizerConfig(vocab_size=200)
    with caplog.at_level(logging.WARNING, logger="deepseek_tfx"):
        _, size = train_sentencepiece(["a tiny corpus", "with few words"] * 5, "bpe", 5000)
    assert 261 <= size < 5000
    assert "reduced to" in caplog.text
    many_chars = ["".join(chr(0x4E00 + i + 300 * k) for i in range(300)) for k in range(10)]
    with pytest.raises(TokenizerError, match=r"TokenizerConfig.vocab_size=300 is too small"):
        train_sentencepiece(many_chars, "bpe", 300)


def _examples(tmp_path, docs):
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "examples")
    examples.split_names = '["train", "eval"]'
    examples.set_int_custom_property("span", 3)  # as ExampleGen records it
    (tmp_path / "examples" / "Split-train").mkdir(parents=True)
    with tf.io.TFRecordWriter(str(tmp_path / "examples" / "Split-train" / "data.gz"), "GZIP") as writer:
        for doc in docs:
            writer.write(text_to_example(doc))
    return examples


def test_executor_learns_from_a_capped_sample_and_can_carry_over(tmp_path, shakespeare):
    docs = shakespeare.read_text()[:150_000].split("\n\n")
    examples = _examples(tmp_path, docs)
    out = Tokenizer()
    out.uri = str(tmp_path / "tok")
    props = dict(kind="sentencepiece", model_type="bpe", vocab_size=700, max_sentences=2000, seed=1)
    executor = Executor(Executor.Context(tmp_dir=str(tmp_path / "tmp"), unique_id="1"))
    executor.Do({"examples": [examples]}, {"tokenizer": [out]}, props)
    assert (out.get_int_custom_property("vocab_size"), out.get_int_custom_property("sample_size"),
            out.get_int_custom_property("span"), out.get_string_custom_property("tokenizer_type")) == \
        (700, 2000, 3, "bpe")
    assert json.loads((tmp_path / "tok" / INFO_FILE).read_text())["vocab_size"] == 700
    assert load_tokenizer(out.uri).vocab_size == 700
    assert len((tmp_path / "tok" / "tokenizer.vocab").read_text().splitlines()) == 700

    again = Tokenizer()
    again.uri = str(tmp_path / "tok2")
    executor.Do({"examples": [examples]}, {"tokenizer": [again]}, props)
    assert (tmp_path / "tok2" / "tokenizer.model").read_bytes() == (tmp_path / "tok" / "tokenizer.model").read_bytes()

    carried = Tokenizer()
    carried.uri = str(tmp_path / "tok3")
    executor.Do({"examples": [examples], "base_tokenizer": [out]}, {"tokenizer": [carried]}, props)
    assert (tmp_path / "tok3" / "tokenizer.model").read_bytes() == (tmp_path / "tok" / "tokenizer.model").read_bytes()
    assert carried.get_int_custom_property("reused_from_artifact_id") == out.id
    assert carried.get_int_custom_property("vocab_size") == 700


def test_executor_records_a_reduced_vocabulary_size(tmp_path):
    """A corpus too small for the requested size: the artifact, tokenizer.json and the model agree on less."""
    docs = [f"a tiny corpus with few words, number {i}" for i in range(20)]
    out = Tokenizer()
    out.uri = str(tmp_path / "tok")
    props = dict(kind="sentencepiece", model_type="bpe", vocab_size=5000, max_sentences=2000, seed=1)
    Executor(Executor.Context(tmp_dir=str(tmp_path / "tmp"), unique_id="1")).Do(
        {"examples": [_examples(tmp_path, docs)]}, {"tokenizer": [out]}, props)
    recorded = out.get_int_custom_property("vocab_size")
    assert 261 <= recorded < 5000
    assert json.loads((tmp_path / "tok" / INFO_FILE).read_text())["vocab_size"] == recorded
    assert load_tokenizer(out.uri).vocab_size == recorded
    assert spm.SentencePieceProcessor(model_file=str(tmp_path / "tok" / "tokenizer.model")).get_piece_size() == recorded
