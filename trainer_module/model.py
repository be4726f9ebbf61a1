"""The DeepSeek-style decoder-only language model (and its dense GPT-style switch).

Pre-norm blocks: x + Attention(RMSNorm(x)), then x + FFN(RMSNorm(x)), where the
attention is Multi-head Latent Attention (or standard MHA when ``dense``) and the
FFN is DeepSeekMoE (or a dense SwiGLU for the first ``n_dense_layers`` blocks and
for the dense baseline). Input embedding and output head are untied.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras as keras

from trainer_module.config import ModelConfig
from trainer_module.layers import (
    DeepSeekMoE,
    MultiHeadAttention,
    MultiHeadLatentAttention,
    RMSNorm,
    SwiGLU,
    _dense,
)


class DecoderBlock(keras.layers.Layer):
    """One pre-norm decoder block of a DeepSeek-style model.

    Args:
        config: the model's ModelConfig (as a dict or object).
        layer_index: position of the block; blocks below ``n_dense_layers`` use a dense FFN.

    Example:
        >>> block = DecoderBlock(ModelConfig(vocab_size=260), layer_index=0)
        >>> y = block(tf.random.normal([2, 5, 128]))
    """

    def __init__(self, config, layer_index: int, **kwargs):
        super().__init__(**kwargs)
        self.config = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(config)
        self.layer_index = layer_index
        c, policy = self.config, self.dtype_policy
        self.attn_norm = RMSNorm(c.norm_eps, name="attn_norm", dtype=policy)
        self.ffn_norm = RMSNorm(c.norm_eps, name="ffn_norm", dtype=policy)
        if c.dense:
            self.attn = MultiHeadAttention(c.d_model, c.n_heads, c.rope_theta, name="attn", dtype=policy)
        else:
            self.attn = MultiHeadLatentAttention(
                c.d_model, c.n_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim,
                c.qk_rope_head_dim, c.v_head_dim, c.rope_theta, c.norm_eps, name="attn", dtype=policy)
        if c.dense or layer_index < c.n_dense_layers:
            self.ffn = SwiGLU(c.inter_dim, c.d_model, name="ffn", dtype=policy)
        else:
            self.ffn = DeepSeekMoE(
                c.d_model, c.moe_inter_dim, c.n_routed_experts, c.n_shared_experts,
                c.n_activated_experts, c.route_scale, c.bias_update_speed, name="moe", dtype=policy)

    @property
    def is_moe(self) -> bool:
        return isinstance(self.ffn, DeepSeekMoE)

    def call(self, x, key_mask=None, training=None):
        x = x + self.attn(self.attn_norm(x), key_mask=key_mask)
        h = self.ffn_norm(x)
        return x + (self.ffn(h, training=training) if self.is_moe else self.ffn(h))

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(), "layer_index": self.layer_index}


class DeepSeekLM(keras.Model):
    """Decoder-only language model: token ids [B, T] -> float32 logits [B, T, V].

    Args:
        config: ModelConfig (or its dict) with ``vocab_size`` set.

    Example:
        >>> model = DeepSeekLM(ModelConfig(vocab_size=260, n_layers=2))
        >>> logits = model(tf.zeros([1, 8], tf.int64))
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.config = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(config)
        c = self.config
        if c.vocab_size <= 0:
            raise ValueError("ModelConfig.vocab_size must be set (from the tokenizer) before building")
        policy = self.dtype_policy
        self.embed = keras.layers.Embedding(
            c.vocab_size, c.d_model, embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02),
            name="embed", dtype=policy)
        self.blocks = [DecoderBlock(c, i, name=f"block_{i}", dtype=policy) for i in range(c.n_layers)]
        self.final_norm = RMSNorm(c.norm_eps, name="final_norm", dtype=policy)
        self.head = _dense(c.vocab_size, "head", policy)

    def call(self, token_ids, key_mask=None, training=None):
        x = self.embed(token_ids)
        for block in self.blocks:
            x = block(x, key_mask=key_mask, training=training)
        # Logits (and so the loss) in float32 under mixed precision.
        return tf.cast(self.head(self.final_norm(x)), tf.float32)

    def moe_layers(self) -> list[DeepSeekMoE]:
        return [b.ffn for b in self.blocks if b.is_moe]

    def get_config(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "name": self.name}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)


def token_nll(logits: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
    """Per-token negative log-likelihood in nats, float32, same shape as ``targets``."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(targets, tf.int32), logits=tf.cast(logits, tf.float32))
