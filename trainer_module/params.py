"""Analytic parameter counts of a ModelConfig, without building any weights.

``total`` counts every trainable weight. ``activated`` counts what one token's
forward pass multiplies by: everything except the routed experts it is not
sent to (E - K per MoE layer) and the input embedding table (a row lookup, not
a matmul), which is how the DeepSeek reports count activated parameters.
The non-trainable balancing state (``expert_bias``, ``expert_load``) is not a
parameter.
"""

from __future__ import annotations

import dataclasses

from deepseek_tfx.trainer_module.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class ParameterCounts:
    total: int
    activated: int
    embedding: int
    per_layer: tuple[int, ...]


def _attention(c: ModelConfig) -> int:
    d, h = c.d_model, c.n_heads
    if c.dense:
        return 3 * d * d + d * d  # fused qkv + output
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    q = (d * c.q_lora_rank + c.q_lora_rank + c.q_lora_rank * h * qk) if c.q_lora_rank else d * h * qk
    kv = d * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank  # wkv_a + kv_norm
    kv += c.kv_lora_rank * h * (c.qk_nope_head_dim + c.v_head_dim)  # wkv_b
    return q + kv + h * c.v_head_dim * d  # + wo


def _moe(c: ModelConfig) -> tuple[int, int]:
    """(total, activated) of one MoE feed-forward."""
    expert = 3 * c.d_model * c.moe_inter_dim
    shared = 3 * c.d_model * c.n_shared_experts * c.moe_inter_dim
    router = c.d_model * c.n_routed_experts
    return (router + shared + c.n_routed_experts * expert,
            router + shared + c.n_activated_experts * expert)


def count_parameters(c: ModelConfig) -> ParameterCounts:
    """Total and activated-per-token parameter counts of the model ``c`` describes."""
    if c.vocab_size <= 0:
        raise ValueError("ModelConfig.vocab_size must be set to count parameters")
    norms = 2 * c.d_model
    dense_ffn = 3 * c.d_model * c.inter_dim
    moe_total, moe_active = _moe(c)
    per_layer, active = [], 0
    for i in range(c.n_layers):
        is_moe = c.uses_moe and i >= c.n_dense_layers
        base = norms + _attention(c)
        per_layer.append(base + (moe_total if is_moe else dense_ffn))
        active += base + (moe_active if is_moe else dense_ffn)
    embedding = c.vocab_size * c.d_model
    head = c.d_model * c.vocab_size + c.d_model  # output projection + final norm
    return ParameterCounts(total=embedding + sum(per_layer) + head, activated=active + head,
                           embedding=embedding, per_layer=tuple(per_layer))
