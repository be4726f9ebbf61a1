"""Stand-ins for the Transform output, so tests can export the serving signatures without a pipeline run."""

import tensorflow as tf

from deepseek_tfx.trainer_module.config import get_preset
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.tokenizer import ByteTokenizer

RAW_SPEC = {"text": tf.io.FixedLenFeature([1], tf.string)}


class TransformStandIn:
    """What the Transform layer computes for this tokenizer (the real one is tested end to end)."""

    def __call__(self, features):
        text = tf.reshape(features["text"], [-1])
        return {"token_ids": ByteTokenizer().tokenize(text).to_sparse(),
                "num_bytes": tf.strings.length(text, unit="BYTE")}


class TransformOutputStandIn:
    """The two TFTransformOutput methods export_serving_model uses."""

    def raw_feature_spec(self):
        return dict(RAW_SPEC)

    def transform_features_layer(self):
        return TransformStandIn()


def tiny_model(context_len: int, seed: int) -> DeepSeekLM:
    """The ``tiny`` preset over the byte tokenizer's 260 ids, random weights from ``seed``, built."""
    tf.random.set_seed(seed)
    model = DeepSeekLM(get_preset("tiny").model.replace(vocab_size=260, context_len=context_len))
    model(tf.zeros([1, 4], tf.int64))
    return model
