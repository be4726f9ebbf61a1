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
    first step (tracing included); the cosine schedule ends with the budget: its
    end is re-sized every 25 steps to the steps the remaining time holds at the
    step time of the last 25 steps (``--steps`` fixes the schedule instead);
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
    parser.add_argument("--steps", type=int, default=0,
                        help="schedule length; 0: re-sized while training to end with --seconds")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="change the small preset's model or train field, as `deepseek-tfx run --set` does")
    args = parser.parse_args()
    other = [a for a in args.set if a.split(".", 1)[0] not in ("model", "train")]
    if other:
        parser.error(f"--set {other[0]}: only model.* and train.* fields (the preset is small; the vocabulary is "
                     "--vocab-size)")
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

    keras.utils.set_random_seed(cfg.seed)
    model = DeepSeekLM(config)
    model(tf.zeros([1, 8], tf.int64))
    tokens_per_step = cfg.batch_size * config.context_len
    # --steps N fixes the schedule at N steps. Otherwise the cosine's end is a variable, re-sized every 25 steps
    # (the loop's eval_every hook) to the steps the rest of the budget holds at the step time of the last 25
    # steps: the schedule ends with the budget whatever this machine's speed (and its changes). Until the
    # second re-size (step 50, after the warmup: the first 25 steps hold the tracing) it is the preset's.
    schedule_steps = tf.Variable(float(args.steps or cfg.train_steps), trainable=False)
    loop = TrainLoop(model, make_optimizer(model, cfg, schedule_steps), tf.distribute.get_strategy(),
                     cfg.replace(eval_every=0 if args.steps else 25), training_flops_per_token(config), peak)
    marks = []

    def resize(step: int) -> None:
        marks.append((step, time.perf_counter()))
        if len(marks) >= 2:
            (step_0, time_0), (step_1, time_1) = marks[-2:]
            remaining = args.seconds - (time_1 - start)
            schedule_steps.assign(step + max(remaining, 0.0) * (step_1 - step_0) / (time_1 - time_0))

    if not args.steps:
        print(f"the loop runs until the {args.seconds:.0f} s budget ends (its step count, "
              f"{int(100 * args.seconds)}, is only an upper bound)")
    start = time.perf_counter()
    result = loop.train(data, args.steps or int(100 * args.seconds), evaluate=resize)
    wall = time.perf_counter() - start
    steps, seconds, steady = result.steps, result.seconds, result.steady_seconds
    if not args.steps:
        print(f"the schedule ended at step {schedule_steps.numpy():.0f}; the loop stopped at step {steps} after "
              f"{seconds:.1f} s ({wall:.1f} s on the bench's clock)")
    result_tokens = steps * tokens_per_step
    nll = validation_nll(model, val_ids, config.context_len)
    bpb = nll / (math.log(2) * (len(raw) - cut))
    total, active = model.parameter_counts()
    print(f"small preset: {total / 1e6:.2f}M parameters ({active / 1e6:.2f}M activated), {steps} steps "
          f"in {seconds:.1f}s ({result_tokens:,} tokens, {(steps - 1) * tokens_per_step / steady:,.0f} tokens/s "
          "steady)")
    for i, moe in enumerate(model.moe_layers()):
        load = moe.expert_load.numpy()
        print(f"MoE layer {i}: the last step's busiest expert took {load.max() / load.mean():.2f}x the mean load")
    print(f"validation: {nll / (len(val_ids) - 1):.4f} nats/token, {bpb:.3f} bits per byte "
          f"(reference: 2.70 for the 0.8M-parameter char-level PyTorch model in 90 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
