"""The training loop: an explicit tf.distribute step, logged to TensorBoard.

Why not ``model.fit``: tf_keras's training internals are not on autograph's
skip list, so ``fit`` autograph-converts about 1,900 functions before the first
step. Measured on this 2-core machine (tiny preset): first step 34 s with
``fit`` against 6 s here, and 22.6K against 36K tokens/s after it. The model
uses only static Python control flow, so the step is traced with
``autograph=False``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import tensorflow as tf
import tf_keras as keras

from trainer_module.config import TrainConfig
from trainer_module.model import DeepSeekLM, token_nll

log = logging.getLogger(f"deepseek_tfx.{__name__}")


class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to ``peak`` over ``warmup`` steps, then cosine to ``peak * min_ratio``."""

    def __init__(self, peak: float, warmup: int, total: int, min_ratio: float):
        self.peak, self.warmup, self.total, self.min_ratio = peak, warmup, total, min_ratio

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warm = self.peak * step / max(self.warmup, 1)
        progress = tf.clip_by_value((step - self.warmup) / max(self.total - self.warmup, 1), 0.0, 1.0)
        cosine = self.peak * (self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + tf.cos(math.pi * progress)))
        return tf.where(step < self.warmup, warm, cosine)

    def get_config(self):
        return {"peak": self.peak, "warmup": self.warmup, "total": self.total, "min_ratio": self.min_ratio}


def make_optimizer(model: DeepSeekLM, cfg: TrainConfig) -> keras.optimizers.Optimizer:
    """AdamW with decay on matrices only, warmup + cosine schedule, global-norm clipping."""
    optimizer = keras.optimizers.AdamW(
        learning_rate=WarmupCosine(cfg.learning_rate, cfg.warmup_steps, cfg.train_steps,
                                   cfg.min_learning_rate_ratio),
        weight_decay=cfg.weight_decay, beta_1=0.9, beta_2=0.95,
        global_clipnorm=cfg.grad_clip_norm or None, jit_compile=False)
    optimizer.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
    if cfg.precision == "mixed_float16":
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


@dataclasses.dataclass
class TrainResult:
    steps: int
    seconds: float
    tokens: int
    last_loss: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)


class TrainLoop:
    """Runs distributed train steps of a DeepSeekLM and logs them."""

    def __init__(self, model: DeepSeekLM, optimizer, strategy: tf.distribute.Strategy, cfg: TrainConfig):
        self.model, self.optimizer, self.strategy, self.cfg = model, optimizer, strategy, cfg
        self._scaled = isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
        self._train_step = tf.function(self._distributed_step, autograph=False)
        self._eval_step = tf.function(self._distributed_eval, autograph=False)

    def _replica_step(self, x, y):
        replicas = self.strategy.num_replicas_in_sync
        with tf.GradientTape() as tape:
            logits, mtp_logits = self.model.train_logits(x)
            loss = tf.reduce_mean(token_nll(logits, y))
            aux = tf.add_n(self.model.losses) if self.model.losses else 0.0
            if mtp_logits is not None:  # position i also predicts token i+2 = y[i+1]
                aux += self.model.config.mtp_loss_weight * tf.reduce_mean(token_nll(mtp_logits, y[:, 1:]))
            objective = (loss + aux) / replicas
            if self._scaled:
                objective = self.optimizer.get_scaled_loss(objective)
        variables = self.model.trainable_variables
        grads = tape.gradient(objective, variables)
        if self._scaled:
            grads = self.optimizer.get_unscaled_gradients(grads)
        grad_norm = tf.linalg.global_norm(grads) * replicas
        self.optimizer.apply_gradients(zip(grads, variables))
        return loss, grad_norm

    def _distributed_step(self, x, y):
        loss, norm = self.strategy.run(self._replica_step, args=(x, y))
        mean = tf.distribute.ReduceOp.MEAN
        return self.strategy.reduce(mean, loss, axis=None), self.strategy.reduce(mean, norm, axis=None)

    def _distributed_eval(self, x, y):
        def replica(x, y):
            return tf.reduce_mean(token_nll(self.model(x, training=False), y))

        loss = self.strategy.run(replica, args=(x, y))
        return self.strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None)

    def learning_rate(self) -> float:
        lr = self.optimizer.learning_rate
        return float(keras.backend.get_value(lr(self.optimizer.iterations) if callable(lr) else lr))

    def train(self, dataset: tf.data.Dataset, steps: int, writer=None) -> TrainResult:
        """Runs ``steps`` steps; logs every ``cfg.log_every``; raises FloatingPointError on NaN/Inf loss."""
        iterator = iter(self.strategy.experimental_distribute_dataset(dataset))
        tokens_per_step = self.cfg.batch_size * self.model.config.context_len
        start = mark = time.perf_counter()
        mark_step, loss = 0, float("nan")
        for step in range(1, steps + 1):
            x, y = next(iterator)
            loss_t, norm_t = self._train_step(x, y)
            if step % self.cfg.log_every and step != steps:
                continue
            loss, norm = float(loss_t), float(norm_t)
            if not (math.isfinite(loss) and math.isfinite(norm)):
                raise FloatingPointError(
                    f"training diverged: loss {loss}, gradient norm {norm} at or before step {step}")
            now = time.perf_counter()
            rate = (step - mark_step) * tokens_per_step / max(now - mark, 1e-9)
            eta = (steps - step) * (now - start) / step
            lr = self.learning_rate()
            log.info("step %d/%d loss %.4f grad_norm %.3f lr %.2e tokens/s %.0f ETA %.0fs",
                     step, steps, loss, norm, lr, rate, eta)
            if writer is not None:
                with writer.as_default(step=step):
                    tf.summary.scalar("train/loss", loss)
                    tf.summary.scalar("train/grad_norm", norm)
                    tf.summary.scalar("train/learning_rate", lr)
                    tf.summary.scalar("train/tokens_per_second", rate)
                    for i, moe in enumerate(self.model.moe_layers()):
                        load = moe.expert_load.numpy()
                        tf.summary.scalar(f"moe/load_max_over_mean/{i}", load.max() / max(load.mean(), 1e-9))
            mark, mark_step = now, step
        seconds = time.perf_counter() - start
        return TrainResult(steps=steps, seconds=seconds, tokens=steps * tokens_per_step, last_loss=loss)

    def evaluate(self, dataset: tf.data.Dataset) -> float:
        """Mean token NLL over the batches of ``dataset`` (nan when it is empty)."""
        losses = [float(self._eval_step(x, y))
                  for x, y in self.strategy.experimental_distribute_dataset(dataset)]
        return sum(losses) / len(losses) if losses else float("nan")
