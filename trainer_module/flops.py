"""Model FLOPs per token and the machine's measured matmul peak, for MFU.

MFU (model FLOPs utilisation, PaLM appendix B) = achieved tokens/s x model
FLOPs per token / peak FLOP/s. Model FLOPs per trained token are
``6 N + 6 L T H (d_qk + d_v)``: 6 per activated matmul parameter (forward 2,
backward 4; the embedding lookup is not a matmul and is excluded) plus the
attention scores and the weighted sum over a context of T. Recomputation is not
counted (that is hardware FLOPs, not model FLOPs).

There is no datasheet peak for a shared CPU, so the peak is measured: the best
rate of a large square matmul in the training dtype, on this machine, in this
process.
"""

from __future__ import annotations

import time

import tensorflow as tf

from deepseek_tfx.trainer_module.config import ModelConfig
from deepseek_tfx.trainer_module.params import count_parameters


def training_flops_per_token(c: ModelConfig) -> float:
    """Model FLOPs to train on one token (forward and backward), for ``c`` with vocab_size set."""
    if c.dense:
        d_qk = d_v = c.d_model // c.n_heads
    else:
        d_qk, d_v = c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim
    attention = 6 * c.n_layers * c.context_len * c.n_heads * (d_qk + d_v)
    return 6.0 * count_parameters(c).activated + attention


def measure_matmul_peak(dtype: str = "float32", n: int = 1024, seconds: float = 1.0) -> float:
    """Best FLOP/s of an n x n matmul in ``dtype`` over about ``seconds`` (after one warm-up)."""
    dt = tf.as_dtype(dtype)
    a = tf.random.normal([n, n], dtype=tf.float32)
    a, b = tf.cast(a, dt), tf.cast(tf.transpose(a), dt)
    matmul = tf.function(lambda x, y: tf.reduce_sum(tf.cast(tf.matmul(x, y)[:1, :1], tf.float32)))
    matmul(a, b).numpy()
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        matmul(a, b).numpy()
        best = max(best, 2.0 * n ** 3 / (time.perf_counter() - start))
    return best


def compute_dtype(precision: str) -> str:
    """The matmul dtype of a Keras precision policy name."""
    return {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}.get(precision, "float32")
