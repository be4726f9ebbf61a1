"""Stand-ins for the Transform output, so tests can export the serving signatures without a pipeline run."""

import tensorflow as tf

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
