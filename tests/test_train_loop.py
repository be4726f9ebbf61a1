"""The training loop: accumulation, recomputation, XLA, checkpoints, divergence, time limit, FLOPs."""

import json
import logging
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from deepseek_tfx.trainer_module.config import ConfigError, ModelConfig, TrainConfig, get_preset
from deepseek_tfx.trainer_module.flops import measure_matmul_peak, training_flops_per_token
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.train_loop import Checkpointer, TrainLoop, WarmupCosine, make_optimizer

TINY = get_preset("tiny").model.replace(vocab_size=97, bias_update_speed=0.0)
STEP = TrainConfig(train_steps=20, batch_size=4, warmup_steps=2, log_every=5, checkpoint_every=0,
                   eval_batches=0, precision="float32", jit_compile=False)


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
    loss_a, grads_a, _ = reference._accumulated_gradients(x, y)
    loss_b, grads_b, _ = other._accumulated_gradients(x, y)
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


def _attention_calls_in_one_gradient(loop) -> int:
    """How often the blocks' attention ran while computing one batch's gradients (eagerly)."""
    calls = []
    for block in loop.model.blocks:
        real = block.attn.call

        def counted(*args, _real=real, **kwargs):
            calls.append(1)
            return _real(*args, **kwargs)

        block.attn.call = counted
    loop._accumulated_gradients(*_first(_data()))
    return len(calls)


def test_recompute_attention_reruns_the_attention_in_the_backward_pass():
    """Observed, not inferred from equal gradients: with recomputation each block's attention runs twice."""
    blocks = len(_loop().model.blocks)
    assert _attention_calls_in_one_gradient(_loop()) == blocks
    assert _attention_calls_in_one_gradient(_loop(recompute=True)) == 2 * blocks


def test_xla_compiled_step_matches_on_the_dense_model():
    dense = TINY.replace(dense=True, n_dense_layers=0)
    x, y = _first(_data())
    plain, compiled = _loop(model_cfg=dense), _loop(STEP.replace(jit_compile=True), model_cfg=dense)
    compiled.model.set_weights(plain.model.get_weights())
    loss_a, grads_a, _ = plain._accumulated_gradients(x, y)
    loss_b, grads_b, _ = compiled._gradients(x, y)
    assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-4)
    assert len(grads_a) == len(grads_b) == len(plain.model.trainable_variables)
    for a, b in zip(grads_a, grads_b, strict=True):  # XLA reorders float sums: a small tolerance
        np.testing.assert_allclose(tf.convert_to_tensor(a), tf.convert_to_tensor(b), atol=2e-5, rtol=1e-3)


def test_xla_with_dropless_moe_is_a_config_error():
    with pytest.raises(ConfigError, match="moe_dispatch capacity"):
        _loop(STEP.replace(jit_compile=True, moe_dispatch="dropless"))
    with pytest.raises(ConfigError, match="resolve 'auto'"):
        _loop(STEP.replace(precision="auto"))


def test_compiled_capacity_step_equals_the_dropless_step_when_nothing_is_dropped():
    """XLA with capacity dispatch (factor E/K: capacity N, so no copy can be dropped) against the eager dropless
    step on one batch: loss to 1e-4 relative, gradients to 2e-5 + 1e-3 relative (XLA reorders float sums)."""
    experts, k = TINY.n_routed_experts, TINY.n_activated_experts
    plain = _loop()
    compiled = _loop(STEP.replace(jit_compile=True, moe_dispatch="auto", moe_capacity_factor=experts / k))
    assert (plain.dispatch, compiled.dispatch) == ("dropless", "capacity")
    x, y = _first(_data())
    compiled.model.set_weights(plain.model.get_weights())
    loss_a, grads_a, (load_a, dropped_a) = plain._accumulated_gradients(x, y)
    loss_b, grads_b, (load_b, dropped_b) = compiled._gradients(x, y)
    assert float(loss_a) == pytest.approx(float(loss_b), rel=1e-4)
    assert float(tf.reduce_sum(dropped_b)) == 0.0
    for a, b in zip(load_a, load_b, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(grads_a, grads_b, strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(a), tf.convert_to_tensor(b), atol=2e-5, rtol=1e-3)


def _moe_input(model, x):
    """What the first MoE layer receives for token ids ``x`` [B, T], as [B*T, D] (computed eagerly)."""
    hidden = model.embed(x)
    for block in model.blocks:
        if block.is_moe:
            return tf.reshape(block.ffn_norm(hidden + block.attn(block.attn_norm(hidden))), [-1, TINY.d_model])
        hidden = block(hidden)
    raise AssertionError("no MoE layer")


def _numpy_dropped(model, x, capacity_factor):
    """Token copies over capacity when the MoE layer routes ``x`` [B, T] (a NumPy count), and all copies."""
    idx = model.moe_layers()[0].route(_moe_input(model, x))[0].numpy()
    capacity = math.ceil(capacity_factor * idx.size / TINY.n_routed_experts)
    taken, dropped = np.zeros(TINY.n_routed_experts, int), 0
    for e in idx.T.ravel():  # k-major: every first choice, then every second choice
        taken[e] += 1
        dropped += int(taken[e] > capacity)
    return dropped, idx.size


def test_dropped_fraction_is_reported_per_step_and_matches_a_numpy_count(tmp_path, caplog):
    """Small capacity, two micro-batches: the step returns, logs and writes the share of token copies over
    capacity, equal to counting them in NumPy from the same routing."""
    loop = _loop(STEP.replace(jit_compile=True, moe_capacity_factor=0.5, grad_accum_steps=2, train_steps=1,
                              log_every=1))
    x, y = _first(_data())
    counts = [_numpy_dropped(loop.model, half, 0.5) for half in (x[:2], x[2:])]
    dropped, copies = sum(c[0] for c in counts), sum(c[1] for c in counts)
    assert dropped > 0
    writer = tf.summary.create_file_writer(str(tmp_path))
    with caplog.at_level(logging.INFO, logger="deepseek_tfx.trainer_module.train_loop"):
        loop.train(tf.data.Dataset.from_tensors((x, y)), 1, writer)
    writer.flush()
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step 1/1")]
    assert f"dropped {100 * dropped / copies:.2f}%" in logged[0]
    events = [v for f in tf.io.gfile.glob(str(tmp_path / "*")) for e in tf.compat.v1.train.summary_iterator(f)
              for v in e.summary.value if v.tag == "moe/dropped_fraction/0"]
    assert float(tf.make_ndarray(events[0].tensor)) == pytest.approx(dropped / copies)


def test_the_balancing_bias_moves_once_per_step_on_the_whole_step_load():
    """With a nonzero bias speed, two accumulated micro-batches move the bias exactly as one big batch does:
    the load of both micro-batches, one update after the optimizer step."""
    cfg = TINY.replace(bias_update_speed=0.01)
    big, accumulated = _loop(model_cfg=cfg), _loop(STEP.replace(grad_accum_steps=2), model_cfg=cfg)
    for loop in (big, accumulated):
        loop.model.set_weights(big.model.get_weights())
        loop.model.moe_layers()[0].expert_bias.assign([0.02, -0.01, 0.0, 0.01])
    x, y = _first(_data())
    expected_load = sum(np.bincount(
        big.model.moe_layers()[0].route(_moe_input(big.model, half))[0].numpy().ravel(), minlength=4)
        for half in (x[:2], x[2:]))
    for loop in (big, accumulated):
        loop._train_step(x, y)
    moe_big, moe_acc = big.model.moe_layers()[0], accumulated.model.moe_layers()[0]
    np.testing.assert_array_equal(moe_acc.expert_load.numpy(), expected_load)
    np.testing.assert_array_equal(moe_big.expert_load.numpy(), expected_load)
    np.testing.assert_allclose(moe_acc.expert_bias.numpy(), moe_big.expert_bias.numpy(), atol=1e-7)
    expected_bias = np.array([0.02, -0.01, 0.0, 0.01]) + 0.01 * np.sign(expected_load.mean() - expected_load)
    np.testing.assert_allclose(moe_acc.expert_bias.numpy(), expected_bias, atol=1e-7)
    for a, b in zip(big.model.get_weights(), accumulated.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


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
    with pytest.raises(FloatingPointError, match=r"diverged at step 11: .*last good checkpoint, step 10") as error:
        loop.train(_data().skip(10), 20, start_step=10, checkpointer=ckpt)
    lr = STEP.learning_rate  # the message says which field to change, and how
    assert f"Lower TrainConfig.learning_rate (now {lr:g}; e.g. --set train.learning_rate={lr / 3:.2g})" in \
        str(error.value)
    assert "--set train.warmup_steps=" in str(error.value)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-10")
    reader = tf.train.load_checkpoint(str(tmp_path))
    assert all(np.isfinite(reader.get_tensor(name)).all()
               for name, _ in tf.train.list_variables(str(tmp_path)) if "model" in name)


def test_time_limit_stops_early_and_says_so(caplog):
    loop = _loop(STEP.replace(max_train_seconds=0.01))
    result = loop.train(_data(), 50)
    assert result.stopped_by_time and 1 <= result.steps < 50
    # A time-limited run's ETA is at most the time left, however many steps the range still holds.
    loop = _loop(STEP.replace(max_train_seconds=6, log_every=10))
    with caplog.at_level(logging.INFO, logger="deepseek_tfx.trainer_module.train_loop"):
        assert loop.train(_data().repeat(), 1_000_000).stopped_by_time
    etas = [float(r.getMessage().rsplit("ETA ", 1)[1].rstrip("s")) for r in caplog.records if "ETA" in r.getMessage()]
    assert len(etas) > 1 and all(eta <= 6 for eta in etas)


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


def test_adamw_decays_matrices_only():
    """With zero gradients Adam's step is zero, so what changes is the decoupled weight decay alone."""
    cfg = STEP.replace(warmup_steps=0, learning_rate=0.1, weight_decay=0.5)
    loop = _loop(cfg)
    variables = loop.model.trainable_variables
    before = [v.numpy().copy() for v in variables]
    loop.optimizer.apply_gradients([(tf.zeros_like(v), v) for v in variables])
    lr = cfg.learning_rate  # step 0 of the cosine after no warmup: the peak
    assert any(len(v.shape) < 2 for v in variables) and any(len(v.shape) >= 2 for v in variables)
    for v, old in zip(variables, before, strict=True):
        expected = old if len(v.shape) < 2 else old * (1 - lr * cfg.weight_decay)  # norms' scales, biases: none
        np.testing.assert_allclose(v.numpy(), expected, rtol=1e-6, err_msg=v.name)


def test_learning_rate_warms_up_linearly_then_follows_a_cosine():
    cfg = STEP.replace(train_steps=110, warmup_steps=10, learning_rate=0.02, min_learning_rate_ratio=0.1)
    schedule = make_optimizer(_loop().model, cfg)._learning_rate  # the schedule the optimizer steps
    assert isinstance(schedule, WarmupCosine)
    peak, low = cfg.learning_rate, cfg.learning_rate * cfg.min_learning_rate_ratio

    def expected(step):
        if step < 10:
            return peak * step / 10
        progress = min((step - 10) / 100, 1.0)
        return low + (peak - low) * 0.5 * (1 + np.cos(np.pi * progress))

    for step in (0, 1, 5, 9, 10, 35, 60, 85, 110, 200):
        assert float(schedule(step)) == pytest.approx(expected(step), rel=1e-5, abs=1e-9), step
    assert float(schedule(60)) == pytest.approx((peak + low) / 2, rel=1e-5)  # the cosine's midpoint

    # A tf.Variable end (bench.quality_bench re-sizes it to a time budget): the schedule, traced once as in the
    # train step, follows its value.
    end = tf.Variable(110.0)
    resizable = tf.function(make_optimizer(_loop().model, cfg, schedule_steps=end)._learning_rate)
    assert float(resizable(tf.constant(60))) == pytest.approx((peak + low) / 2, rel=1e-5)
    end.assign(60.0)
    assert float(resizable(tf.constant(35))) == pytest.approx((peak + low) / 2, rel=1e-5)
    assert float(resizable(tf.constant(60))) == pytest.approx(low, rel=1e-5)


def test_gradients_are_clipped_to_the_global_norm():
    optimizer = make_optimizer(_loop().model, STEP.replace(grad_clip_norm=1.0))
    grads = [tf.fill([3, 4], 2.0), tf.fill([5], -3.0)]  # global norm sqrt(48 + 45) > 1
    clipped = optimizer._clip_gradients(grads)
    assert float(tf.linalg.global_norm(clipped)) == pytest.approx(1.0, rel=1e-5)
    ratio = clipped[0].numpy() / grads[0].numpy()
    np.testing.assert_allclose(clipped[1].numpy() / grads[1].numpy(), ratio[0, 0], rtol=1e-6)  # one scale
    unclipped = make_optimizer(_loop().model, STEP.replace(grad_clip_norm=0.0))._clip_gradients(grads)
    np.testing.assert_array_equal(unclipped[0].numpy(), grads[0].numpy())


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_training_steps(precision):
    """A few real steps under each mixed policy: float16 with dynamic loss scaling, bfloat16 without."""
    import tf_keras as keras

    cfg = STEP.replace(precision=precision)
    keras.mixed_precision.set_global_policy(precision)
    try:
        loop = _loop(cfg)
        compute = "float16" if precision == "mixed_float16" else "bfloat16"
        assert loop.model.blocks[0].attn.compute_dtype == compute
        assert loop.model.trainable_variables[0].dtype == tf.float32  # float32 master weights
        scaled = isinstance(loop.optimizer, keras.mixed_precision.LossScaleOptimizer)
        assert scaled == (precision == "mixed_float16")
        before = [v.numpy().copy() for v in loop.model.trainable_variables]
        calls = []
        if scaled:  # the step scales the loss and unscales the gradients (observed when it is traced)
            for name in ("get_scaled_loss", "get_unscaled_gradients"):
                real = getattr(loop.optimizer, name)
                setattr(loop.optimizer, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a))
        result = loop.train(_data(), 3)
        assert np.isfinite(result.last_loss) and result.steps == 3
        assert any(not np.array_equal(b, v.numpy()) for b, v in zip(before, loop.model.trainable_variables,
                                                                      strict=True))
        if scaled:
            assert set(calls) == {"get_scaled_loss", "get_unscaled_gradients"}
            assert float(loop.optimizer.loss_scale) > 1  # dynamic scaling in use
    finally:
        keras.mixed_precision.set_global_policy("float32")


class _FakeStrategy:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


def test_strategy_follows_the_devices_and_the_cluster(monkeypatch):
    from types import SimpleNamespace

    from deepseek_tfx.trainer_module import trainer

    mirrored = type("Mirrored", (_FakeStrategy,), {})
    multi_worker = type("MultiWorker", (_FakeStrategy,), {})
    monkeypatch.setattr(tf.distribute, "MirroredStrategy", mirrored)
    monkeypatch.setattr(tf.distribute, "MultiWorkerMirroredStrategy", multi_worker)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    devices = {"GPU": []}
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: devices.get(kind, []))

    assert trainer.get_strategy() is tf.distribute.get_strategy()  # one device: the default strategy
    devices["GPU"] = [SimpleNamespace(name="/GPU:0")]
    assert trainer.get_strategy() is tf.distribute.get_strategy()  # one GPU: still no mirroring
    devices["GPU"] = [SimpleNamespace(name="/GPU:0"), SimpleNamespace(name="/GPU:1")]
    assert isinstance(trainer.get_strategy(), mirrored)
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["a:1", "b:1"]},
                                                "task": {"type": "worker", "index": 1}}))
    assert isinstance(trainer.get_strategy(), multi_worker)
    assert trainer.task_info() == (False, 1)

    # An attached TPU wins: the TPU system is initialised and TPUStrategy built over its resolver.
    calls = []
    tpu = type("TPU", (_FakeStrategy,), {})
    monkeypatch.setattr(tf.distribute, "TPUStrategy", tpu)
    monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", lambda r: calls.append(("connect", r)))
    monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", lambda r: calls.append(("initialize", r)))
    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", lambda tpu: f"resolver({tpu})")
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: devices.get(kind, []))
    assert trainer.tpu_cluster_resolver() is None  # no TPU device, no TPU_NAME
    devices["TPU"] = [SimpleNamespace(name="/physical_device:TPU:0")]  # a TPU VM
    strategy = trainer.get_strategy()
    assert isinstance(strategy, tpu) and strategy.args == ("resolver(local)",)
    assert calls == [("connect", "resolver(local)"), ("initialize", "resolver(local)")]
    devices["TPU"] = []
    monkeypatch.setenv("TPU_NAME", "my-tpu-node")  # a TPU node, named the way tf.distribute reads it
    assert trainer.tpu_cluster_resolver() == "resolver(my-tpu-node)"


def test_checkpoint_directory_is_keyed_by_inputs_base_model_steps_and_config(tmp_path):
    """A rerun with any of these changed must not resume a stale checkpoint; the same inputs must resume."""
    from types import SimpleNamespace

    from deepseek_tfx.trainer_module import trainer

    def fn_args(**changes):
        fields = dict(train_files=[str(tmp_path / "train-0")], transform_output=str(tmp_path / "tft"),
                      base_model=None, train_steps=10,
                      model_run_dir=str(tmp_path / "root" / "Trainer" / "model_run" / "7"))
        return SimpleNamespace(**{**fields, **changes})

    custom = {"model": TINY.to_dict(), "train": STEP.to_dict(), "preset": "tiny"}
    base = trainer.checkpoint_dir(fn_args(), custom)
    assert base.startswith(str(tmp_path / "root" / "Trainer" / "checkpoints"))
    assert trainer.checkpoint_dir(fn_args(model_run_dir=str(tmp_path / "root" / "Trainer" / "model_run" / "8")),
                                  custom) == base  # a new execution of the same inputs resumes
    changed = {
        "inputs": trainer.checkpoint_dir(fn_args(train_files=[str(tmp_path / "train-1")]), custom),
        "transform": trainer.checkpoint_dir(fn_args(transform_output=str(tmp_path / "tft2")), custom),
        "base model": trainer.checkpoint_dir(fn_args(base_model=str(tmp_path / "blessed")), custom),
        "steps": trainer.checkpoint_dir(fn_args(train_steps=11), custom),
        "learning rate": trainer.checkpoint_dir(
            fn_args(), {**custom, "train": STEP.replace(learning_rate=1e-4).to_dict()}),
        "model config": trainer.checkpoint_dir(fn_args(), {**custom, "model": TINY.replace(d_model=32).to_dict()}),
    }
    for what, directory in changed.items():
        assert directory != base, what
    assert len(set(changed.values())) == len(changed)
    elsewhere = trainer.checkpoint_dir(fn_args(), {**custom, "checkpoint_root": "gs://bucket/ckpt"})
    assert elsewhere == "gs://bucket/ckpt/" + os.path.basename(base)  # the root is not part of the key


def _three_checkpoints(tmp_path):
    """Checkpoints at steps 5, 10, 15, and the weights the model had at step 10."""
    loop = _loop(STEP.replace(checkpoint_every=5))
    ckpt = Checkpointer(loop.model, loop.optimizer, str(tmp_path), keep=3)
    loop.train(_data(), 10, checkpointer=ckpt)
    at_10 = [w.copy() for w in loop.model.get_weights()]
    loop.train(_data().skip(10), 15, start_step=10, checkpointer=ckpt)
    return at_10


def _restore_fresh(tmp_path):
    fresh = _loop(seed=5)
    fresh.optimizer.build(fresh.model.trainable_variables)
    return fresh, Checkpointer(fresh.model, fresh.optimizer, str(tmp_path), keep=3).restore()


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_newest_good_one(tmp_path, caplog, damage):
    at_10 = _three_checkpoints(tmp_path)
    newest = tmp_path / "ckpt-15.data-00000-of-00001"
    if damage == "truncated":  # a crash while writing it
        newest.write_bytes(newest.read_bytes()[:100])
    else:  # its files gone, the state file still naming it
        newest.unlink()
        (tmp_path / "ckpt-15.index").unlink()
    with caplog.at_level(logging.WARNING, logger="deepseek_tfx.trainer_module.train_loop"):
        fresh, step = _restore_fresh(tmp_path)
    assert step == 10 and int(fresh.optimizer.iterations) == 10
    for a, b in zip(at_10, fresh.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert f"Checkpoint {tmp_path / 'ckpt-15'} cannot be restored" in caplog.text


def test_no_restorable_checkpoint_starts_from_zero_and_says_so(tmp_path, caplog):
    _three_checkpoints(tmp_path)
    for data in tmp_path.glob("ckpt-*.data-*"):
        data.write_bytes(data.read_bytes()[:100])  # truncated: some values may be read before it fails
    untouched = _loop(seed=5)  # what _restore_fresh builds, before any restore
    untouched.optimizer.build(untouched.model.trainable_variables)
    with caplog.at_level(logging.WARNING, logger="deepseek_tfx.trainer_module.train_loop"):
        fresh, step = _restore_fresh(tmp_path)
    assert step == 0 and int(fresh.optimizer.iterations) == 0
    for a, b in zip(untouched.model.get_weights(), fresh.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)  # nothing of a failed attempt is left behind
    assert "No checkpoint in" in caplog.text and "training starts from step 0" in caplog.text


_REPLICA_SCRIPT = r"""
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.train_loop import TrainLoop, make_optimizer
from tests.test_train_loop import STEP, TINY, _data, _first

cfg = TINY.replace(bias_update_speed=0.01)
out, weights = {}, None
for name, strategy in (("one", tf.distribute.get_strategy()),
                       ("two", tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))):
    with strategy.scope():
        model = DeepSeekLM(cfg)
        model(tf.zeros([1, 8], tf.int64))
        weights = weights or model.get_weights()
        model.set_weights(weights)
        loop = TrainLoop(model, make_optimizer(model, STEP), strategy, STEP)
    ds = tf.data.Dataset.from_tensors(_first(_data()))
    loop._train_step(*next(iter(strategy.experimental_distribute_dataset(ds))))
    moe = model.moe_layers()[0]
    out[name] = {"replicas": strategy.num_replicas_in_sync, "load": moe.expert_load.numpy().tolist(),
                 "bias": moe.expert_bias.numpy().tolist()}
json.dump(out, sys.stdout)
"""


def test_the_balancing_bias_sees_the_load_of_every_replica():
    """MirroredStrategy over two CPU devices (a fresh process: devices are fixed at start-up): each replica
    routes half the batch, and the bias moves on the load of both halves, as on one device."""
    done = subprocess.run([sys.executable, "-c", _REPLICA_SCRIPT], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["one"]["replicas"], out["two"]["replicas"]) == (1, 2)
    assert sum(out["two"]["load"]) == 4 * TINY.context_len * TINY.n_activated_experts  # both halves counted
    assert out["two"]["load"] == out["one"]["load"]
    np.testing.assert_allclose(out["two"]["bias"], out["one"]["bias"], atol=1e-7)
