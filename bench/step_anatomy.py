"""Where the time of one shape-(a) training step goes: the matmul-only bound and an attention ablation.

    python -m bench.step_anatomy [--seconds 12]

Prints, for the dense GPT switch at nanoGPT's CPU shape (bench/train_bench.py's
``nanogpt``, float32):
  * the matmul-only bound: every matmul of one training step (forward, input
    gradient and weight gradient of each of the 21 weight matrices, and the
    attention's batched products), and nothing else, in one graph; with TF
    kernels and with XLA. Tokens/s at this time per step is what a step of
    free elementwise work would reach.
  * the real TrainLoop's tokens/s, and the same with the attention core
    (scores, softmax, weighted sum) replaced by passing the values through, in
    TF and in XLA (``jit_compile``): the cost of attention in each.
"""

from __future__ import annotations

import argparse
import sys
import time


import deepseek_tfx.trainer_module  # noqa: F401  (first: sets TF_USE_LEGACY_KERAS)
import tensorflow as tf
import tf_keras as keras

from bench.train_bench import SHAPES, random_batches
from deepseek_tfx.trainer_module import layers
from deepseek_tfx.trainer_module.config import TrainConfig
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.train_loop import TrainLoop, make_optimizer


def matmul_bound(config, batch: int, xla: bool, repeats: int = 40) -> tuple[float, float]:
    """(seconds per step, GFLOP/s) of only the matmuls of one training step of ``config``."""
    n, d, f, h, t = batch * config.context_len, config.d_model, config.inter_dim, config.n_heads, config.context_len
    per_layer = [(d, 3 * d), (d, d), (d, f), (d, f), (f, d)]
    shapes = per_layer * config.n_layers + [(d, config.vocab_size)]
    weights = [tf.random.normal(s) for s in shapes]
    # Each product gets operands of its own (as in a real step): identical products would be merged by
    # grappler's common-subexpression elimination and counted without being computed.
    acts = [tf.random.normal([n, a]) for a, _ in shapes]
    grads = [tf.random.normal([n, b]) for _, b in shapes]
    # per layer: q, k, v and the output's gradient do [B*H, T, d_h]; probabilities p and their gradient dp [B*H, T, T]
    attn = [[tf.random.normal([batch * h, t, t if i >= 4 else d // h]) for i in range(6)]
            for _ in range(config.n_layers)]

    # Every operand is an argument: captured eager tensors would be graph constants, which grappler folds.
    @tf.function(jit_compile=xla)
    def step(weights, acts, grads, attn):
        out = []
        for w, x, g in zip(weights, acts, grads, strict=True):
            out += [tf.matmul(x, w), tf.matmul(g, w, transpose_b=True), tf.matmul(x, g, transpose_a=True)]
        for q, k, v, do, p, dp in attn:
            # forward: scores q k^T and output p v; backward: dv = p^T do, dp = do v^T, dq = dp k, dk = dp^T q
            out += [tf.matmul(q, k, transpose_b=True), tf.matmul(p, v), tf.matmul(p, do, transpose_a=True),
                    tf.matmul(do, v, transpose_b=True), tf.matmul(dp, k), tf.matmul(dp, q, transpose_a=True)]
        return tf.add_n([tf.reduce_sum(o[:1, :1]) for o in out])  # keeps every product alive

    float(step(weights, acts, grads, attn))
    start = time.perf_counter()
    for _ in range(repeats):
        result = step(weights, acts, grads, attn)
    float(result)
    seconds = (time.perf_counter() - start) / repeats
    flops = sum(6 * n * a * b for a, b in shapes) + config.n_layers * 6 * 2 * batch * h * t * t * (d // h)
    return seconds, flops / seconds / 1e9


def _values_only(self, q, k, v, bias):
    """Ablation: the attention core removed, values passed straight to the output projection."""
    return self.wo(tf.reshape(v, tf.concat([tf.shape(q)[:2], [self.d_model]], 0)))


def train_rate(config, batch: int, xla: bool, seconds: float, attention: bool) -> float:
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    original = layers.MultiHeadAttention._attend
    if not attention:
        layers.MultiHeadAttention._attend = _values_only
    try:
        cfg = TrainConfig(train_steps=1_000_000, batch_size=batch, precision="float32", jit_compile=xla,
                          log_every=1_000_000, checkpoint_every=0, eval_batches=0, max_train_seconds=seconds)
        model = DeepSeekLM(config)
        model(tf.zeros([1, 8], tf.int64))
        loop = TrainLoop(model, make_optimizer(model, cfg), tf.distribute.get_strategy(), cfg)
        loop.train(random_batches(config, batch), 1)
        result = loop.train(random_batches(config, batch, seed=1), 1_000_000, start_step=1)
    finally:
        layers.MultiHeadAttention._attend = original
    return result.tokens / result.seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="timed training per combination")
    args = parser.parse_args()
    config, batch = SHAPES["nanogpt"]
    tokens = batch * config.context_len
    for xla in (False, True):
        seconds, gflops = matmul_bound(config, batch, xla)
        print(f"matmul-only bound, {'XLA' if xla else 'TF '}: {1e3 * seconds:.1f} ms per step "
              f"({gflops:.1f} GFLOP/s) = {tokens / seconds:,.0f} tokens/s", flush=True)
    for xla in (False, True):
        for attention in (True, False):
            rate = train_rate(config, batch, xla, args.seconds, attention)
            print(f"TrainLoop, {'XLA' if xla else 'TF '}, {'with' if attention else 'without'} attention core: "
                  f"{rate:,.0f} tokens/s ({1e3 * tokens / rate:.1f} ms per step)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
