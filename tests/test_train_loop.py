"""The training loop: accumulation, recomputation, XLA, checkpoints, divergence, time limit, FLOPs."""

import json

import numpy as np
import pytest
import tensorflow as tf

from deepseek_tfx.trainer_module.config import ConfigError, ModelConfig, TrainConfig, get_preset
from deepseek_tfx.trainer_module.flops import measure_matmul_peak, training_flops_per_token
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.train_loop import Checkpointer, TrainLoop, make_optimizer

TINY = get_preset("tiny").model.replace(vocab_size=97, bias_update_speed=0.0)
STEP = TrainConfig(train_steps=20, batch_size=4, warmup_steps=2, log_every=5, checkpoint_every=0,
                   eval_batches=0)


def _loop(cfg=STEP, model_cfg=TINY, recompute=False, seed=0):
    tf.keras.utils.set_random_seed(seed) if hasattr(tf.keras.utils, "set_random_seed") else tf.random.set_seed(seed)
    model = DeepSeekLM(model_cfg, recompute_attention=recompute)
    model(tf.zeros([1, 8], tf.int64))
    return TrainLoop(model, make_optimizer(model, cfg), tf.distribute.get_strategy(), cfg)


def _data(n_batches=50, batch=4, t=TINY.context_len, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.integers(4, TINY.vocab_size, size=(n_batches * batch, t + 1))
    return tf.data.Dataset.from_tensor_slices((x[:, :-1], x[:, 1:])).batch(batch)


def _first(ds):
    return next(iter(ds))


def _assert_same_loss_and_gradients(reference, other, rtol):
    """Gives ``other`` the weights of ``reference``; both compute loss and gradients on one batch."""
    x, y = _first(_data())
    other.model.set_weights(reference.model.get_weights())
    loss_a, grads_a = reference._accumulated_gradients(x, y)
    loss_b, grads_b = other._accumulated_gradients(x, y)
    assert float(loss_a) == pytest.approx(float(loss_b), rel=rtol)
    for a, b in zip(grads_a, grads_b, strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(a), tf.convert_to_tensor(b), atol=1e-6, rtol=rtol)


def test_gradient_accumulation_equals_one_big_batch():
    _assert_same_loss_and_gradients(_loop(), _loop(STEP.replace(grad_accum_steps=2)), rtol=1e-4)


def test_accumulation_must_divide_the_batch():
    with pytest.raises(ConfigError, match="grad_accum_steps"):
        TrainConfig(batch_size=6, grad_accum_steps=4)


def test_recomputed_attention_gives_the_same_gradients():
    _assert_same_loss_and_gradients(_loop(), _loop(recompute=True), rtol=1e-5)


def test_xla_compiled_step_matches_on_the_dense_model():
    dense = TINY.replace(dense=True, n_dense_layers=0)
    x, y = _first(_data())
    plain, compiled = _loop(model_cfg=dense), _loop(STEP.replace(jit_compile=True), model_cfg=dense)
    compiled.model.set_weights(plain.model.get_weights())
    loss_a, _ = plain._accumulated_gradients(x, y)
    loss_b, _ = compiled._gradients(x, y)
    assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-4)


def test_xla_with_moe_is_a_config_error():
    with pytest.raises(ConfigError, match="jit_compile needs a model without MoE layers"):
        _loop(STEP.replace(jit_compile=True))


def test_checkpoint_restores_weights_optimizer_and_step(tmp_path):
    loop = _loop(STEP.replace(checkpoint_every=5))
    ckpt = Checkpointer(loop.model, loop.optimizer, str(tmp_path), keep=2)
    result = loop.train(_data(), 12, checkpointer=ckpt)
    assert result.steps == 12 and ckpt.last_step == 12
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.index")) == ["ckpt-10.index", "ckpt-12.index"]

    fresh = _loop(seed=5)
    fresh.optimizer.build(fresh.model.trainable_variables)
    assert Checkpointer(fresh.model, fresh.optimizer, str(tmp_path), keep=2).restore() == 12
    assert int(fresh.optimizer.iterations) == 12
    for a, b in zip(loop.model.get_weights(), fresh.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(loop.optimizer.variables, fresh.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_divergence_names_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    loop = _loop(STEP.replace(checkpoint_every=5))
    ckpt = Checkpointer(loop.model, loop.optimizer, str(tmp_path), keep=3)
    loop.train(_data(), 10, checkpointer=ckpt)
    loop.model.embed.embeddings.assign(tf.fill(tf.shape(loop.model.embed.embeddings), np.nan))
    with pytest.raises(FloatingPointError, match=r"diverged at step 11: .*last good checkpoint, step 10"):
        loop.train(_data().skip(10), 20, start_step=10, checkpointer=ckpt)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-10")
    reader = tf.train.load_checkpoint(str(tmp_path))
    assert all(np.isfinite(reader.get_tensor(name)).all()
               for name, _ in tf.train.list_variables(str(tmp_path)) if "model" in name)


def test_time_limit_stops_early_and_says_so():
    loop = _loop(STEP.replace(max_train_seconds=0.01))
    result = loop.train(_data(), 50)
    assert result.stopped_by_time and 1 <= result.steps < 50


def test_steady_rate_excludes_the_first_step():
    result = _loop().train(_data(), 6)
    assert result.steady_tokens == 5 * 4 * TINY.context_len
    assert 0 < result.steady_seconds < result.seconds


def test_flops_per_token_counts_matmuls_and_attention():
    c = ModelConfig(vocab_size=65, d_model=128, n_layers=4, n_heads=4, context_len=64, dense=True,
                    inter_dim=344, n_dense_layers=0)
    per_layer = 4 * 128 * 128 + 3 * 128 * 344 + 2 * 128  # qkv + output, SwiGLU, two norms
    matmul_params = 4 * per_layer + 128 * 65 + 128  # + head and final norm
    attention = 6 * 4 * 64 * 4 * (32 + 32)
    assert training_flops_per_token(c) == 6 * matmul_params + attention


def test_matmul_peak_is_measured():
    assert measure_matmul_peak("float32", n=256, seconds=0.2) > 1e8


def test_time_limit_is_refused_with_several_workers(monkeypatch):
    """Each worker would stop by its own clock, at its own step, and hang the others in an all-reduce."""
    from types import SimpleNamespace

    from deepseek_tfx.trainer_module import trainer

    cluster = {"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(cluster))
    custom = {"train": TrainConfig(max_train_seconds=90).to_dict()}
    with pytest.raises(ConfigError, match=r"TrainConfig.max_train_seconds: must be 0 with several workers"):
        trainer.run_fn(SimpleNamespace(custom_config=custom, train_steps=10, eval_steps=None))
    monkeypatch.setenv("TF_CONFIG", json.dumps({**cluster, "cluster": {"worker": ["localhost:1"]}}))
    assert not trainer.is_multi_worker()


def test_trainer_args_override_the_training_config(monkeypatch):
    """TFX's TrainArgs.num_steps and EvalArgs.num_steps reach the loop; EvalArgs 0 keeps the config's batches."""
    from types import SimpleNamespace

    from deepseek_tfx.trainer_module import trainer

    monkeypatch.delenv("TF_CONFIG", raising=False)
    custom = {"train": TrainConfig(train_steps=100, eval_batches=8).to_dict()}
    run = trainer._configure(SimpleNamespace(custom_config=custom, train_steps=7, eval_steps=3))
    assert (run.train_cfg.train_steps, run.train_cfg.eval_batches) == (7, 3)
    run = trainer._configure(SimpleNamespace(custom_config=custom, train_steps=7, eval_steps=None))
    assert run.train_cfg.eval_batches == 8
