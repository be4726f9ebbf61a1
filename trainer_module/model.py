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

from deepseek_tfx.trainer_module.config import ModelConfig
from deepseek_tfx.trainer_module.layers import (
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
        recompute_attention: in training, recompute the attention (norm, projections,
            scores) in the backward pass rather than keep its activations: selective
            activation recomputation (Korthikanti et al., 2022). The MoE is not
            recomputed: its routing updates the balancing state, which must happen once.

    Example:
        >>> block = DecoderBlock(ModelConfig(vocab_size=260), layer_index=0)
        >>> y = block(tf.random.normal([2, 5, 128]))
    """

    def __init__(self, config, layer_index: int, recompute_attention: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.config = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(config)
        self.layer_index = layer_index
        self.recompute_attention = recompute_attention
        c, policy = self.config, self.dtype_policy
        self.attn_norm = RMSNorm(c.norm_eps, name="attn_norm", dtype=policy)
        self.ffn_norm = RMSNorm(c.norm_eps, name="ffn_norm", dtype=policy)
        if c.dense:
            self.attn = MultiHeadAttention(c.d_model, c.n_heads, c.rope_theta, c.yarn(), name="attn", dtype=policy)
        else:
            self.attn = MultiHeadLatentAttention(
                c.d_model, c.n_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim,
                c.qk_rope_head_dim, c.v_head_dim, c.rope_theta, c.norm_eps, c.yarn(), name="attn", dtype=policy)
        if c.dense or layer_index < c.n_dense_layers:
            self.ffn = SwiGLU(c.inter_dim, c.d_model, name="ffn", dtype=policy)
        else:
            self.ffn = DeepSeekMoE(
                c.d_model, c.moe_inter_dim, c.n_routed_experts, c.n_shared_experts,
                c.n_activated_experts, c.route_scale, c.bias_update_speed, c.seq_aux_loss_weight,
                c.score_func, c.normalize_gates, c.n_expert_groups, c.n_limited_groups, c.group_score,
                name="moe", dtype=policy)

    @property
    def is_moe(self) -> bool:
        return isinstance(self.ffn, DeepSeekMoE)

    def _feed_forward(self, x, training=None):
        h = self.ffn_norm(x)
        return x + (self.ffn(h, training=training) if self.is_moe else self.ffn(h))

    def call(self, x, key_mask=None, training=None):
        def attention(h):
            return self.attn(self.attn_norm(h), key_mask=key_mask)

        if self.recompute_attention and training:
            attention = tf.recompute_grad(attention)
        return self._feed_forward(x + attention(x), training)

    def prefill(self, x, key_mask, cache_len):
        out, cache = self.attn.prefill(self.attn_norm(x), key_mask, cache_len)
        return self._feed_forward(x + out), cache

    def decode(self, x, cache, position, key_mask):
        out, cache = self.attn.decode(self.attn_norm(x), cache, position, key_mask)
        return self._feed_forward(x + out), cache

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(), "layer_index": self.layer_index,
                "recompute_attention": self.recompute_attention}


class DeepSeekLM(keras.Model):
    """Decoder-only language model: token ids [B, T] -> float32 logits [B, T, V].

    Args:
        config: ModelConfig (or its dict) with ``vocab_size`` set.
        recompute_attention: recompute attention activations in the backward pass
            (see DecoderBlock); a memory/compute trade that leaves the math unchanged.

    Example:
        >>> model = DeepSeekLM(ModelConfig(vocab_size=260, n_layers=2))
        >>> logits = model(tf.zeros([1, 8], tf.int64))
    """

    def __init__(self, config, recompute_attention: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.config = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(config)
        self.recompute_attention = recompute_attention
        c = self.config
        if c.vocab_size <= 0:
            raise ValueError("ModelConfig.vocab_size must be set (from the tokenizer) before building")
        policy = self.dtype_policy
        self.embed = keras.layers.Embedding(
            c.vocab_size, c.d_model, embeddings_initializer=keras.initializers.RandomNormal(stddev=0.02),
            name="embed", dtype=policy)
        self.blocks = [DecoderBlock(c, i, recompute_attention, name=f"block_{i}", dtype=policy)
                       for i in range(c.n_layers)]
        self.final_norm = RMSNorm(c.norm_eps, name="final_norm", dtype=policy)
        self.head = _dense(c.vocab_size, "head", policy)
        if c.mtp_depth:
            # DeepSeek-V3 sec. 2.2: h' = M [RMSNorm(h_i); RMSNorm(Emb(t_{i+1}))], one more block,
            # then the shared output head predicts t_{i+2}. Embedding and head are shared.
            self.mtp_hidden_norm = RMSNorm(c.norm_eps, name="mtp_hidden_norm", dtype=policy)
            self.mtp_embed_norm = RMSNorm(c.norm_eps, name="mtp_embed_norm", dtype=policy)
            self.mtp_proj = _dense(c.d_model, "mtp_proj", policy)
            self.mtp_block = DecoderBlock(c, c.n_layers, name="mtp_block", dtype=policy)
            self.mtp_final_norm = RMSNorm(c.norm_eps, name="mtp_final_norm", dtype=policy)

    def hidden_states(self, token_ids, key_mask=None, training=None):
        """The last block's output [B, T, D], before the final norm."""
        x = self.embed(token_ids)
        for block in self.blocks:
            x = block(x, key_mask=key_mask, training=training)
        return x

    def call(self, token_ids, key_mask=None, training=None):
        # Logits (and so the loss) in float32 under mixed precision.
        return tf.cast(self.head(self.final_norm(self.hidden_states(token_ids, key_mask, training))),
                       tf.float32)

    def train_logits(self, token_ids, training=True):
        """(logits [B, T, V], MTP logits [B, T-1, V] or None); MTP position i predicts token i+2."""
        h = self.hidden_states(token_ids, training=training)
        logits = tf.cast(self.head(self.final_norm(h)), tf.float32)
        if not self.config.mtp_depth:
            return logits, None
        nxt = self.embed(token_ids[:, 1:])
        merged = self.mtp_proj(tf.concat([self.mtp_hidden_norm(h[:, :-1]), self.mtp_embed_norm(nxt)], -1))
        mtp = self.mtp_block(merged, training=training)
        return logits, tf.cast(self.head(self.mtp_final_norm(mtp)), tf.float32)

    def prefill(self, token_ids, cache_len, key_mask=None):
        """Full forward over [B, T] that also returns each layer's cache, padded to ``cache_len``.

        Returns (float32 logits [B, T, V], caches). An MLA layer caches only its
        compressed latent c_kv [B, S, C] and rotary key k_pe [B, S, R].
        """
        x = self.embed(token_ids)
        caches = []
        for block in self.blocks:
            x, cache = block.prefill(x, key_mask, cache_len)
            caches.append(cache)
        return tf.cast(self.head(self.final_norm(x)), tf.float32), caches

    def decode_step(self, token, caches, position, key_mask=None):
        """Logits [B, V] for one new token [B] at ``position``, and the updated caches.

        ``key_mask`` [B, S] marks cache slots that may be attended (e.g. not padding).
        """
        x = self.embed(tf.reshape(token, [-1, 1]))
        new_caches = []
        for block, cache in zip(self.blocks, caches, strict=True):
            x, cache = block.decode(x, cache, position, key_mask)
            new_caches.append(cache)
        return tf.cast(self.head(self.final_norm(x)), tf.float32)[:, 0], new_caches

    def mtp_layers(self) -> list:
        if not self.config.mtp_depth:
            return []
        return [self.mtp_hidden_norm, self.mtp_embed_norm, self.mtp_proj, self.mtp_block, self.mtp_final_norm]

    def parameter_counts(self) -> tuple[int, int]:
        """(total, activated per token) of the served model from the built weights (see
        trainer_module.params); multi-token prediction weights are training-only and not counted."""
        mtp = {id(v) for layer in self.mtp_layers() for v in layer.trainable_weights}
        total = sum(int(tf.size(v)) for v in self.trainable_variables if id(v) not in mtp)
        inactive = sum((m.n_routed_experts - m.n_activated_experts) * 3 * m.d_model * m.moe_inter_dim
                       for m in self.moe_layers())
        return total, total - inactive - int(tf.size(self.embed.embeddings))

    def moe_layers(self) -> list[DeepSeekMoE]:
        """The main blocks' MoE layers (the MTP block's, if any, is trained but not served)."""
        return [b.ffn for b in self.blocks if b.is_moe]

    def trained_moe_layers(self) -> list[DeepSeekMoE]:
        """Every MoE layer a training step routes through: the main blocks' and the MTP block's."""
        mtp = [self.mtp_block.ffn] if self.config.mtp_depth and self.mtp_block.is_moe else []
        return self.moe_layers() + mtp

    def get_config(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "recompute_attention": self.recompute_attention,
                "name": self.name}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)


def token_nll(logits: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
    """Per-token negative log-likelihood in nats, float32, same shape as ``targets``."""
    return tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(targets, tf.int32), logits=tf.cast(logits, tf.float32))
