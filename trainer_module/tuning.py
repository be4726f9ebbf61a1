"""The Tuner's ``tuner_fn``: a KerasTuner search whose trials run the Trainer's own training loop.

TFX's Tuner component calls ``tuner_fn(fn_args)`` and then ``tuner.search(**fit_kwargs)``; it writes the best
trial's hyperparameters as its ``best_hyperparameters`` artifact, which the Trainer takes as an input and
applies (trainer.run_fn: ``fn_args.hyperparameters``). Here the tuner is a ``kt.Tuner`` subclass whose
``run_trial`` builds the model with the trial's values, trains it with ``TrainLoop`` (not ``model.fit``) for
``TuneConfig.steps_per_trial`` steps (Hyperband: in proportion to the epochs it grants the trial) and returns
the objective: bits per byte on the eval split's first ``eval_batches`` blocks (eval loss in nats per token x
tokens per byte of the eval documents / ln 2; lower is better). The oracle is KerasTuner's random search,
Bayesian optimisation or Hyperband (``TuneConfig.algorithm``); the search space is ``TuneConfig``'s.

``custom_config``: ``model``, ``train`` (the preset's configs), ``tune`` (TuneConfig) and the tokenizer's
directory (TokenizingTuner puts it there, as for the Trainer).
"""

from __future__ import annotations

import logging
import math
import os

import keras_tuner as kt
import tensorflow as tf
import tf_keras as keras
from tfx.components.tuner.component import TunerFnResult

from deepseek_tfx.trainer_module import data
from deepseek_tfx.trainer_module.config import (
    ModelConfig,
    TrainConfig,
    TuneConfig,
    apply_hyperparameters,
)
from deepseek_tfx.trainer_module.flops import measure_matmul_peak, training_flops_per_token
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.tokenizer import TOKENIZER_DIR_KEY, load_tokenizer
from deepseek_tfx.trainer_module.train_loop import TrainLoop, make_optimizer

log = logging.getLogger(__name__)

OBJECTIVE = "bits_per_byte"


def search_space(tune: TuneConfig) -> kt.HyperParameters:
    """The KerasTuner HyperParameters of TuneConfig's searched fields."""
    hp = kt.HyperParameters()
    for field, values in tune.search_space().items():
        if field == "learning_rate":
            hp.Float(field, values[0], values[1], sampling="log")
        else:
            hp.Choice(field, values)
    return hp


def tokens_per_byte(patterns, limit: int = 2000) -> float:
    """Tokens (with the EOS packing adds after each document) per byte of the first ``limit`` transformed
    documents in ``patterns``: turns the eval loss per token into bits per byte."""
    spec = {data.TOKEN_IDS: tf.io.VarLenFeature(tf.int64), "num_bytes": tf.io.FixedLenFeature([], tf.int64)}
    files = sorted({f for p in patterns for f in tf.io.gfile.glob(p)})
    ds = tf.data.TFRecordDataset(files, compression_type="GZIP").take(limit).batch(256)
    tokens = nbytes = 0
    for batch in ds.map(lambda x: tf.io.parse_example(x, spec)):
        tokens += int(tf.size(batch[data.TOKEN_IDS].values)) + int(tf.shape(batch["num_bytes"])[0])
        nbytes += int(tf.reduce_sum(batch["num_bytes"]))
    return tokens / max(nbytes, 1)


class LoopTuner(kt.Tuner):
    """A KerasTuner tuner whose trials run ``TrainLoop`` and report eval bits per byte."""

    def __init__(self, oracle, model_cfg: ModelConfig, train_cfg: TrainConfig, tune: TuneConfig,
                 peak_flops: float = 0.0, **kwargs):
        super().__init__(oracle=oracle, **kwargs)
        self.model_cfg, self.train_cfg, self.tune, self.peak_flops = model_cfg, train_cfg, tune, peak_flops

    def run_trial(self, trial, train_files, eval_files, eval_tokens_per_byte):
        values = trial.hyperparameters.values
        steps = self.tune.steps_per_trial
        if "tuner/epochs" in values:  # Hyperband grants epochs; a trial trains in proportion to them
            steps = max(1, round(steps * values["tuner/epochs"] / self.oracle.max_epochs))
        model_cfg, train_cfg = apply_hyperparameters(self.model_cfg, self.train_cfg, values)
        train_cfg = train_cfg.replace(train_steps=steps, warmup_steps=min(train_cfg.warmup_steps, steps - 1),
                                      checkpoint_every=0, eval_every=0, log_every=max(steps, 1),
                                      precision="float32", jit_compile=False)
        keras.backend.clear_session()
        keras.utils.set_random_seed(train_cfg.seed)
        model = DeepSeekLM(model_cfg)
        model(tf.zeros([1, 8], tf.int64))
        loop = TrainLoop(model, make_optimizer(model, train_cfg), tf.distribute.get_strategy(), train_cfg,
                         training_flops_per_token(model_cfg), self.peak_flops)
        t, batch = model_cfg.context_len, train_cfg.batch_size
        loop.train(data.packed_blocks(train_files, t, batch, seed=train_cfg.seed,
                                      shuffle_buffer=train_cfg.shuffle_buffer), steps)
        nll = loop.evaluate(data.packed_blocks(eval_files, t, batch, seed=train_cfg.seed, shuffle=False,
                                               repeat=False).take(max(train_cfg.eval_batches, 1)))
        bpb = nll * eval_tokens_per_byte / math.log(2)
        log.info("Trial %s: %s -> %d steps, eval %.4f bits per byte", trial.trial_id,
                 {k: v for k, v in values.items() if not k.startswith("tuner/")}, steps, bpb)
        return {OBJECTIVE: bpb if math.isfinite(bpb) else 1e9}


def build_tuner(model_cfg: ModelConfig, train_cfg: TrainConfig, tune: TuneConfig, directory: str,
                project_name: str = "deepseek_tfx") -> LoopTuner:
    """The LoopTuner with the oracle ``tune.algorithm`` names, minimising eval bits per byte."""
    objective = kt.Objective(OBJECTIVE, direction="min")
    hp = search_space(tune)
    seed = train_cfg.seed
    if tune.algorithm == "bayesian":
        oracle = kt.oracles.BayesianOptimizationOracle(objective=objective, max_trials=tune.trials,
                                                       hyperparameters=hp, seed=seed)
    elif tune.algorithm == "hyperband":
        oracle = kt.oracles.HyperbandOracle(objective=objective, max_epochs=3, factor=3, hyperband_iterations=1,
                                            hyperparameters=hp, seed=seed)
        oracle.max_trials = tune.trials  # a cap on top of Hyperband's own schedule
    else:
        oracle = kt.oracles.RandomSearchOracle(objective=objective, max_trials=tune.trials, hyperparameters=hp,
                                               seed=seed)
    return LoopTuner(oracle, model_cfg, train_cfg, tune, measure_matmul_peak("float32"), directory=directory,
                     project_name=project_name, overwrite=True)


def tuner_fn(fn_args) -> TunerFnResult:
    """TFX Tuner entry point (TokenizingTuner passes the tokenizer's directory in custom_config)."""
    custom = fn_args.custom_config or {}
    tokenizer = load_tokenizer(custom.get(TOKENIZER_DIR_KEY))
    model_cfg = ModelConfig.from_dict(custom.get("model", {})).replace(vocab_size=tokenizer.vocab_size)
    train_cfg = TrainConfig.from_dict(custom.get("train", {}))
    if fn_args.eval_steps:
        train_cfg = train_cfg.replace(eval_batches=fn_args.eval_steps)
    tune = TuneConfig.from_dict(custom.get("tune", {}))
    tuner = build_tuner(model_cfg, train_cfg, tune, os.path.join(fn_args.working_dir, "tuner"))
    return TunerFnResult(tuner=tuner, fit_kwargs={
        "train_files": fn_args.train_files, "eval_files": fn_args.eval_files,
        "eval_tokens_per_byte": tokens_per_byte(fn_args.eval_files)})
