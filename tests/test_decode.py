"""Incremental decoding with the cache equals the full forward pass at every position."""

import numpy as np
import pytest
import tensorflow as tf

from deepseek_tfx.trainer_module.config import get_preset
from deepseek_tfx.trainer_module.model import DeepSeekLM

TINY = get_preset("tiny").model.replace(vocab_size=260)


@pytest.mark.parametrize("changes", [{}, {"q_lora_rank": 16}, {"dense": True}])
def test_cached_steps_match_full_forward(changes):
    tf.random.set_seed(1)
    model = DeepSeekLM(TINY.replace(**changes))
    tokens = tf.random.uniform([2, 12], 4, 260, tf.int64)
    full = model(tokens).numpy()
    _, caches = model.prefill(tokens[:, :1], cache_len=12)
    for t in range(1, 12):
        logits, caches = model.decode_step(tokens[:, t], caches, tf.constant(t))
        np.testing.assert_allclose(logits.numpy(), full[:, t], atol=1e-4, rtol=0)


def test_mla_cache_holds_only_the_latent_and_rope_key():
    model = DeepSeekLM(TINY)
    _, caches = model.prefill(tf.ones([3, 5], tf.int64), cache_len=9)
    c_kv, k_pe = caches[0]
    assert c_kv.shape == (3, 9, TINY.kv_lora_rank)
    assert k_pe.shape == (3, 9, TINY.qk_rope_head_dim)
    per_token = TINY.kv_lora_rank + TINY.qk_rope_head_dim
    full_kv = 2 * TINY.n_heads * TINY.qk_nope_head_dim  # what a plain MHA of these heads would cache (at least)
    assert per_token < full_kv
