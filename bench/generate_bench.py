"""Generation speed of the exported ``generate`` signature, beside a no-cache re-forward baseline.

    python -m bench.generate_bench [--preset small] [--context-len 512] [--repeats 9]

Builds the preset with random weights and the byte tokenizer (speed does not
depend on the weights), exports it with the real export code (the tokenizer
applied by ``preprocessing_fn``, as Transform applies it), loads the SavedModel
and times greedy generation of 64 and 256 new tokens at batch 1 and batch 8.
EOS does not stop generation here, so every row produces every token.

The baseline decodes the same way but re-runs the whole sequence through the
model for each new token (no cache), the cost the cached step avoids. Prints
tokens per second (batch x new tokens / seconds, best of ``--repeats`` after a
warm-up call) and the 256/64 time ratio (linear is 4.0).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


import deepseek_tfx.trainer_module  # noqa: F401  (first: sets TF_USE_LEGACY_KERAS)
import tensorflow as tf

from deepseek_tfx.serving.client import generate_tensors
from deepseek_tfx.trainer_module import export
from deepseek_tfx.trainer_module.config import ServingConfig, get_preset
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.preprocessing import preprocessing_fn
from deepseek_tfx.trainer_module.tokenizer import ByteTokenizer, EOS_ID

PROMPT = "ROMEO:\nBut soft, what light"


def no_cache_generate(model: DeepSeekLM, context_len: int):
    """Greedy decoding that re-forwards the last ``context_len`` tokens for every new token."""

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None, None], tf.int64),
                                                   tf.TensorSpec([], tf.int32)])
    def run(tokens, steps):
        def body(i, tokens):
            logits = model(tokens[:, -context_len:], training=False)[:, -1, :]
            return i + 1, tf.concat([tokens, tf.argmax(logits, -1)[:, None]], axis=1)

        return tf.while_loop(lambda i, _: i < steps, body, [tf.constant(0), tokens],
                             shape_invariants=[tf.TensorShape([]), tf.TensorShape([None, None])])[1]

    return run


def best_time(fn, repeats: int) -> float:
    fn()  # warm-up: tracing and first-call allocation
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--context-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()

    tokenizer = ByteTokenizer()
    config = get_preset(args.preset).model.replace(context_len=args.context_len, vocab_size=tokenizer.vocab_size)
    tf.random.set_seed(0)
    model = DeepSeekLM(config)
    model(tf.zeros([1, 8], tf.int64))
    module = export.LanguageModelModule(
        model, lambda features: preprocessing_fn(features, {}), {"text": tf.io.FixedLenFeature([1], tf.string)},
        tokenizer, ServingConfig(max_new_tokens=1024), stop_at_eos=False)
    with tempfile.TemporaryDirectory() as tmp:
        tf.saved_model.save(module, tmp, signatures={"generate": module.generate.get_concrete_function()})
        generate = tf.saved_model.load(tmp).signatures["generate"]

        print(f"model: preset {args.preset}, context {config.context_len}, vocab {config.vocab_size}, "
              f"{model.count_params():,} parameters; CPU threads: {os.cpu_count()}")
        baseline = no_cache_generate(model, config.context_len)
        print(f"{'batch':>5} {'new':>4} {'cached s':>9} {'cached tok/s':>12} {'no-cache s':>10} "
              f"{'no-cache tok/s':>14}")
        ratios = {}
        for batch in (1, 8):
            prompts = [PROMPT] * batch
            prompt_ids = tf.concat([tf.fill([batch, 1], tf.constant(EOS_ID, tf.int64)),
                                    tokenizer.tokenize(tf.constant(prompts)).to_tensor()], axis=1)
            for new in (64, 256):
                def cached(prompts=prompts, new=new):
                    out = generate(**generate_tensors(prompts, new))["text"].numpy()
                    assert all(len(t) > 0 for t in out)

                def uncached(batch=batch, prompt_ids=prompt_ids, new=new):
                    out = baseline(prompt_ids, tf.constant(new)).numpy()
                    assert out.shape == (batch, prompt_ids.shape[1] + new)

                c, u = best_time(cached, args.repeats), best_time(uncached, args.repeats)
                ratios[(batch, new)] = (c, u)
                print(f"{batch:>5} {new:>4} {c:>9.3f} {batch * new / c:>12.1f} {u:>10.3f} {batch * new / u:>14.1f}")
        for batch in (1, 8):
            (c64, u64), (c256, u256) = ratios[(batch, 64)], ratios[(batch, 256)]
            print(f"batch {batch}: time ratio 256/64 new tokens: cached {c256 / c64:.2f}, "
                  f"no-cache {u256 / u64:.2f} (linear = 4.0, target <= 4.5); "
                  f"cached is {u256 / c256:.1f}x faster at 256")
    return 0


if __name__ == "__main__":
    sys.exit(main())
