"""The TensorFlow layers equal the independent NumPy reference to 1e-5 in float32."""

import numpy as np
import pytest
import tensorflow as tf

from tests import numpy_reference as ref
from deepseek_tfx.trainer_module.layers import DeepSeekMoE, MultiHeadLatentAttention


@pytest.mark.parametrize("q_rank", [0, 24])
def test_mla_matches_numpy(q_rank):
    tf.random.set_seed(3)
    heads, nope, rope_dim, v_dim, kv_rank, d = 3, 8, 6, 10, 12, 32
    layer = MultiHeadLatentAttention(d, heads, q_rank, kv_rank, nope, rope_dim, v_dim)
    x = np.random.default_rng(0).normal(size=(2, 7, d)).astype(np.float32)
    layer(x)  # build
    for norm in ([layer.q_norm] if q_rank else []) + [layer.kv_norm]:  # non-trivial norm scales
        norm.scale.assign(np.random.default_rng(1).uniform(0.5, 1.5, norm.scale.shape))
    y = layer(x).numpy()
    w = {"W_DKV": layer.wkv_a.kernel.numpy(), "kv_norm": layer.kv_norm.scale.numpy(),
         "W_UKV": layer.wkv_b.kernel.numpy(), "W_O": layer.wo.kernel.numpy()}
    if q_rank:
        w.update(W_DQ=layer.wq_a.kernel.numpy(), q_norm=layer.q_norm.scale.numpy(), W_UQ=layer.wq_b.kernel.numpy())
    else:
        w["W_Q"] = layer.wq.kernel.numpy()
    expected = ref.mla(x.astype(np.float64), w, heads, nope, rope_dim, v_dim, kv_rank, q_rank)
    np.testing.assert_allclose(y, expected, atol=1e-5, rtol=0)


def test_moe_matches_numpy_with_a_nonzero_bias():
    tf.random.set_seed(4)
    d, inter, experts, k = 16, 8, 6, 2
    layer = DeepSeekMoE(d, inter, n_routed_experts=experts, n_shared_experts=1, n_activated_experts=k,
                        route_scale=1.5)
    x = np.random.default_rng(2).normal(size=(2, 5, d)).astype(np.float32)
    layer(x)
    layer.gate.assign(np.random.default_rng(5).normal(scale=0.5, size=(d, experts)))
    layer.expert_bias.assign(np.random.default_rng(6).normal(scale=0.3, size=experts))
    y = layer(x).numpy().reshape(-1, d)
    w1, w3, w2 = layer.w1.numpy(), layer.w3.numpy(), layer.w2.numpy()
    shared = (layer.shared.w1.kernel.numpy(), layer.shared.w3.kernel.numpy(), layer.shared.w2.kernel.numpy())
    expected = ref.deepseek_moe(x.reshape(-1, d).astype(np.float64), layer.gate.numpy(),
                                layer.expert_bias.numpy(), [(w1[e], w3[e], w2[e]) for e in range(experts)],
                                shared, k, route_scale=1.5)
    np.testing.assert_allclose(y, expected, atol=1e-5, rtol=0)
