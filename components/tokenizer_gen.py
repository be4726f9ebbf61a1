"""TokenizerGen: learns the subword tokenizer from the train split, as an artifact of its own.

SentencePiece's model is an op attribute of ``tensorflow_text``'s tokenizer, so
it cannot be produced by a tf.Transform analyzer; it is learned here, upstream
of Transform, and passed on as a ``Tokenizer`` artifact.

Memory is bounded: Beam keeps at most ``max_sentences`` lines, the ones with
the smallest seeded hash (a deterministic sample), and SentencePiece trains on
those in this process. When the corpus cannot support the requested vocabulary
size, the size is reduced to what SentencePiece reports as possible, logged,
and recorded as the artifact's ``vocab_size``.

With a ``base_tokenizer`` input (the tokenizer of the latest blessed model),
nothing is learned: that tokenizer is carried over, so that warm-starting from
the blessed model stays valid.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re

import apache_beam as beam
import tensorflow as tf
from tfx import types
from tfx.dsl.components.base import base_beam_component, base_beam_executor, executor_spec
from tfx.types import artifact_utils, standard_artifacts
from tfx.types.component_spec import ChannelParameter, ExecutionParameter

from deepseek_tfx.components import mlmd
from deepseek_tfx.components.mlmd import BASE_TOKENIZER_KEY, EXAMPLES_KEY, SPAN_PROPERTY, TOKENIZER_KEY
from deepseek_tfx.trainer_module.config import TokenizerConfig
from deepseek_tfx.trainer_module.tokenizer import BOS_ID, EOS_ID, INFO_FILE, MODEL_FILE, PAD_ID, UNK_ID, ByteTokenizer

log = logging.getLogger(__name__)

VOCAB_FILE = "tokenizer.vocab"
_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_SMALL = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


class Tokenizer(types.Artifact):
    """A learned tokenizer: ``tokenizer.model`` (SentencePiece), ``tokenizer.vocab``, ``tokenizer.json``.

    Custom properties: ``tokenizer_type``, ``vocab_size``, ``sample_size``, ``span``
    (and ``reused_from_artifact_id`` when carried over). They are custom properties,
    and the type name is namespaced, because the Kubeflow V2 / Vertex compiler
    accepts custom artifact types only in that form.
    """

    TYPE_NAME = "deepseek_tfx.Tokenizer"


class TokenizerError(ValueError):
    """The tokenizer cannot be learned as configured; the message names the field."""


def train_sentencepiece(sentences: list[str], model_type: str, vocab_size: int) -> tuple[bytes, int]:
    """Learns a SentencePiece model; returns (serialized model, actual vocabulary size).

    Raises:
        TokenizerError: the vocabulary cannot even hold the characters SentencePiece requires.
    """
    import sentencepiece as spm  # noqa: PLC0415

    options = dict(
        model_type=model_type, vocab_size=vocab_size, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID,
        eos_id=EOS_ID, byte_fallback=True, character_coverage=0.9995, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=False, allow_whitespace_only_pieces=True,
        split_digits=True, max_sentence_length=1 << 16, input_sentence_size=0, shuffle_input_sentence=False,
        num_threads=os.cpu_count() or 1, minloglevel=2,
    )
    while True:
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(sentence_iterator=iter(sentences), model_writer=model, **options)
            return model.getvalue(), options["vocab_size"]
        except RuntimeError as e:
            too_high, too_small = _TOO_HIGH.search(str(e)), _TOO_SMALL.search(str(e))
            if too_high and int(too_high.group(2)) < options["vocab_size"]:
                log.warning("Corpus too small for vocab_size %d: reduced to %d, the most SentencePiece "
                            "can learn from %d sentences", options["vocab_size"], int(too_high.group(2)),
                            len(sentences))
                options["vocab_size"] = int(too_high.group(2))
                continue
            if too_small:
                raise TokenizerError(
                    f"TokenizerConfig.vocab_size={vocab_size} is too small: this corpus needs at least "
                    f"{too_small.group(2)} pieces (characters it must cover plus byte fallback)") from None
            raise


def _sample_key(seed: int):
    def key(line: str) -> bytes:
        return hashlib.sha1(f"{seed}:{line}".encode()).digest()
    return key


def _document_lines(record: bytes):
    example = tf.train.Example.FromString(record)
    text = example.features.feature["text"].bytes_list.value[0].decode("utf-8")
    return [line for line in text.split("\n") if line.strip()]


def _write_sample(lines: list[str], path: str) -> None:
    with tf.io.gfile.GFile(path, "w") as f:
        json.dump(lines, f)


class Executor(base_beam_executor.BaseBeamExecutor):
    """Samples the train split with Beam, then trains (or carries over) the tokenizer."""

    def Do(self, input_dict, output_dict, exec_properties) -> None:  # noqa: N802
        examples = list(input_dict[EXAMPLES_KEY])  # one per span of the window (retrain --last-spans)
        tokenizer = artifact_utils.get_single_instance(output_dict[TOKENIZER_KEY])
        # ExampleGen records the span as a custom property; the tokenizer carries the newest.
        tokenizer.set_int_custom_property(SPAN_PROPERTY, max(mlmd.span(e) for e in examples))
        base = input_dict.get(BASE_TOKENIZER_KEY) or []
        if base:
            self._carry_over(base[0], tokenizer)
            return
        config = TokenizerConfig(kind=exec_properties["kind"], model_type=exec_properties["model_type"],
                                 vocab_size=exec_properties["vocab_size"],
                                 max_sentences=exec_properties["max_sentences"], seed=exec_properties["seed"])
        tf.io.gfile.makedirs(tokenizer.uri)
        if config.kind == "byte":
            self._write(tokenizer, {"type": "byte", "vocab_size": ByteTokenizer.vocab_size}, sample_size=0)
            return
        sample_path = os.path.join(self._get_tmp_dir(), "sample.json")
        patterns = [os.path.join(uri, "*") for uri in artifact_utils.get_split_uris(examples, "train")]
        with self._make_beam_pipeline() as pipeline:
            _ = (pipeline
                 | "TrainSplitPatterns" >> beam.Create(patterns)
                 | "ReadTrainSplits" >> beam.io.ReadAllFromTFRecord()
                 | "Lines" >> beam.FlatMap(_document_lines)
                 | "Sample" >> beam.combiners.Top.Of(config.max_sentences, key=_sample_key(config.seed),
                                                     reverse=True)
                 | "WriteSample" >> beam.Map(_write_sample, sample_path))
        with tf.io.gfile.GFile(sample_path) as f:
            sentences = json.load(f)
        model, vocab_size = train_sentencepiece(sentences, config.model_type, config.vocab_size)
        with tf.io.gfile.GFile(os.path.join(tokenizer.uri, MODEL_FILE), "wb") as f:
            f.write(model)
        self._write_vocab(model, os.path.join(tokenizer.uri, VOCAB_FILE))
        self._write(tokenizer, {"type": "sentencepiece", "model_type": config.model_type,
                                "vocab_size": vocab_size, "requested_vocab_size": config.vocab_size},
                    sample_size=len(sentences))
        log.info("Learned a %s tokenizer of %d pieces from %d sampled lines", config.model_type, vocab_size,
                 len(sentences))

    @staticmethod
    def _write_vocab(model: bytes, path: str) -> None:
        import sentencepiece as spm  # noqa: PLC0415

        processor = spm.SentencePieceProcessor(model_proto=model)
        with tf.io.gfile.GFile(path, "w") as f:
            for i in range(processor.get_piece_size()):
                f.write(f"{processor.id_to_piece(i)}\t{processor.get_score(i)}\n")

    @staticmethod
    def _write(tokenizer, info: dict, sample_size: int) -> None:
        with tf.io.gfile.GFile(os.path.join(tokenizer.uri, INFO_FILE), "w") as f:
            json.dump(info, f, indent=2, sort_keys=True)
        tokenizer.set_string_custom_property("tokenizer_type", info.get("model_type", info["type"]))
        tokenizer.set_int_custom_property("vocab_size", int(info["vocab_size"]))
        tokenizer.set_int_custom_property("sample_size", sample_size)

    @staticmethod
    def _carry_over(base, tokenizer) -> None:
        tf.io.gfile.makedirs(tokenizer.uri)
        for name in tf.io.gfile.listdir(base.uri):
            tf.io.gfile.copy(os.path.join(base.uri, name), os.path.join(tokenizer.uri, name), overwrite=True)
        tokenizer.set_string_custom_property("tokenizer_type", base.get_string_custom_property("tokenizer_type"))
        for name in ("vocab_size", "sample_size"):
            tokenizer.set_int_custom_property(name, base.get_int_custom_property(name))
        tokenizer.set_int_custom_property("reused_from_artifact_id", base.id)
        log.info("Reusing tokenizer #%d (the latest blessed model's)", base.id)


class TokenizerGenSpec(types.ComponentSpec):
    PARAMETERS = {
        "kind": ExecutionParameter(type=str),
        "model_type": ExecutionParameter(type=str),
        "vocab_size": ExecutionParameter(type=int),
        "max_sentences": ExecutionParameter(type=int),
        "seed": ExecutionParameter(type=int),
    }
    INPUTS = {
        EXAMPLES_KEY: ChannelParameter(type=standard_artifacts.Examples),
        BASE_TOKENIZER_KEY: ChannelParameter(type=Tokenizer, optional=True),
    }
    OUTPUTS = {TOKENIZER_KEY: ChannelParameter(type=Tokenizer)}


class TokenizerGen(base_beam_component.BaseBeamComponent):
    """Learns a SentencePiece (or byte) tokenizer from the ``train`` split of ``examples``.

    Args:
        examples: ExampleGen's output (one artifact per span of the window); only the train splits are read.
        config: what to learn (kind, model type, vocabulary size, sample cap, seed).
        base_tokenizer: optional channel with a tokenizer to carry over instead of learning one.
    """

    SPEC_CLASS = TokenizerGenSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(Executor)

    def __init__(self, examples, config: TokenizerConfig, base_tokenizer=None):
        super().__init__(spec=TokenizerGenSpec(
            examples=examples, base_tokenizer=base_tokenizer,
            tokenizer=types.Channel(type=Tokenizer),
            kind=config.kind, model_type=config.model_type, vocab_size=config.vocab_size,
            max_sentences=config.max_sentences, seed=config.seed))
