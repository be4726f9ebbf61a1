"""TextExampleGen's executor run for real (Beam DirectRunner, in memory) on small corpora."""

import glob
import os

import pytest
import tensorflow as tf
from tfx.proto import example_gen_pb2
from tfx.types import standard_artifacts
from tfx.utils import proto_utils

from deepseek_tfx.components.text_example_gen import Executor, TextExampleGen


def run_executor(tmp_path, corpus_dir, pattern="*", eval_buckets=100):
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "examples")
    input_config = example_gen_pb2.Input(splits=[
        example_gen_pb2.Input.Split(name="single_split", pattern=pattern)])
    output_config = example_gen_pb2.Output(split_config=example_gen_pb2.SplitConfig(splits=[
        example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=1000 - eval_buckets),
        example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=eval_buckets)]))
    Executor().Do({}, {"examples": [examples]}, {
        "input_base": str(corpus_dir),
        "input_config": proto_utils.proto_to_json(input_config),
        "output_config": proto_utils.proto_to_json(output_config),
        "output_data_format": example_gen_pb2.FORMAT_TF_EXAMPLE,
        "output_file_format": example_gen_pb2.FORMAT_TFRECORDS_GZIP,
        "max_document_chars": 256,
        "text_field": "text",
    })
    return examples


def read_texts(uri, split):
    files = glob.glob(os.path.join(uri, f"Split-{split}", "*"))
    texts = []
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP"):
        example = tf.train.Example.FromString(record.numpy())
        texts.append(example.features.feature["text"].bytes_list.value[0].decode())
    return texts


def test_executor_writes_splits_and_records_corpus_figures(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = [f"Document number {i}: " + "lorem ipsum " * (i % 7 + 1) for i in range(300)]
    (corpus / "a.txt").write_text("\n\n".join(docs[:200]) + "\n")
    (corpus / "b.md").write_text("\n\n".join(docs[200:]) + "\n")
    (corpus / "bad_bytes.txt").write_bytes(b"broken \xff\xfe bytes here\n")
    (corpus / "logo.png").write_bytes(b"\x89PNG not text")
    examples = run_executor(tmp_path, corpus)

    train, eval_ = read_texts(examples.uri, "train"), read_texts(examples.uri, "eval")
    assert sorted(train + eval_) == sorted(docs + ["broken \ufffd\ufffd bytes here"])
    assert 0 < len(eval_) < len(train)
    props = {k: examples.get_int_custom_property(k) for k in (
        "corpus_files", "corpus_skipped_files", "corpus_documents", "corpus_replaced_invalid_utf8")}
    assert props == {"corpus_files": 3, "corpus_skipped_files": 1, "corpus_documents": 301,
                     "corpus_replaced_invalid_utf8": 2}
    assert os.path.exists(os.path.join(examples.uri, "corpus_summary.json"))

    # Deterministic hash split: the same corpus gives the same eval split.
    again = run_executor(tmp_path / "again", corpus)
    assert sorted(read_texts(again.uri, "eval")) == sorted(eval_)


def test_executor_fails_on_binary_and_on_empty_corpus(tmp_path):
    corpus = tmp_path / "bin"
    corpus.mkdir()
    (corpus / "ok.txt").write_text("fine text\n")
    (corpus / "blob.txt").write_bytes(b"\x00\x01\x02 binary")
    with pytest.raises(Exception, match=r"blob.txt: binary data"):
        run_executor(tmp_path / "o1", corpus)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("")
    (empty / "b.txt").write_text("\n \n\t\n")
    with pytest.raises(Exception, match=r"no documents in corpus .*: its 2 text file\(s\) are empty"):
        run_executor(tmp_path / "o2", empty)


def test_component_validates_its_parameters():
    with pytest.raises(ValueError, match="eval_fraction"):
        TextExampleGen(input_base="/x", eval_fraction=0.0)
    with pytest.raises(ValueError, match="max_document_chars"):
        TextExampleGen(input_base="/x", max_document_chars=8)
    gen = TextExampleGen(input_base="/x", input_pattern="span-{SPAN}/*", eval_fraction=0.05)
    assert gen.exec_properties["max_document_chars"] == 4096
    input_config = proto_utils.json_to_proto(gen.exec_properties["input_config"], example_gen_pb2.Input())
    output_config = proto_utils.json_to_proto(gen.exec_properties["output_config"], example_gen_pb2.Output())
    assert input_config.splits[0].pattern == "span-{SPAN}/*"
    buckets = {s.name: s.hash_buckets for s in output_config.split_config.splits}
    assert buckets == {"train": 950, "eval": 50}


def test_a_corpus_too_small_for_a_split_is_a_clear_error(tmp_path):
    """One paragraph cannot fill both splits: one is empty, and Transform would fail later with a bare
    KeyError; ExampleGen says what is needed instead (whichever split the hash left empty)."""
    from deepseek_tfx.components.text_corpus import CorpusError

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("The only paragraph.\n")
    with pytest.raises(CorpusError, match=r"the corpus is too small: its 1 document\(s\) left the "
                                          r"'(train|eval)' split empty .* at least about \d+ documents"):
        run_executor(tmp_path, corpus)


def test_the_split_check_names_the_split_and_the_way_out(tmp_path):
    from tfx.utils import proto_utils as utils

    from deepseek_tfx.components import text_example_gen
    from deepseek_tfx.components.text_corpus import CorpusError

    output_config = example_gen_pb2.Output(split_config=example_gen_pb2.SplitConfig(splits=[
        example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=900),
        example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=100)]))
    properties = {"output_config": utils.proto_to_json(output_config)}
    for present, empty, advice, needed in (("train", "eval", "a larger", 30), ("eval", "train", "a smaller", 4)):
        uri = tmp_path / empty
        (uri / f"Split-{present}").mkdir(parents=True)
        with tf.io.TFRecordWriter(str(uri / f"Split-{present}" / "data.gz"), "GZIP") as writer:
            writer.write(text_example_gen.text_to_example("a document"))
        (uri / f"Split-{empty}").mkdir()
        with pytest.raises(CorpusError, match=rf"left the '{empty}' split empty .* at least about {needed} "
                                              rf"documents .* or {advice} --eval-fraction"):
            text_example_gen._check_splits_not_empty(str(uri), properties, 1)


def test_a_reference_eval_corpus_is_read_whole_into_one_eval_split(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = [f"Reference document {i}: " + "dolor sit amet " * (i % 5 + 1) for i in range(50)]
    (corpus / "a.txt").write_text("\n\n".join(docs) + "\n")
    component = TextExampleGen(input_base=str(corpus), single_split="eval")
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "examples")
    Executor().Do({}, {"examples": [examples]}, dict(component.exec_properties))
    assert sorted(d for d in os.listdir(examples.uri) if d.startswith("Split-")) == ["Split-eval"]
    assert sorted(read_texts(examples.uri, "eval")) == sorted(docs)
