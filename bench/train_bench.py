"""Training speed and MFU of the Trainer's loop, against the matmul peak measured in the same run.

    python -m bench.train_bench [--seconds 20] [--only nanogpt|small]

Shapes:
  (a) ``nanogpt``: the dense GPT switch at nanoGPT's CPU shape: 4 layers, 4 heads,
      width 128, context 64, batch 12, vocabulary 65 (SwiGLU hidden 344, the
      parameter count of nanoGPT's 4x GELU MLP).
  (b) ``small``: the DeepSeek ``small`` preset (MLA + DeepSeekMoE), vocabulary 2,048
      (the pipeline's default tokenizer size), its batch 16 x context 128.
Each in float32 and mixed_bfloat16, with and without XLA (``jit_compile``).

Runs the real ``TrainLoop`` (the Trainer's step, logging and all) on random
tokens from memory for ``--seconds`` after the first step, and prints steady
tokens/s (first step, i.e. tracing, excluded) and MFU = tokens/s x model FLOPs
per token / measured peak FLOP/s of a 1024^2 matmul in the same dtype.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time


import deepseek_tfx.trainer_module  # noqa: F401  (first: sets TF_USE_LEGACY_KERAS)
import numpy as np
import tensorflow as tf
import tf_keras as keras

from deepseek_tfx.trainer_module.config import ConfigError, ModelConfig, TrainConfig, get_preset
from deepseek_tfx.trainer_module.flops import compute_dtype, measure_matmul_peak, training_flops_per_token
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.train_loop import TrainLoop, make_optimizer

SHAPES = {
    "nanogpt": (ModelConfig(vocab_size=65, d_model=128, n_layers=4, n_heads=4, context_len=64, dense=True,
                            inter_dim=344, n_dense_layers=0), 12),
    "small": (get_preset("small").model.replace(vocab_size=2048), get_preset("small").train.batch_size),
}


def random_batches(config: ModelConfig, batch: int, seed: int = 0) -> tf.data.Dataset:
    rng = np.random.default_rng(seed)
    low = 4 if config.vocab_size > 4 else 0
    tokens = rng.integers(low, config.vocab_size, size=(256 * batch, config.context_len + 1))
    ds = tf.data.Dataset.from_tensor_slices((tokens[:, :-1], tokens[:, 1:]))
    return ds.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def measure(config: ModelConfig, batch: int, precision: str, xla: bool, seconds: float) -> dict:
    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(0)
    cfg = TrainConfig(train_steps=1_000_000, batch_size=batch, precision=precision, jit_compile=xla,
                      log_every=1_000_000, checkpoint_every=0, eval_batches=0, max_train_seconds=seconds)
    model = DeepSeekLM(config)
    model(tf.zeros([1, 8], tf.int64))
    try:
        loop = TrainLoop(model, make_optimizer(model, cfg), tf.distribute.get_strategy(), cfg)
    except ConfigError as e:  # a combination the Trainer refuses: say why and go on
        return {"error": str(e).split(":")[0]}
    start = time.perf_counter()
    loop.train(random_batches(config, batch), 1)  # the first step: tracing (and XLA compiling)
    first = time.perf_counter() - start
    result = loop.train(random_batches(config, batch, seed=1), 1_000_000, start_step=1)
    keras.mixed_precision.set_global_policy("float32")
    return {"first_step_s": first, "tokens_per_second": result.tokens / result.seconds, "steps": result.steps - 1,
            "flops_per_token": training_flops_per_token(config)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="timed training per combination")
    parser.add_argument("--only", choices=sorted(SHAPES))
    args = parser.parse_args()
    logging.getLogger("deepseek_tfx").setLevel(logging.WARNING)

    peaks = {p: measure_matmul_peak(compute_dtype(p), seconds=2.0) for p in ("float32", "mixed_bfloat16")}
    print(f"matmul peak (1024^2, this machine, this run): float32 {peaks['float32'] / 1e9:.1f} GFLOP/s, "
          f"bfloat16 {peaks['mixed_bfloat16'] / 1e9:.1f} GFLOP/s; {os.cpu_count()} CPU threads")
    print(f"{'shape':<8} {'precision':<15} {'XLA':<4} {'first step s':>12} {'tokens/s':>9} {'MFU':>6}")
    for name, (config, batch) in SHAPES.items():
        if args.only and name != args.only:
            continue
        for precision in ("float32", "mixed_bfloat16"):
            for xla in (False, True):
                r = measure(config, batch, precision, xla, args.seconds)
                if "error" in r:
                    print(f"{name:<8} {precision:<15} {'yes' if xla else 'no':<4} not supported: {r['error']}")
                    continue
                mfu = r["tokens_per_second"] * r["flops_per_token"] / peaks[precision]
                print(f"{name:<8} {precision:<15} {'yes' if xla else 'no':<4} {r['first_step_s']:>12.1f} "
                      f"{r['tokens_per_second']:>9.0f} {100 * mfu:>5.1f}%", flush=True)
        print(f"{name}: {training_flops_per_token(config) / 1e6:.2f} MFLOP per trained token, batch {batch} x "
              f"context {config.context_len}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
