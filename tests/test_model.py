"""Model-level checks on tiny shapes: shapes, causality, routing, config round trip, precision."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from deepseek_tfx.trainer_module.config import get_preset
from deepseek_tfx.trainer_module.layers import DeepSeekMoE, MultiHeadLatentAttention, RMSNorm
from deepseek_tfx.trainer_module.model import DeepSeekLM

TINY = get_preset("tiny").model.replace(vocab_size=260)


@pytest.fixture(autouse=True)
def _float32_policy():
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("dense", [False, True])
def test_logits_shape_and_causality(dense):
    tf.random.set_seed(0)
    model = DeepSeekLM(TINY.replace(dense=dense))
    x = tf.random.uniform([2, 16], 4, 260, tf.int64)
    logits = model(x)
    assert logits.shape == (2, 16, 260) and logits.dtype == tf.float32
    changed = tf.concat([x[:, :9], tf.fill([2, 7], tf.constant(7, tf.int64))], axis=1)
    np.testing.assert_allclose(model(changed)[:, :9].numpy(), logits[:, :9].numpy(), atol=1e-5)
    assert not np.allclose(model(changed)[:, 9:].numpy(), logits[:, 9:].numpy())


def test_key_mask_makes_left_padding_invisible():
    model = DeepSeekLM(TINY)
    x = tf.random.uniform([1, 10], 4, 260, tf.int64)
    padded = tf.concat([tf.zeros([1, 5], tf.int64), x], axis=1)
    out = model(padded, key_mask=tf.not_equal(padded, 0))[:, 5:]
    np.testing.assert_allclose(out.numpy(), model(x).numpy(), atol=1e-4)


def test_routing_is_top_k_and_bias_changes_selection_not_weights():
    moe = DeepSeekMoE(16, 8, n_routed_experts=4, n_shared_experts=1, n_activated_experts=2)
    x = tf.random.normal([1, 32, 16])
    moe(x)
    idx, weights, scores = moe.route(tf.reshape(x, [-1, 16]))
    assert idx.shape == (32, 2)
    assert all(len(set(row)) == 2 for row in idx.numpy().tolist())
    np.testing.assert_allclose(tf.reduce_sum(weights, -1).numpy(), 1.0, rtol=1e-5)
    moe.expert_bias.assign([10.0, 10.0, 0.0, 0.0])  # forces experts 0 and 1
    idx_b, weights_b, _ = moe.route(tf.reshape(x, [-1, 16]))
    assert set(np.unique(idx_b.numpy())) == {0, 1}
    expected = tf.gather(scores, idx_b, batch_dims=1)
    np.testing.assert_allclose(weights_b.numpy(), (expected / tf.reduce_sum(expected, -1, keepdims=True)).numpy(),
                               rtol=1e-5)


def test_bias_update_moves_skewed_load_toward_uniform():
    moe = DeepSeekMoE(16, 8, n_routed_experts=4, n_shared_experts=0, n_activated_experts=1,
                      bias_update_speed=0.005)
    x = tf.constant(np.random.default_rng(0).normal(size=(4, 64, 16)), tf.float32)
    moe(x)
    gate = np.random.default_rng(1).normal(scale=0.05, size=(16, 4))
    gate[:, 0] = 0.0
    moe.gate.assign(gate)
    moe.expert_bias.assign([0.2, 0.0, 0.0, 0.0])  # every token starts on expert 0
    imbalance = []
    bias = moe.expert_bias.numpy()
    moe(x, training=True)
    np.testing.assert_array_equal(moe.expert_bias.numpy(), bias)  # a forward pass alone leaves it alone
    for _ in range(150):
        moe(x, training=True)
        moe.update_balance(moe.step_stats[0])  # what the train step does once per optimizer step
        load = moe.expert_load.numpy()
        imbalance.append(load.max() / load.mean())
    assert imbalance[0] == 4.0  # all 256 tokens on one of 4 experts
    assert np.mean(imbalance[-20:]) < 1.3
    assert moe.expert_bias.numpy()[0] < 0.2  # the overloaded expert's bias was pushed down


def test_get_config_round_trip():
    model = DeepSeekLM(TINY)
    clone = DeepSeekLM.from_config(model.get_config())
    assert clone.config == model.config
    layer = MultiHeadLatentAttention(64, 2, 16, 32, 16, 8, 16)
    assert MultiHeadLatentAttention.from_config(layer.get_config()).get_config() == layer.get_config()


def test_mixed_bfloat16_keeps_norms_router_and_logits_in_float32():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = DeepSeekLM(TINY)
    logits = model(tf.random.uniform([1, 8], 4, 260, tf.int64), training=True)
    assert logits.dtype == tf.float32
    assert model.blocks[0].attn.kv_norm.scale.dtype == tf.float32
    moe = model.moe_layers()[0]
    assert moe.gate.dtype == tf.float32 and moe.compute_dtype == "bfloat16"
    assert RMSNorm(dtype="mixed_bfloat16")(tf.ones([1, 4], tf.bfloat16)).dtype == tf.bfloat16


def test_multi_token_prediction_is_off_by_default_and_causal_when_on():
    assert TINY.mtp_depth == 0
    assert DeepSeekLM(TINY).train_logits(tf.ones([1, 6], tf.int64))[1] is None
    tf.random.set_seed(2)
    model = DeepSeekLM(TINY.replace(mtp_depth=1))
    x = tf.random.uniform([2, 10], 4, 260, tf.int64)
    logits, mtp = model.train_logits(x, training=False)
    assert logits.shape == (2, 10, 260) and mtp.shape == (2, 9, 260)
    # MTP position i sees tokens up to i+1 and predicts i+2: changing token 6 leaves positions < 5 alone.
    changed = tf.tensor_scatter_nd_update(x, [[0, 6], [1, 6]], tf.constant([5, 5], tf.int64))
    _, mtp_changed = model.train_logits(changed, training=False)
    np.testing.assert_allclose(mtp_changed[:, :5].numpy(), mtp[:, :5].numpy(), atol=1e-5)
    assert not np.allclose(mtp_changed[:, 5].numpy(), mtp[:, 5].numpy())


@pytest.mark.parametrize("layer", [
    RMSNorm(epsilon=1e-5),
    MultiHeadLatentAttention(32, 2, 8, 16, 8, 4, 8, rope_theta=500.0),
    DeepSeekMoE(16, 8, n_routed_experts=4, n_shared_experts=2, n_activated_experts=2, route_scale=2.0,
                bias_update_speed=0.01, seq_aux_loss_weight=0.001),
    DeepSeekMoE(16, 8, n_routed_experts=8, n_shared_experts=1, n_activated_experts=2, score_func="softmax",
                normalize_gates=False, n_expert_groups=4, n_limited_groups=2, group_score="max"),
    MultiHeadLatentAttention(32, 2, 0, 16, 8, 4, 8, rope_scaling={
        "factor": 4.0, "original_context_len": 16, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707}),
])
def test_every_layer_round_trips_get_config(layer):
    clone = type(layer).from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()


def test_sequence_balance_loss_is_added_when_enabled():
    model = DeepSeekLM(TINY.replace(seq_aux_loss_weight=0.01))
    model(tf.random.uniform([2, 8], 4, 260, tf.int64), training=True)
    assert len(model.losses) == 1 and float(model.losses[0]) > 0
    quiet = DeepSeekLM(TINY)
    quiet(tf.random.uniform([2, 8], 4, 260, tf.int64), training=True)
    assert quiet.losses == []
