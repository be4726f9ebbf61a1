"""What the eval-loss curve costs: the ``small`` preset trained with its default ``eval_every``.

Trains the Trainer's own ``TrainLoop`` for the preset's steps on random token blocks, scoring the preset's
``eval_batches`` every ``eval_every`` steps (the Trainer's default since the curve got points through training),
and prints the seconds spent in those evaluations against the whole training time.

    python -m bench.eval_every_bench
"""

from __future__ import annotations

import sys
import time

import numpy as np

import deepseek_tfx  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)
import tensorflow as tf
import tf_keras as keras

from deepseek_tfx.trainer_module.config import get_preset
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.train_loop import TrainLoop, make_optimizer

VOCAB = 2048


def blocks(rng, n, context, batch):
    ids = rng.integers(4, VOCAB, size=(n, context + 1))
    return tf.data.Dataset.from_tensor_slices((ids[:, :-1], ids[:, 1:])).repeat().batch(batch, drop_remainder=True)


def main() -> int:
    preset = get_preset("small")
    config, cfg = preset.model.replace(vocab_size=VOCAB), preset.train.replace(checkpoint_every=0)
    rng = np.random.default_rng(cfg.seed)
    keras.utils.set_random_seed(cfg.seed)
    model = DeepSeekLM(config)
    model(tf.zeros([1, 8], tf.int64))
    loop = TrainLoop(model, make_optimizer(model, cfg), tf.distribute.get_strategy(), cfg)
    eval_data = blocks(rng, cfg.batch_size * cfg.eval_batches, config.context_len, cfg.batch_size)
    spent = []

    def evaluate(step: int) -> float:
        start = time.perf_counter()
        loss = loop.evaluate(eval_data.take(cfg.eval_batches))
        spent.append(time.perf_counter() - start)
        return loss

    start = time.perf_counter()
    result = loop.train(blocks(rng, 4096, config.context_len, cfg.batch_size), cfg.train_steps, evaluate=evaluate)
    total = time.perf_counter() - start
    print(f"small preset: {result.steps} steps in {total:.1f} s; eval_every {cfg.eval_every}: {len(spent)} evaluations "
          f"of {cfg.eval_batches} batches took {sum(spent):.1f} s ({100 * sum(spent) / total:.1f}% of the training; "
          f"first {spent[0]:.2f} s with tracing, then {np.mean(spent[1:]):.2f} s each)" if spent else "no evaluation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
