"""Quality at equal time: the ``small`` preset trained for 90 s on tinyshakespeare, validation bits per byte.

    python -m bench.quality_bench [--seconds 90] [--corpus ../shared/data/tinyshakespeare.txt] [--set model.X=V ...]

The reference: a 0.8M-parameter character-level PyTorch model reaches 2.70 bits
per byte on the last 10% after 90 s of training on the first 90%, on these
2-core machines. Here, as in the pipeline:
  * a SentencePiece BPE tokenizer (vocabulary 2,048, the pipeline's default) is
    learned from the training 90% (timed separately; it is not training);
  * the ``small`` preset trains with the Trainer's own ``TrainLoop`` (its step,
    optimizer, schedule, logging) on packed blocks of the training ids, in the
    precision and XLA setting ``auto`` picks on this machine (its probe is set-up,
    not training), for ``--seconds`` of wall-clock time counted from before the
    first step (tracing included); the cosine schedule is sized to the steps that
    fit: a calibration (a throwaway copy of the model, 25 steps, also set-up)
    measures the first step and the steady step time (steps 10-25), so the whole budget is used
    (``--steps`` sets the schedule instead);
  * validation: the whole last 10%, tokenized, scored in consecutive windows of
    the context length (each token predicted from the tokens before it in its
    window, the first from the previous window's last token), bits per byte =
    total NLL / (ln 2 x validation bytes).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time

import deepseek_tfx.trainer_module  # noqa: F401  (first: sets TF_USE_LEGACY_KERAS)
import numpy as np
import sentencepiece
import tensorflow as tf
import tf_keras as keras

from deepseek_tfx.components.tokenizer_gen import train_sentencepiece
from deepseek_tfx.pipeline import settings
from deepseek_tfx.trainer_module import autotune
from deepseek_tfx.trainer_module.flops import compute_dtype, measure_matmul_peak, training_flops_per_token
from deepseek_tfx.trainer_module.model import DeepSeekLM, token_nll
from deepseek_tfx.trainer_module.train_loop import TrainLoop, make_optimizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def blocks(ids: np.ndarray, context: int, batch: int, seed: int) -> tf.data.Dataset:
    n = (len(ids) - 1) // context
    x = ids[: n * context].reshape(n, context)
    y = ids[1: n * context + 1].reshape(n, context)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(n, seed=seed, reshuffle_each_iteration=True)
    return ds.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def validation_nll(model: DeepSeekLM, ids: np.ndarray, context: int, batch: int = 64) -> float:
    """Total NLL (nats) of ids[1:], each window of ``context`` targets predicted from the ids before it."""
    targets = ids[1:]
    n = math.ceil(len(targets) / context)
    pad = n * context - len(targets)
    x = np.concatenate([ids[:-1], np.zeros(pad, ids.dtype)]).reshape(n, context)
    y = np.concatenate([targets, np.zeros(pad, ids.dtype)]).reshape(n, context)
    mask = np.concatenate([np.ones(len(targets)), np.zeros(pad)]).reshape(n, context)
    score = tf.function(lambda a, b: token_nll(model(a, training=False), b), autograph=False)
    total = 0.0
    for i in range(0, n, batch):
        total += float(np.sum(score(x[i:i + batch], y[i:i + batch]).numpy() * mask[i:i + batch]))
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", default=os.path.join(REPO, "..", "shared", "data", "tinyshakespeare.txt"))
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--steps", type=int, default=0, help="schedule length; 0: calibrated to fill --seconds")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="change the small preset's model or train field, as `deepseek-tfx run --set` does")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)  # TF installed a handler first

    raw = open(args.corpus, "rb").read()
    cut = int(len(raw) * 0.9)
    train_text, val_text = raw[:cut].decode("utf-8", "replace"), raw[cut:].decode("utf-8", "replace")
    start = time.perf_counter()
    proto, vocab = train_sentencepiece([line for line in train_text.split("\n") if line.strip()], "bpe",
                                       args.vocab_size)
    sp = sentencepiece.SentencePieceProcessor(model_proto=proto)
    # One stream per split; newlines are pieces, so the stream is the text itself.
    train_ids = np.array(sp.encode(train_text), np.int64)
    val_ids = np.array(sp.encode(val_text), np.int64)
    tokenizer_s = time.perf_counter() - start
    print(f"tokenizer: vocab {vocab}, learned and applied in {tokenizer_s:.1f}s; train {len(train_ids):,} tokens "
          f"({cut:,} bytes), validation {len(val_ids):,} tokens ({len(raw) - cut:,} bytes)")

    chosen = settings.load(assignments=["pipeline.preset=small", *args.set])
    config = chosen.resolved_model.replace(vocab_size=vocab)
    decision = autotune.decide(chosen.resolved_train, config)
    cfg = autotune.apply(chosen.resolved_train, decision).replace(
        max_train_seconds=args.seconds, checkpoint_every=0, eval_batches=0, log_every=25)
    print(f"precision {cfg.precision}, XLA {'on' if cfg.jit_compile else 'off'}: {decision.reason}")
    keras.mixed_precision.set_global_policy(cfg.precision)
    peak = measure_matmul_peak(compute_dtype(cfg.precision))
    data = blocks(train_ids, config.context_len, cfg.batch_size, cfg.seed)

    def new_loop(train_cfg):
        keras.utils.set_random_seed(train_cfg.seed)
        model = DeepSeekLM(config)
        model(tf.zeros([1, 8], tf.int64))
        return TrainLoop(model, make_optimizer(model, train_cfg), tf.distribute.get_strategy(), train_cfg,
                         training_flops_per_token(config), peak)

    steps = args.steps
    if not steps:  # calibration: first step and steady step time of a throwaway copy
        probe = new_loop(cfg.replace(train_steps=25, max_train_seconds=0.0, log_every=1000))
        first = probe.train(data, 1)
        probe.train(data, 9, start_step=1)  # the first steps after tracing are slower than the rest
        steady = probe.train(data, 25, start_step=9)
        step_s = steady.seconds / (steady.steps - steady.start_step)
        steps = max(cfg.warmup_steps + 1, int((args.seconds - first.seconds) / step_s))
        print(f"calibration: first step {first.seconds:.1f}s, then {step_s * 1000:.0f} ms per step: "
              f"the schedule is sized to {steps} steps")
    cfg = cfg.replace(train_steps=steps)
    loop = new_loop(cfg)
    model = loop.model
    result = loop.train(data, cfg.train_steps)
    nll = validation_nll(model, val_ids, config.context_len)
    bpb = nll / (math.log(2) * (len(raw) - cut))
    total, active = model.parameter_counts()
    print(f"small preset: {total / 1e6:.2f}M parameters ({active / 1e6:.2f}M activated), {result.steps} steps "
          f"in {result.seconds:.1f}s ({result.tokens:,} tokens, {result.tokens_per_second:,.0f} tokens/s steady)")
    for i, moe in enumerate(model.moe_layers()):
        load = moe.expert_load.numpy()
        print(f"MoE layer {i}: the last step's busiest expert took {load.max() / load.mean():.2f}x the mean load")
    print(f"validation: {nll / (len(val_ids) - 1):.4f} nats/token, {bpb:.3f} bits per byte "
          f"(reference: 2.70 for the 0.8M-parameter char-level PyTorch model in 90 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
