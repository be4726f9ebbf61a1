"""The generate and score signatures' logic, on a tiny random model (no pipeline run needed)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from deepseek_tfx.trainer_module.config import get_preset
from deepseek_tfx.trainer_module.export import LanguageModelModule
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.tokenizer import EOS_ID, NUM_RESERVED, ByteTokenizer

CONTEXT = 24


class _TransformStandIn:
    """What the Transform layer computes for this tokenizer (the real one is tested end to end)."""

    def __call__(self, features):
        text = tf.reshape(features["text"], [-1])
        return {"token_ids": ByteTokenizer().tokenize(text).to_sparse(),
                "num_bytes": tf.strings.length(text, unit="BYTE")}


@pytest.fixture(scope="module")
def module():
    tf.random.set_seed(7)
    model = DeepSeekLM(get_preset("tiny").model.replace(vocab_size=260, context_len=CONTEXT))
    model(tf.zeros([1, 4], tf.int64))
    return LanguageModelModule(model, _TransformStandIn(), {"text": tf.io.FixedLenFeature([1], tf.string)},
                               ByteTokenizer(), max_new_tokens_limit=64)


def generate(module, prompts, n, temperature=0.0, seed=0):
    out = module.generate(tf.constant(prompts), tf.constant(n), tf.constant(temperature, tf.float32),
                          tf.constant(0), tf.constant(seed))
    return [t.decode("utf-8", errors="replace") for t in out["text"].numpy()]


def greedy_reference(model, prompt: str, n: int) -> bytes:
    """No cache: re-run the whole sequence for every new token."""
    ids = [EOS_ID] + [b + NUM_RESERVED for b in prompt.encode()]
    out = []
    for _ in range(n):
        nxt = int(tf.argmax(model(tf.constant([ids], tf.int64))[0, -1]))
        if nxt == EOS_ID:
            break
        ids.append(nxt)
        out.append(nxt)
    return bytes(i - NUM_RESERVED for i in out if i >= NUM_RESERVED)


def test_cached_greedy_generation_equals_reforwarding(module):
    text = generate(module, ["abc"], 12)[0]
    expected = greedy_reference(module.model, "abc", 12).decode("utf-8", errors="replace")
    assert text == expected


def test_batch_of_different_lengths_equals_one_by_one_and_empty_prompt_works(module):
    prompts = ["", "x", "a longer prompt"]
    batched = generate(module, prompts, 10)
    assert batched == [generate(module, [p], 10)[0] for p in prompts]


def test_long_prompts_and_long_generations_are_handled(module):
    tail = "the same last tokens!!!"  # 23 bytes = CONTEXT - 1: only this survives left truncation
    assert len(tail) == CONTEXT - 1
    assert generate(module, ["a" * 50 + tail], 5) == generate(module, ["b" * 70 + tail], 5)
    # 40 new tokens > context: the cache restarts from the last half context and keeps going.
    out = module.generate(tf.constant(["q"]), tf.constant(40), tf.constant(1.0), tf.constant(0),
                          tf.constant(3))["text"].numpy()[0]
    assert len(out) > 0


def test_sampling_is_seeded_and_greedy_is_deterministic(module):
    assert generate(module, ["hello"], 8) == generate(module, ["hello"], 8)
    assert generate(module, ["hello"], 8, 1.0, seed=1) == generate(module, ["hello"], 8, 1.0, seed=1)
    samples = {generate(module, ["hello"], 8, 1.0, seed=s)[0] for s in range(4)}
    assert len(samples) > 1


def test_max_new_tokens_is_clipped(module):
    out = module.generate(tf.constant(["a"]), tf.constant(10_000), tf.constant(1.0), tf.constant(0),
                          tf.constant(5))["text"].numpy()[0]
    assert len(out.decode("utf-8", errors="replace").encode()) <= 64 * 3  # <= 64 tokens (U+FFFD is 3 bytes)


def test_score_matches_the_model_nll(module):
    result = module.score(tf.constant(["to be or not"]))
    ids = [EOS_ID] + [b + NUM_RESERVED for b in b"to be or not"]
    logits = module.model(tf.constant([ids[:-1]], tf.int64))[0].numpy().astype(np.float64)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -sum(logp[i, ids[i + 1]] for i in range(len(ids) - 1))
    assert math.isclose(float(result["perplexity"][0]), math.exp(nll / 12), rel_tol=1e-4)
    assert math.isclose(float(result["bits_per_byte"][0]), nll / (12 * math.log(2)), rel_tol=1e-4)
