"""The Trainer's ``run_fn``: builds the model, trains it on packed blocks, exports it.

Config comes only from ``fn_args``: ``custom_config['model']``,
``custom_config['train']`` and ``custom_config['serving']`` (dicts of ModelConfig /
TrainConfig / ServingConfig, the last one the export's request limits), the train steps
from TrainArgs, and the vocabulary size from the tokenizer. The model run
directory receives TensorBoard logs (train/, eval/, hparams/) and
``training_summary.json``.

Preemption: checkpoints go to a directory keyed by the inputs (``checkpoint_dir``),
so a Trainer killed and executed again with the same inputs resumes from its
last checkpoint, and the input pipeline skips the batches already trained on
(it is deterministic for a seed). Warm start: given a base model (the latest
blessed one) with the same tokenizer and architecture, training starts from its
weights. Under MultiWorkerMirroredStrategy only the chief exports the model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from typing import Any

import tensorflow as tf
import tensorflow_transform as tft
import tf_keras as keras

from deepseek_tfx.trainer_module import autotune, data, export
from deepseek_tfx.trainer_module.config import (
    SUMMARY_FILE,
    ConfigError,
    ModelConfig,
    ServingConfig,
    TrainConfig,
    apply_hyperparameters,
    tuned_values,
)
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.flops import compute_dtype, measure_matmul_peak, training_flops_per_token
from deepseek_tfx.trainer_module.train_loop import Checkpointer, TrainLoop, make_optimizer
from deepseek_tfx.trainer_module.tokenizer import TOKENIZER_DIR_KEY, load_tokenizer

log = logging.getLogger(__name__)


def _tf_config() -> dict:
    """TF_CONFIG, tf.distribute's own contract (Vertex AI and Kubeflow set it); {} when unset."""
    return json.loads(os.environ.get("TF_CONFIG", "{}"))


def is_multi_worker() -> bool:
    """Whether TF_CONFIG names a cluster of several tasks (this process is one of several workers)."""
    return sum(len(v) for v in _tf_config().get("cluster", {}).values()) > 1


def tpu_cluster_resolver():
    """The TPUClusterResolver of an attached TPU, or None.

    A TPU VM (the machine has TPU devices) resolves as ``local``; a TPU node is named by TPU_NAME
    (like TF_CONFIG, tf.distribute's own contract).
    """
    name = os.environ.get("TPU_NAME") or ("local" if tf.config.list_physical_devices("TPU") else None)
    if name is None:
        return None
    return tf.distribute.cluster_resolver.TPUClusterResolver(tpu=name)


def get_strategy() -> tf.distribute.Strategy:
    """The distribution strategy for this process.

    * TPUStrategy when a TPU is attached (tpu_cluster_resolver).
    * MultiWorkerMirroredStrategy when TF_CONFIG names a cluster of several tasks
      (TF_CONFIG is tf.distribute's own contract; Vertex AI and Kubeflow set it).
    * MirroredStrategy when there are several local GPUs.
    * Otherwise the default (single-device) strategy: MirroredStrategy over one
      CPU device is much slower (BENCHMARKS.md, "Training start-up").
    """
    resolver = tpu_cluster_resolver()
    if resolver is not None:
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if is_multi_worker():
        return tf.distribute.MultiWorkerMirroredStrategy()
    if len(tf.config.list_logical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


def task_info() -> tuple[bool, int]:
    """(is this process the chief, its worker index) from TF_CONFIG (no cluster: the chief)."""
    tf_config = _tf_config()
    task, cluster = tf_config.get("task", {}), tf_config.get("cluster", {})
    kind, index = task.get("type", "chief"), int(task.get("index", 0))
    is_chief = kind == "chief" or (kind == "worker" and index == 0 and "chief" not in cluster)
    return is_chief, index


def _checkpoint_root(fn_args, custom: dict) -> str:
    return custom.get("checkpoint_root") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.normpath(fn_args.model_run_dir))), "checkpoints")


def checkpoint_dir(fn_args, custom: dict) -> str:
    """Where this Trainer run checkpoints; a re-execution with the same inputs finds the same place.

    ``custom_config['checkpoint_root']`` if set (e.g. a bucket on Vertex AI), else
    ``<pipeline_root>/<Trainer node>/checkpoints`` (the model run directory is
    ``<pipeline_root>/<node>/model_run/<execution id>``). Under it, one directory per
    key: a digest of the input artifacts' URIs, the base model, the step count and
    the model and training configs. A new execution with the same inputs (after a
    crash or preemption) has the same key and resumes; changed inputs start fresh.
    """
    root = _checkpoint_root(fn_args, custom)
    key = json.dumps({
        "train_files": sorted(fn_args.train_files), "transform_output": fn_args.transform_output,
        "base_model": fn_args.base_model, "train_steps": fn_args.train_steps,
        "hyperparameters": tuned_values(getattr(fn_args, "hyperparameters", None)),
        "config": {k: v for k, v in custom.items() if k != "checkpoint_root"},
    }, sort_keys=True)
    return os.path.join(root, hashlib.sha256(key.encode()).hexdigest()[:16])


def warm_start(model: DeepSeekLM, base_model_dir: str, tokenizer) -> str:
    """Loads the base model's weights into ``model`` when compatible; returns what was done."""
    base = export.read_export_config(base_model_dir)
    if base is None:
        return f"not warm-started: {base_model_dir} has no assets.extra/{export.CONFIG_FILE}"
    if base.get("tokenizer_fingerprint") != tokenizer.fingerprint:
        return "not warm-started: the base model was trained with a different tokenizer"
    if ModelConfig.from_dict(base["model"]).replace(context_len=model.config.context_len) != model.config:
        return "not warm-started: the base model has a different architecture"
    values = [v.numpy() for v in tf.saved_model.load(base_model_dir).model_variables]
    model.set_weights(values)
    return f"warm-started from {base_model_dir}"


def weights_digest(model) -> str:
    """SHA-256 of every weight's bytes, in order: equal digests mean identical weights."""
    digest = hashlib.sha256()
    for w in model.get_weights():
        digest.update(w.tobytes())
    return digest.hexdigest()


def _write_hparams(directory: str, model_cfg: ModelConfig, train_cfg: TrainConfig, preset: str,
                   decision: autotune.Decision, tuned: dict | None = None) -> None:
    from tensorboard.plugins.hparams import api as hp  # noqa: PLC0415

    flat = {"preset": preset, **{f"model/{k}": v for k, v in model_cfg.to_dict().items()},
            **{f"train/{k}": v for k, v in train_cfg.to_dict().items()}, "autotune/reason": decision.reason,
            **{f"tuned/{k}": v for k, v in (tuned or {}).items()}}
    with tf.summary.create_file_writer(directory).as_default():
        hp.hparams({k: v for k, v in flat.items() if isinstance(v, (bool, int, float, str))})


@dataclasses.dataclass
class _Run:
    """What run_fn's steps share: the configs, the tokenizer and where this process writes."""

    fn_args: Any
    custom: dict
    train_cfg: TrainConfig
    model_cfg: ModelConfig
    tokenizer: Any
    is_chief: bool
    worker: int
    multi_worker: bool
    tuned: dict | None = None
    """The Tuner's best values this run trains with (None: no Tuner)."""
    decision: autotune.Decision | None = None
    """How precision and jit_compile were chosen (train_cfg holds the chosen values once it is set)."""

    @property
    def run_dir(self) -> str:
        """The model run directory (each non-chief worker writes under its own subdirectory)."""
        run_dir = self.fn_args.model_run_dir
        return run_dir if self.is_chief else os.path.join(run_dir, f"worker-{self.worker}")


def run_fn(fn_args) -> None:
    """TFX Trainer entry point: configs, strategy, model, restore or warm start, data, train, export."""
    run = _configure(fn_args)
    strategy = get_strategy()
    _decide_precision(run, strategy)
    peak = measure_matmul_peak(compute_dtype(run.train_cfg.precision))
    model, optimizer, loop = _build(run, strategy, peak)
    checkpointer, start_step, warm = _restore_or_warm_start(run, model, optimizer)
    train_ds, eval_ds = _datasets(run, start_step)
    result, eval_loss = _train(run, loop, train_ds, eval_ds, checkpointer, start_step)
    _write_summary(run, model, loop, strategy, checkpointer, result, eval_loss, warm, peak)
    if run.is_chief:  # only the chief exports; the workers' weights are the same (see the MWMS test)
        _export(run, model)


def _configure(fn_args) -> _Run:
    """The model and training configs from custom_config, TrainArgs, EvalArgs and the tokenizer."""
    custom = fn_args.custom_config or {}
    train_cfg = TrainConfig.from_dict(custom.get("train", {}))
    # TFX's TrainArgs / EvalArgs win over the config; EvalArgs.num_steps 0 (None in fn_args) keeps the config's.
    train_cfg = train_cfg.replace(train_steps=fn_args.train_steps,
                                  eval_batches=fn_args.eval_steps or train_cfg.eval_batches)
    multi_worker = is_multi_worker()
    if multi_worker and train_cfg.max_train_seconds:
        raise ConfigError(
            f"TrainConfig.max_train_seconds: must be 0 with several workers (got {train_cfg.max_train_seconds}): "
            "each worker would read its own clock and stop at its own step, leaving the others waiting in the "
            "next all-reduce; bound a multi-worker run with train_steps")
    tokenizer = load_tokenizer(custom.get(TOKENIZER_DIR_KEY))
    model_cfg = ModelConfig.from_dict(custom.get("model", {})).replace(vocab_size=tokenizer.vocab_size)
    tuned = tuned_values(getattr(fn_args, "hyperparameters", None))
    if tuned:  # the Tuner's best trial (its best_hyperparameters artifact)
        model_cfg, train_cfg = apply_hyperparameters(model_cfg, train_cfg, tuned)
        log.info("Training with the Tuner's best hyperparameters: %s", tuned)
    is_chief, worker = task_info()
    return _Run(fn_args, custom, train_cfg, model_cfg, tokenizer, is_chief, worker, multi_worker, tuned)


def _decide_precision(run: _Run, strategy) -> None:
    """Decides ``auto`` precision and jit_compile (trainer_module.autotune), then seeds and sets the policy.

    The CPU probe's result is kept under the checkpoint root (``autotune/``), keyed by the machine and shape.
    """
    decision = autotune.decide(run.train_cfg, run.model_cfg, multi_worker=run.multi_worker,
                               replicas=strategy.num_replicas_in_sync,
                               cache_dir=os.path.join(_checkpoint_root(run.fn_args, run.custom), "autotune"))
    run.decision, run.train_cfg = decision, autotune.apply(run.train_cfg, decision)
    # An explicit setting is already on the "Model:" line; a decided one says why.
    log.log(logging.DEBUG if decision.reason == autotune.SET_IN_CONFIG else logging.INFO,
            "Precision %s, XLA %s: %s%s", decision.precision, "on" if decision.jit_compile else "off",
            decision.reason, f" (probe {decision.probe_seconds:.1f} s)" if decision.probe_seconds else "")
    keras.utils.set_random_seed(run.train_cfg.seed)  # after the probe, which draws random numbers
    keras.mixed_precision.set_global_policy(run.train_cfg.precision)


def _build(run: _Run, strategy, peak: float):
    """The model, its optimizer (slots built) and the train loop, under the strategy's scope."""
    with strategy.scope():
        model = DeepSeekLM(run.model_cfg, recompute_attention=run.train_cfg.recompute_attention)
        model(tf.zeros([1, 8], tf.int64))  # create the weights
        optimizer = make_optimizer(model, run.train_cfg)
        # Slots exist before a restore, so the checkpoint restores them too.
        (getattr(optimizer, "inner_optimizer", optimizer)).build(model.trainable_variables)
        loop = TrainLoop(model, optimizer, strategy, run.train_cfg, training_flops_per_token(run.model_cfg), peak)
    log.info("Model: %d parameters, %d replica(s), precision %s, XLA %s, MoE dispatch %s; matmul peak %.1f GFLOP/s",
             model.count_params(), strategy.num_replicas_in_sync, run.train_cfg.precision,
             "on" if run.train_cfg.jit_compile else "off", loop.dispatch, peak / 1e9)
    return model, optimizer, loop


def _restore_or_warm_start(run: _Run, model, optimizer) -> tuple[Checkpointer, int, str]:
    """Resumes from this run's last checkpoint, else warm-starts from the base model; (checkpointer, step, what)."""
    checkpointer = Checkpointer(model, optimizer, checkpoint_dir(run.fn_args, run.custom),
                                run.train_cfg.keep_checkpoints, run.is_chief, run.worker)
    start_step = checkpointer.restore()
    warm = "resumed from a checkpoint" if start_step else "no base model"
    if start_step:
        log.info("Resuming from step %d (%s)", start_step, checkpointer.directory)
    elif run.fn_args.base_model:
        warm = warm_start(model, run.fn_args.base_model, run.tokenizer)
        log.info("Base model: %s", warm)
    return checkpointer, start_step, warm


def _datasets(run: _Run, start_step: int):
    """Packed train blocks (skipping the batches already trained on) and a function making the eval blocks."""
    t, cfg = run.model_cfg.context_len, run.train_cfg
    train_ds = data.packed_blocks(run.fn_args.train_files, t, cfg.batch_size, seed=cfg.seed,
                                  shuffle_buffer=cfg.shuffle_buffer).skip(start_step)

    def eval_ds():
        return data.packed_blocks(run.fn_args.eval_files, t, cfg.batch_size, seed=cfg.seed,
                                  shuffle=False, repeat=False).take(cfg.eval_batches)

    return train_ds, eval_ds


def _train(run: _Run, loop: TrainLoop, train_ds, eval_ds, checkpointer, start_step: int):
    """Trains with TensorBoard logs (train/, eval/, hparams/); returns (result, final sampled eval loss)."""
    eval_writer = tf.summary.create_file_writer(os.path.join(run.run_dir, "eval"))

    def evaluate(step: int) -> float:
        loss = loop.evaluate(eval_ds())
        with eval_writer.as_default(step=step):
            tf.summary.scalar("eval/loss", loss)
        log.info("step %d eval loss %.4f", step, loss)
        return loss

    _write_hparams(os.path.join(run.run_dir, "hparams"), run.model_cfg, run.train_cfg, run.custom.get("preset", ""),
                   run.decision, run.tuned)
    writer = tf.summary.create_file_writer(os.path.join(run.run_dir, "train"))
    evaluates = bool(run.train_cfg.eval_batches)
    result = loop.train(train_ds, run.train_cfg.train_steps, writer, start_step=start_step,
                        checkpointer=checkpointer, evaluate=evaluate if evaluates else None)
    eval_loss = evaluate(result.steps) if evaluates else float("nan")
    return result, eval_loss


def _write_summary(run: _Run, model, loop, strategy, checkpointer, result, eval_loss: float, warm: str,
                   peak: float) -> None:
    """``training_summary.json`` in the run directory: what the run report and the CLI summary read."""
    summary = {
        "train_steps": result.steps, "resumed_from_step": result.start_step, "base_model": warm,
        "stopped_by_time": result.stopped_by_time, "train_tokens": result.tokens,
        "train_seconds": result.seconds, "tokens_per_second": result.tokens_per_second,
        "mfu": result.tokens_per_second * loop.flops_per_token / peak if peak else None,
        "matmul_peak_flops": peak, "flops_per_token": loop.flops_per_token,
        "final_train_loss": result.last_loss, "eval_loss_sampled": eval_loss,
        "parameters": model.count_params(),
        # Hashing every weight costs a pass over the model: only where workers must agree.
        "weights_sha256": weights_digest(model) if run.multi_worker else None,
        "checkpoint_dir": checkpointer.directory, "replicas": strategy.num_replicas_in_sync,
        "model": run.model_cfg.to_dict(), "train": run.train_cfg.to_dict(),
        "autotune": run.decision.to_dict(), "moe_dispatch": loop.dispatch, "tuned_hyperparameters": run.tuned,
    }
    log.info("Trained steps %d-%d in %.1fs (%.0f tokens/s after the first step); last loss %.4f, "
             "sampled eval loss %.4f", result.start_step + 1, result.steps, result.seconds,
             result.tokens_per_second, result.last_loss, eval_loss)
    tf.io.gfile.makedirs(run.run_dir)
    with tf.io.gfile.GFile(os.path.join(run.run_dir, SUMMARY_FILE), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)


def _export(run: _Run, model) -> None:
    """Exports in float32, so serving does not depend on the training precision."""
    keras.mixed_precision.set_global_policy("float32")
    serving_model = DeepSeekLM(run.model_cfg)
    serving_model(tf.zeros([1, 8], tf.int64))
    serving_model.set_weights(model.get_weights())
    export.export_serving_model(serving_model, tft.TFTransformOutput(run.fn_args.transform_output), run.tokenizer,
                                run.fn_args.serving_model_dir, extra_config={"train": run.train_cfg.to_dict()},
                                limits=ServingConfig.from_dict(run.custom.get("serving", {})))
