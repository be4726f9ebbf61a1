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


def _moe_weights(layer):
    w1, w3, w2 = layer.w1.numpy(), layer.w3.numpy(), layer.w2.numpy()
    return [(w1[e], w3[e], w2[e]) for e in range(layer.n_routed_experts)]


ROUTINGS = {  # the routing options of the deepseek-v2-lite, deepseek-v2 and deepseek-v3 presets
    "v2-lite": dict(score_func="softmax", normalize_gates=False),
    "v2": dict(score_func="softmax", normalize_gates=False, n_expert_groups=4, n_limited_groups=2,
               group_score="max", route_scale=16.0),
    "v3": dict(score_func="sigmoid", normalize_gates=True, n_expert_groups=4, n_limited_groups=2,
               group_score="top2_sum", route_scale=2.5),
}


@pytest.mark.parametrize("routing", sorted(ROUTINGS))
def test_router_matches_the_published_gate(routing):
    """Group-limited routing, softmax / sigmoid affinities, with and without renormalisation, against a NumPy
    transcription of DeepSeek-V3's ``Gate.forward``, with a nonzero balancing bias."""
    options = ROUTINGS[routing]
    d, experts, k = 16, 8, 3
    layer = DeepSeekMoE(d, 8, n_routed_experts=experts, n_shared_experts=1, n_activated_experts=k, **options)
    x = np.random.default_rng(2).normal(size=(64, d)).astype(np.float32)
    layer(x[None])
    layer.gate.assign(np.random.default_rng(5).normal(scale=0.5, size=(d, experts)))
    layer.expert_bias.assign(np.random.default_rng(6).normal(scale=0.3, size=experts))
    idx, weights, _ = layer.route(x)
    ref_weights, ref_idx = ref.gate(
        x.astype(np.float64), layer.gate.numpy(), layer.expert_bias.numpy(), k, options["score_func"],
        options.get("n_expert_groups", 1), options.get("n_limited_groups", 1), options.get("group_score", "max"),
        options["normalize_gates"], options.get("route_scale", 1.0))
    np.testing.assert_array_equal(idx.numpy(), ref_idx)
    np.testing.assert_allclose(weights.numpy(), ref_weights, atol=1e-6, rtol=1e-5)
    if options.get("n_expert_groups", 1) > 1:  # every token's experts lie in at most n_limited_groups groups
        size = experts // options["n_expert_groups"]
        assert max(len(set(row)) for row in (idx.numpy() // size).tolist()) <= options["n_limited_groups"]
        assert len({tuple(sorted(set(row))) for row in (idx.numpy() // size).tolist()}) > 1


def test_capacity_dispatch_matches_numpy_and_counts_the_dropped_copies():
    tf.random.set_seed(7)
    d, experts, k = 16, 4, 2
    layer = DeepSeekMoE(d, 8, n_routed_experts=experts, n_shared_experts=0, n_activated_experts=k)
    x = np.random.default_rng(3).normal(size=(2, 12, d)).astype(np.float32)
    layer(x)
    layer.gate.assign(np.random.default_rng(8).normal(scale=0.5, size=(d, experts)))
    layer.capacity_factor = 0.5  # C = ceil(0.5 * 24 * 2 / 4) = 6 of the 12 copies an even split would give
    y = layer(x, training=True).numpy().reshape(-1, d)
    load, dropped = (t.numpy() for t in layer.step_stats)
    weights, idx = (t.numpy() for t in layer.route(x.reshape(-1, d))[1::-1])
    expected, expected_dropped = ref.capacity_moe(x.reshape(-1, d).astype(np.float64), weights, idx,
                                                  _moe_weights(layer), capacity=6)
    assert expected_dropped > 0 and dropped == expected_dropped
    np.testing.assert_array_equal(load, np.bincount(idx.ravel(), minlength=experts))
    np.testing.assert_allclose(y, expected, atol=1e-5, rtol=0)


def test_mla_with_yarn_matches_numpy():
    tf.random.set_seed(3)
    heads, nope, rope_dim, v_dim, kv_rank, d = 2, 8, 16, 8, 12, 32
    scaling = {"factor": 8.0, "original_context_len": 4, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707}
    layer = MultiHeadLatentAttention(d, heads, 0, kv_rank, nope, rope_dim, v_dim, rope_theta=500.0,
                                     rope_scaling=scaling)
    x = np.random.default_rng(0).normal(size=(2, 9, d)).astype(np.float32)
    layer(x)
    rng = np.random.default_rng(4)  # larger weights than the init's, so attention is far from uniform
    layer.set_weights([rng.normal(scale=0.4, size=w.shape) for w in layer.get_weights()])
    y = layer(x).numpy()
    w = {"W_DKV": layer.wkv_a.kernel.numpy(), "kv_norm": layer.kv_norm.scale.numpy(),
         "W_UKV": layer.wkv_b.kernel.numpy(), "W_O": layer.wo.kernel.numpy(), "W_Q": layer.wq.kernel.numpy()}
    freqs = ref.yarn_freqs(rope_dim, 500.0, 8.0, 4, 32.0, 1.0)
    plain = 500.0 ** (-np.arange(0, rope_dim, 2) / rope_dim)
    assert freqs[0] == plain[0] and freqs[-1] == pytest.approx(plain[-1] / 8)  # fast dims kept, slow ones scaled
    mscale = 0.1 * 0.707 * np.log(8.0) + 1.0
    expected = ref.mla(x.astype(np.float64), w, heads, nope, rope_dim, v_dim, kv_rank, 0, freqs=freqs,
                       mscale=mscale)
    np.testing.assert_allclose(y, expected, atol=1e-5, rtol=0)
    plain_layer = MultiHeadLatentAttention(d, heads, 0, kv_rank, nope, rope_dim, v_dim, rope_theta=500.0)
    plain_layer(x)
    plain_layer.set_weights(layer.get_weights())
    assert np.abs(plain_layer(x).numpy() - y).max() > 0.1 * np.abs(y).max()  # YaRN changed the attention
