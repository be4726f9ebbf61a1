"""The training loop: an explicit tf.distribute step, logged to TensorBoard.

Why not ``model.fit``: tf_keras's training internals are not on autograph's
skip list, so ``fit`` autograph-converts about 1,900 functions before the first
step, and its first step and its steady speed are both slower than this loop's
(BENCHMARKS.md, "Training start-up"). The model uses only static Python control
flow, so the step is traced with ``autograph=False``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time

import tensorflow as tf
import tf_keras as keras

from deepseek_tfx.trainer_module.config import ConfigError, TrainConfig
from deepseek_tfx.trainer_module.model import DeepSeekLM, token_nll

log = logging.getLogger(__name__)


class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to ``peak`` over ``warmup`` steps, then cosine to ``peak * min_ratio``."""

    def __init__(self, peak: float, warmup: int, total: int, min_ratio: float):
        self.peak, self.warmup, self.total, self.min_ratio = peak, warmup, total, min_ratio

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warm = self.peak * step / max(self.warmup, 1)
        span = tf.maximum(tf.cast(self.total, tf.float32) - self.warmup, 1.0)  # total may be a tf.Variable
        progress = tf.clip_by_value((step - self.warmup) / span, 0.0, 1.0)
        cosine = self.peak * (self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + tf.cos(math.pi * progress)))
        return tf.where(step < self.warmup, warm, cosine)

    def get_config(self):
        return {"peak": self.peak, "warmup": self.warmup, "total": self.total, "min_ratio": self.min_ratio}


def make_optimizer(model: DeepSeekLM, cfg: TrainConfig, schedule_steps: int | tf.Variable | None = None
                   ) -> keras.optimizers.Optimizer:
    """AdamW with decay on matrices only, warmup + cosine schedule, global-norm clipping.

    ``schedule_steps``: where the cosine ends; default ``cfg.train_steps``; a tf.Variable lets the caller
    re-size the schedule while training (bench.quality_bench ends it with a time budget).
    """
    optimizer = keras.optimizers.AdamW(
        learning_rate=WarmupCosine(cfg.learning_rate, cfg.warmup_steps,
                                   cfg.train_steps if schedule_steps is None else schedule_steps,
                                   cfg.min_learning_rate_ratio),
        weight_decay=cfg.weight_decay, beta_1=0.9, beta_2=0.95,
        global_clipnorm=cfg.grad_clip_norm or None, jit_compile=False)
    optimizer.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables if len(v.shape) < 2])
    if cfg.precision == "mixed_float16":
        optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


@dataclasses.dataclass
class TrainResult:
    start_step: int
    """Step the run resumed from (0: a fresh start)."""
    steps: int
    """Last step reached (== train_steps unless the time limit stopped it)."""
    seconds: float
    """Wall time of this run's steps, including the first step's tracing."""
    steady_seconds: float
    """Wall time after this run's first step (tracing excluded)."""
    tokens: int
    """Tokens trained on in this run."""
    steady_tokens: int
    last_loss: float
    stopped_by_time: bool = False

    @property
    def tokens_per_second(self) -> float:
        """Steady-state rate: after the first step, whose time is mostly tracing."""
        if self.steady_seconds <= 0:
            return self.tokens / max(self.seconds, 1e-9)
        return self.steady_tokens / self.steady_seconds


class Checkpointer:
    """Checkpoints of model and optimizer (whose ``iterations`` is the step) every N steps.

    Under MultiWorkerMirroredStrategy every worker must take part in a save;
    only the chief writes to ``directory``, the others to a scratch directory
    that is deleted again (tf.distribute's documented pattern).
    """

    def __init__(self, model, optimizer, directory: str, keep: int, is_chief: bool = True,
                 worker_id: int = 0):
        self.directory = directory
        self._is_chief = is_chief
        target = directory if is_chief else os.path.join(directory, f".worker-{worker_id}-scratch")
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        self._model, self._optimizer = model, optimizer
        self._manager = tf.train.CheckpointManager(self._checkpoint, target, max_to_keep=keep)
        self.last_step: int | None = None

    def _saved(self) -> list[str]:
        """Checkpoint prefixes in ``directory``, newest step first: those the state file lists (even when their
        files are gone) and any ``ckpt-N.index`` on disk."""
        state = tf.train.get_checkpoint_state(self.directory)
        listed = [os.path.join(self.directory, os.path.basename(p))
                  for p in (state.all_model_checkpoint_paths if state else [])]
        on_disk = [p[:-len(".index")] for p in tf.io.gfile.glob(os.path.join(self.directory, "ckpt-*.index"))]
        return sorted(set(listed) | set(on_disk), key=lambda p: int(p.rsplit("-", 1)[-1]), reverse=True)

    def restore(self) -> int:
        """Restores the newest good checkpoint in ``directory``; returns its step (0 if there is none).

        A checkpoint that cannot be restored (truncated or missing files, a mismatch) is skipped with a
        warning naming it, and the next older one is tried: a crash while writing the newest checkpoint
        costs the steps since the one before, not the whole run.
        """
        saved = self._saved()
        variables = [*self._model.variables, *self._optimizer.variables]
        initial = [v.numpy() for v in variables] if saved else []
        for path in saved:
            try:
                self._checkpoint.restore(path).assert_existing_objects_matched()
            except (tf.errors.OpError, IndexError) as e:  # unreadable files; a mismatch (AssertionError) is raised
                reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
                log.warning("Checkpoint %s cannot be restored (%s: %s); trying an older one", path,
                            type(e).__name__, reason)
                continue
            self.last_step = int(path.rsplit("-", 1)[-1])
            return self.last_step
        if saved:  # what a failed attempt assigned before it failed is undone
            for variable, value in zip(variables, initial, strict=True):
                variable.assign(value)
            log.warning("No checkpoint in %s could be restored; training starts from step 0", self.directory)
        return 0

    def save(self, step: int) -> None:
        self._manager.save(checkpoint_number=step)
        self.last_step = step
        if not self._is_chief:
            tf.io.gfile.rmtree(self._manager.directory)

    def describe(self) -> str:
        if self.last_step is None:
            return f"no checkpoint was saved in {self.directory}"
        return f"the last good checkpoint, step {self.last_step}, is kept in {self.directory}"


class TrainLoop:
    """Runs distributed train steps of a DeepSeekLM, logs them, checkpoints them.

    Args:
        model, optimizer, strategy, cfg: what to train, how, where.
        flops_per_token: model FLOPs per trained token (trainer_module.flops), for MFU.
        peak_flops: the measured matmul peak of this machine, for MFU.
    """

    def __init__(self, model: DeepSeekLM, optimizer, strategy: tf.distribute.Strategy, cfg: TrainConfig,
                 flops_per_token: float = 0.0, peak_flops: float = 0.0):
        self.model, self.optimizer, self.strategy, self.cfg = model, optimizer, strategy, cfg
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        if cfg.jit_compile not in (True, False) or cfg.precision == "auto":
            raise ConfigError(
                f"TrainLoop needs a decided TrainConfig.precision and jit_compile (got {cfg.precision!r}, "
                f"{cfg.jit_compile!r}): resolve 'auto' with trainer_module.autotune.decide first")
        self.moe = model.trained_moe_layers()
        self.dispatch = self._dispatch(cfg, bool(self.moe))
        for moe in self.moe:
            moe.capacity_factor = cfg.moe_capacity_factor if self.dispatch == "capacity" else None
        self._scaled = isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
        # XLA compiles the loss and gradients; applying them (a cross-replica merge) stays outside.
        self._gradients = (tf.function(self._accumulated_gradients, autograph=False, jit_compile=True)
                           if cfg.jit_compile else self._accumulated_gradients)
        self._train_step = tf.function(self._distributed_step, autograph=False)
        self._eval_step = tf.function(self._eval_batch, autograph=False)

    @staticmethod
    def _dispatch(cfg: TrainConfig, has_moe: bool) -> str:
        """dropless, capacity, or none (no MoE layers)."""
        if not has_moe:
            return "none"
        if cfg.moe_dispatch == "auto":
            return "capacity" if cfg.jit_compile else "dropless"
        if cfg.jit_compile and cfg.moe_dispatch == "dropless":
            raise ConfigError(
                "TrainConfig.jit_compile: a compiled step needs TrainConfig.moe_dispatch capacity (or auto): "
                "DeepSeekMoE's dropless dispatch has data-dependent shapes, which XLA cannot compile")
        return cfg.moe_dispatch

    def _moe_stats(self):
        """(load [E] per MoE layer, dropped token copies per layer [L]) of the micro-batch just run."""
        if not self.moe:
            return [], tf.zeros([0])
        return [m.step_stats[0] for m in self.moe], tf.stack([m.step_stats[1] for m in self.moe])

    def _micro_batch(self, x, y):
        """(mean token NLL, gradients of the objective share of this micro-batch, its MoE stats)."""
        share = self.strategy.num_replicas_in_sync * self.cfg.grad_accum_steps
        with tf.GradientTape() as tape:
            logits, mtp_logits = self.model.train_logits(x)
            loss = tf.reduce_mean(token_nll(logits, y))
            aux = tf.add_n(self.model.losses) if self.model.losses else 0.0
            if mtp_logits is not None:  # position i also predicts token i+2 = y[i+1]
                aux += self.model.config.mtp_loss_weight * tf.reduce_mean(token_nll(mtp_logits, y[:, 1:]))
            objective = (loss + aux) / share
            if self._scaled:
                objective = self.optimizer.get_scaled_loss(objective)
        stats = self._moe_stats()
        variables = self.model.trainable_variables
        grads = tape.gradient(objective, variables)
        grads = [tf.zeros_like(v) if g is None else g for g, v in zip(grads, variables, strict=True)]
        if self._scaled:
            grads = self.optimizer.get_unscaled_gradients(grads)
        return loss, grads, stats

    def _accumulated_gradients(self, x, y):
        """Mean loss, summed gradients and summed MoE stats over ``grad_accum_steps`` micro-batches of [B, T]."""
        steps = self.cfg.grad_accum_steps
        if steps == 1:
            return self._micro_batch(x, y)
        # [B, T] -> [A, B/A, T]; a while_loop runs them one after another, so only one
        # micro-batch's activations are alive at a time.
        xs = tf.reshape(x, [steps, -1, tf.shape(x)[1]])
        ys = tf.reshape(y, [steps, -1, tf.shape(y)[1]])
        zeros = [tf.zeros_like(v) for v in self.model.trainable_variables]
        stat_zeros = [tf.zeros([m.n_routed_experts]) for m in self.moe] + [tf.zeros([len(self.moe)])]
        n_vars = len(zeros)

        def body(i, loss_sum, *acc):
            loss, grads, (loads, dropped) = self._micro_batch(xs[i], ys[i])
            new = [tf.convert_to_tensor(g) for g in grads] + list(loads) + [dropped]
            return (i + 1, loss_sum + loss, *[a + b for a, b in zip(acc, new, strict=True)])

        _, loss_sum, *acc = tf.while_loop(lambda i, *_: i < steps, body,
                                          [tf.constant(0), tf.constant(0.0), *zeros, *stat_zeros])
        return loss_sum / steps, acc[:n_vars], (acc[n_vars:-1], acc[-1])

    def _replica_step(self, x, y):
        loss, grads, (loads, dropped) = self._gradients(x, y)
        grad_norm = tf.linalg.global_norm(grads) * self.strategy.num_replicas_in_sync
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))
        if not self.moe:
            return loss, grad_norm, dropped
        # The balancing bias moves once per optimizer step, on the load of the whole step:
        # every micro-batch (summed above) and every replica (summed here).
        loads, dropped = tf.distribute.get_replica_context().all_reduce(
            tf.distribute.ReduceOp.SUM, (list(loads), dropped))
        for moe, load in zip(self.moe, loads, strict=True):
            moe.update_balance(load)
        return loss, grad_norm, dropped / tf.stack([tf.reduce_sum(load) for load in loads])

    def _distributed_step(self, x, y):
        """(mean loss, gradient norm, fraction of token copies dropped for capacity per MoE layer [L])."""
        loss, norm, dropped = self.strategy.run(self._replica_step, args=(x, y))
        mean = tf.distribute.ReduceOp.MEAN
        return (self.strategy.reduce(mean, loss, axis=None), self.strategy.reduce(mean, norm, axis=None),
                self.strategy.experimental_local_results(dropped)[0])

    def step(self, x, y):
        """One optimizer step on a batch: (mean loss, gradient norm, dropped fraction per MoE layer [L])."""
        return self._train_step(x, y)

    def _eval_batch(self, x, y):
        return tf.reduce_mean(token_nll(self.model(x, training=False), y))

    def learning_rate(self) -> float:
        lr = self.optimizer.learning_rate
        return float(keras.backend.get_value(lr(self.optimizer.iterations) if callable(lr) else lr))

    def _check_finite(self, pending, checkpointer) -> tuple[float, float]:
        """The last (loss, grad norm) of ``pending``; raises FloatingPointError at the first bad step.

        Under mixed_float16 a non-finite gradient only makes the loss scale skip
        the step, so there only the loss is checked.
        """
        loss = norm = float("nan")
        for step, loss_t, norm_t, _ in pending:
            loss, norm = float(loss_t), float(norm_t)
            if not (math.isfinite(loss) and (self._scaled or math.isfinite(norm))):
                where = checkpointer.describe() if checkpointer else "checkpointing is off"
                cfg = self.cfg
                raise FloatingPointError(
                    f"training diverged at step {step}: loss {loss}, gradient norm {norm}; training "
                    f"stopped and {where}. Lower TrainConfig.learning_rate (now {cfg.learning_rate:g}; e.g. "
                    f"--set train.learning_rate={cfg.learning_rate / 3:.2g}) or raise TrainConfig.warmup_steps "
                    f"(now {cfg.warmup_steps}; e.g. --set train.warmup_steps={max(10, 2 * cfg.warmup_steps)}), "
                    "then run again")
        return loss, norm

    def train(self, dataset: tf.data.Dataset, steps: int, writer=None, start_step: int = 0,
              checkpointer: Checkpointer | None = None, evaluate=None) -> TrainResult:
        """Runs steps ``start_step + 1 .. steps`` of ``dataset`` (already positioned at ``start_step``).

        Logs every ``cfg.log_every`` steps, checkpoints every ``cfg.checkpoint_every``
        and at the end (only after checking that the loss is finite), calls
        ``evaluate(step)`` every ``cfg.eval_every``, and stops early after
        ``cfg.max_train_seconds``. Raises FloatingPointError on a NaN/Inf loss.
        """
        cfg = self.cfg
        iterator = iter(self.strategy.experimental_distribute_dataset(dataset))
        tokens_per_step = cfg.batch_size * self.model.config.context_len
        start = mark = time.perf_counter()
        first_done = None
        mark_step, loss, step, pending, out_of_time = start_step, float("nan"), start_step, [], False
        for step in range(start_step + 1, steps + 1):
            x, y = next(iterator)
            pending.append((step, *self._train_step(x, y)))
            now = time.perf_counter()
            if first_done is None:
                first_done = now
            out_of_time = bool(cfg.max_train_seconds) and now - start >= cfg.max_train_seconds
            last = step == steps or out_of_time
            save = last or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
            log_now = last or step % cfg.log_every == 0
            if not (save or log_now):
                continue
            loss, norm = self._check_finite(pending, checkpointer)
            dropped = pending[-1][3].numpy()  # per MoE layer, the last step's
            pending = []
            now = time.perf_counter()
            if log_now:
                rate = (step - mark_step) * tokens_per_step / max(now - mark, 1e-9)
                mfu = rate * self.flops_per_token / self.peak_flops if self.peak_flops else float("nan")
                eta = (steps - step) * (now - start) / max(step - start_step, 1)
                if cfg.max_train_seconds:  # a time limit ends the run first when it comes sooner
                    eta = max(min(eta, cfg.max_train_seconds - (now - start)), 0.0)
                lr = self.learning_rate()
                # Capacity dispatch: the share of token copies over capacity, averaged over the MoE layers.
                drops = f" dropped {100 * dropped.mean():.2f}%" if self.dispatch == "capacity" else ""
                log.info("step %d/%d loss %.4f grad_norm %.3f lr %.2e tokens/s %.0f MFU %.1f%%%s ETA %.0fs",
                         step, steps, loss, norm, lr, rate, 100 * mfu, drops, eta)
                if writer is not None:
                    with writer.as_default(step=step):
                        tf.summary.scalar("train/loss", loss)
                        tf.summary.scalar("train/grad_norm", norm)
                        tf.summary.scalar("train/learning_rate", lr)
                        tf.summary.scalar("train/tokens_per_second", rate)
                        if self.peak_flops:
                            tf.summary.scalar("train/mfu", mfu)
                        for i, moe in enumerate(self.model.moe_layers()):
                            load = moe.expert_load.numpy()
                            tf.summary.scalar(f"moe/load_max_over_mean/{i}", load.max() / max(load.mean(), 1e-9))
                            if self.dispatch == "capacity":
                                tf.summary.scalar(f"moe/dropped_fraction/{i}", dropped[i])
                mark, mark_step = time.perf_counter(), step
            if save and checkpointer is not None:
                checkpointer.save(step)
            if evaluate is not None and cfg.eval_every and step % cfg.eval_every == 0 and not last:
                evaluate(step)
            if out_of_time:
                log.info("Stopped at step %d/%d: max_train_seconds (%.0f s) reached", step, steps,
                         cfg.max_train_seconds)
                break
        end = time.perf_counter()
        done = step - start_step
        return TrainResult(start_step=start_step, steps=step, seconds=end - start,
                           steady_seconds=(end - first_done) if first_done and done > 1 else 0.0,
                           tokens=done * tokens_per_step, steady_tokens=max(done - 1, 0) * tokens_per_step,
                           last_loss=loss, stopped_by_time=out_of_time and step < steps)

    def evaluate(self, dataset: tf.data.Dataset) -> float:
        """Mean token NLL over the batches of ``dataset`` (nan when it is empty).

        Not distributed: every worker scores the same few batches with its (identical)
        weights, so no collective depends on how many eval batches a shard would get.
        """
        losses = [float(self._eval_step(x, y)) for x, y in dataset]
        return sum(losses) / len(losses) if losses else float("nan")
