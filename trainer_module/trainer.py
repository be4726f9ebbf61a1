"""The Trainer's ``run_fn``: builds the model, trains it on packed blocks, exports it.

Config comes only from ``fn_args``: ``custom_config['model']`` and
``custom_config['train']`` (dicts of ModelConfig / TrainConfig), the train steps
from TrainArgs, and the vocabulary size from the tokenizer. The model run
directory receives TensorBoard logs and ``training_summary.json``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time

import tensorflow as tf
import tensorflow_transform as tft
import tf_keras as keras

from trainer_module import data, export
from trainer_module.config import ModelConfig, TrainConfig
from trainer_module.model import DeepSeekLM, token_nll
from trainer_module.tokenizer import ByteTokenizer

log = logging.getLogger(f"deepseek_tfx.{__name__}")
SUMMARY_FILE = "training_summary.json"


def get_strategy() -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy when TF_CONFIG names a cluster, else MirroredStrategy.

    TF_CONFIG is tf.distribute's own contract (Vertex AI and Kubeflow set it).
    """
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    if sum(len(v) for v in cluster.values()) > 1:
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.MirroredStrategy()


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


class ProgressLogger(keras.callbacks.Callback):
    """Logs step, loss, learning rate, tokens per second and ETA every ``every`` steps."""

    def __init__(self, total_steps: int, tokens_per_step: int, every: int):
        super().__init__()
        self.total, self.tokens_per_step, self.every = total_steps, tokens_per_step, every
        self.last_loss = float("nan")
        self._supports_tf_logs = True  # logs stay tensors: no host sync on steps we do not log

    def on_train_begin(self, logs=None):
        self.start = self.mark = time.perf_counter()
        self.mark_step = 0

    def on_train_batch_end(self, batch, logs=None):
        step = batch + 1
        if step % self.every and step != self.total:
            return
        self.last_loss = float(logs["loss"])
        if not math.isfinite(self.last_loss):
            raise FloatingPointError(f"training loss became {self.last_loss} by step {step}")
        now = time.perf_counter()
        rate = (step - self.mark_step) * self.tokens_per_step / max(now - self.mark, 1e-9)
        eta = (self.total - step) * (now - self.start) / step
        lr = self.model.optimizer.learning_rate
        lr = float(keras.backend.get_value(lr(self.model.optimizer.iterations) if callable(lr) else lr))
        log.info("step %d/%d loss %.4f lr %.2e tokens/s %.0f ETA %.0fs",
                     step, self.total, self.last_loss, lr, rate, eta)
        self.mark, self.mark_step = now, step


def _lm_loss(targets, logits):
    return tf.reduce_mean(token_nll(logits, targets))


def build_and_compile(model_cfg: ModelConfig, train_cfg: TrainConfig) -> DeepSeekLM:
    """Creates the model and its AdamW optimizer (decay on matrices only) in the current scope."""
    model = DeepSeekLM(model_cfg)
    model(tf.zeros([1, 8], tf.int64))  # create the weights
    schedule = WarmupCosine(train_cfg.learning_rate, train_cfg.warmup_steps, train_cfg.train_steps,
                            train_cfg.min_learning_rate_ratio)
    optimizer = keras.optimizers.AdamW(
        learning_rate=schedule, weight_decay=train_cfg.weight_decay, beta_1=0.9, beta_2=0.95,
        global_clipnorm=train_cfg.grad_clip_norm or None)
    optimizer.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables
                                                  if len(v.shape) < 2])
    model.compile(optimizer=optimizer, loss=_lm_loss)
    return model


def run_fn(fn_args) -> None:
    """TFX Trainer entry point."""
    custom = fn_args.custom_config or {}
    train_cfg = TrainConfig.from_dict(custom.get("train", {})).replace(train_steps=fn_args.train_steps)
    tokenizer = ByteTokenizer()
    model_cfg = ModelConfig.from_dict(custom.get("model", {})).replace(vocab_size=tokenizer.vocab_size)
    tf_transform_output = tft.TFTransformOutput(fn_args.transform_output)

    keras.utils.set_random_seed(train_cfg.seed)
    keras.mixed_precision.set_global_policy(train_cfg.precision)
    strategy = get_strategy()
    with strategy.scope():
        model = build_and_compile(model_cfg, train_cfg)
    log.info("Model: %d parameters, %d replica(s), precision %s",
                 model.count_params(), strategy.num_replicas_in_sync, train_cfg.precision)

    t = model_cfg.context_len
    train_ds = data.packed_blocks(fn_args.train_files, t, train_cfg.batch_size, seed=train_cfg.seed,
                                  shuffle_buffer=train_cfg.shuffle_buffer)
    progress = ProgressLogger(train_cfg.train_steps, train_cfg.batch_size * t, train_cfg.log_every)
    start = time.perf_counter()
    model.fit(train_ds, epochs=1, steps_per_epoch=train_cfg.train_steps, verbose=0, callbacks=[
        progress, keras.callbacks.TensorBoard(log_dir=fn_args.model_run_dir, update_freq=train_cfg.log_every)])
    seconds = time.perf_counter() - start

    eval_loss = float("nan")
    if train_cfg.eval_batches:
        eval_ds = data.packed_blocks(fn_args.eval_files, t, train_cfg.batch_size, seed=train_cfg.seed,
                                     shuffle=False, repeat=False).take(train_cfg.eval_batches)
        eval_loss = float(model.evaluate(eval_ds, verbose=0))
    tokens = train_cfg.train_steps * train_cfg.batch_size * t
    summary = {
        "train_steps": train_cfg.train_steps, "train_tokens": tokens, "train_seconds": seconds,
        "tokens_per_second": tokens / seconds, "final_train_loss": progress.last_loss,
        "eval_loss_sampled": eval_loss, "parameters": model.count_params(),
        "model": model_cfg.to_dict(), "train": train_cfg.to_dict(),
    }
    log.info("Trained %d steps in %.1fs (%.0f tokens/s); last loss %.4f, sampled eval loss %.4f",
                 train_cfg.train_steps, seconds, tokens / seconds, progress.last_loss, eval_loss)
    tf.io.gfile.makedirs(fn_args.model_run_dir)
    with tf.io.gfile.GFile(os.path.join(fn_args.model_run_dir, SUMMARY_FILE), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)

    # Export in float32 so serving does not depend on the training precision.
    keras.mixed_precision.set_global_policy("float32")
    serving_model = DeepSeekLM(model_cfg)
    serving_model(tf.zeros([1, 8], tf.int64))
    serving_model.set_weights(model.get_weights())
    export.export_serving_model(serving_model, tf_transform_output, tokenizer,
                                fn_args.serving_model_dir, extra_config={"train": train_cfg.to_dict()})
