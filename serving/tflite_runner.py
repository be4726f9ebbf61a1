"""Generates text with an exported TensorFlow Lite model (``deepseek-tfx export-tflite``), on device.

    python -m deepseek_tfx.serving.tflite_runner --model DIR --prompt "First Citizen:" [--max-new-tokens 64]
        [--temperature 0] [--top-k 0] [--seed 0]

Needs only ``tf.lite.Interpreter`` (TensorFlow, or the ``tflite-runtime`` package's ``Interpreter``, which has
the same API) and ``sentencepiece``. It follows the SavedModel's ``generate``: the prompt is prefixed with EOS
(the training document separator) and keeps its last ``context_len - 1`` tokens; ``prefill`` fills the
cache; each new token is one ``decode`` step, until ``max_new_tokens`` or EOS; when the cache is full,
generation restarts it from the last half context of text. Greedy at temperature 0, else sampled (optionally
from the top k) with NumPy's generator seeded by ``--seed``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

TFLITE_FILE = "model.tflite"
CONFIG_FILE = "tflite_config.json"
TOKENIZER_FILE = "tokenizer.model"


class LiteGenerator:
    """The exported model and its tokenizer, ready to generate.

    Args:
        model_dir: the directory ``export-tflite`` wrote.
        interpreter_class: ``tf.lite.Interpreter`` by default (``tflite_runtime.interpreter.Interpreter`` works).
    """

    def __init__(self, model_dir: str, interpreter_class=None):
        with open(os.path.join(model_dir, CONFIG_FILE)) as f:
            self.config = json.load(f)
        if interpreter_class is None:
            import tensorflow as tf  # noqa: PLC0415  (only when no lighter interpreter is given)

            interpreter_class = tf.lite.Interpreter
        self.interpreter = interpreter_class(model_path=os.path.join(model_dir, TFLITE_FILE))
        self.prefill = self.interpreter.get_signature_runner("prefill")
        self.decode = self.interpreter.get_signature_runner("decode")
        self.context_len = self.config["model"]["context_len"]
        self.eos, self.pad, self.reserved = self.config["eos_id"], self.config["pad_id"], self.config["num_reserved"]
        self.sp = None
        if self.config["tokenizer"] == "sentencepiece":
            import sentencepiece  # noqa: PLC0415

            self.sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(model_dir, TOKENIZER_FILE))

    def encode(self, text: str) -> list[int]:
        if self.sp is not None:
            return list(self.sp.encode(text))
        return [b + self.reserved for b in text.encode("utf-8")]

    def decode_ids(self, ids) -> str:
        ids = [int(i) for i in ids if i >= self.reserved]
        if self.sp is not None:
            return self.sp.decode(ids)
        return bytes(i - self.reserved for i in ids).decode("utf-8", "replace")

    def _fill(self, ids: list[int]):
        """Prefill with ``ids`` (fewer than context_len); returns (last logits [V], cache, next position)."""
        tokens = np.full([1, self.context_len], self.pad, np.int32)
        tokens[0, :len(ids)] = ids
        out = self.prefill(tokens=tokens)
        return out["logits"][0, len(ids) - 1], (out["cache_0"], out["cache_1"]), len(ids)

    def step(self, token: int, cache, position: int):
        """One decode step: (logits [V], updated cache)."""
        out = self.decode(token=np.array([token], np.int32), position=np.array([position], np.int32),
                          cache_0=cache[0], cache_1=cache[1])
        return out["logits"][0], (out["cache_0"], out["cache_1"])

    def generate_ids(self, prompt: str, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
                     seed: int = 0) -> list[int]:
        t = self.context_len
        text = [self.eos, *self.encode(prompt)][-(t - 1):]
        logits, cache, position = self._fill(text)
        rng = np.random.default_rng(seed)
        new = []
        for _ in range(max_new_tokens):
            nxt = _pick(logits, temperature, top_k, rng)
            new.append(nxt)
            text.append(nxt)
            if nxt == self.eos:
                break
            if position < t:
                logits, cache = self.step(nxt, cache, position)
                position += 1
            else:  # cache full: restart from the last half context of text
                logits, cache, position = self._fill(text[-(t // 2):])
        return new

    def generate(self, prompt: str, max_new_tokens: int, temperature: float = 0.0, top_k: int = 0,
                 seed: int = 0) -> str:
        return self.decode_ids(self.generate_ids(prompt, max_new_tokens, temperature, top_k, seed))


def _pick(logits: np.ndarray, temperature: float, top_k: int, rng) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if top_k > 0:
        z = np.where(z >= np.sort(z)[-top_k], z, -np.inf)
    p = np.exp(z - z.max())
    return int(rng.choice(len(p), p=p / p.sum()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the directory export-tflite wrote")
    parser.add_argument("--prompt", default="")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.model, TFLITE_FILE)):
        print(f"{args.model}: no {TFLITE_FILE} here; make one with deepseek-tfx export-tflite", file=sys.stderr)
        return 2
    generator = LiteGenerator(args.model)
    print(args.prompt + generator.generate(args.prompt, args.max_new_tokens, args.temperature, args.top_k,
                                           args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
