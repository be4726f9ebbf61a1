"""TensorFlow Lite export per quantization: file size, decode tokens/s at batch 1, eval bits per byte.

    python -m bench.tflite_bench [--model-dir VERSION_DIR] [--output-root deepseek_tfx_output]
        [--eval-bytes 30000] [--decode-steps 128]

Exports the pushed version (default: the newest under OUTPUT/serving_model/deepseek/) three times with
``deepseek-tfx export-tflite``'s code (none = float32, float16, dynamic-int8) and, for each and for the
SavedModel's own ``score`` signature as the reference: the ``.tflite`` size; decode speed at batch 1 (one
``prefill`` of a 16-token prompt, then ``--decode-steps`` greedy ``decode`` steps, best of 3, through
``serving/tflite_runner.py``); bits per byte on the eval text: the documents of the newest run's ExampleGen
``eval`` split (held out from training), their first ``--eval-bytes`` bytes, each document scored from EOS in
prefill windows of context_len tokens.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys
import tempfile
import time

import deepseek_tfx.trainer_module  # noqa: F401  (first: sets TF_USE_LEGACY_KERAS)
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the SavedModel's SentencePiece ops)

from deepseek_tfx.serving.tflite_runner import LiteGenerator
from deepseek_tfx.trainer_module import tflite_export
from deepseek_tfx.trainer_module.model import token_nll


def newest_version(output: str) -> str:
    versions = sorted(glob.glob(os.path.join(output, "serving_model", "deepseek", "[0-9]*")), key=os.path.basename)
    if not versions:
        raise SystemExit(f"no pushed version under {output}/serving_model/deepseek: run `make run` first")
    return versions[-1]


def eval_documents(output: str, limit: int) -> list[str]:
    """Texts of the newest ExampleGen eval split, up to ``limit`` bytes in all."""
    splits = sorted(glob.glob(os.path.join(output, "pipeline_root", "*ExampleGen*", "examples", "*", "Split-eval")),
                    key=os.path.getmtime)
    if not splits:
        raise SystemExit(f"no ExampleGen eval split under {output}/pipeline_root")
    files = sorted(glob.glob(os.path.join(splits[-1], "*")))
    docs, total = [], 0
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP"):
        text = tf.train.Example.FromString(record.numpy()).features.feature["text"].bytes_list.value[0]
        docs.append(text.decode("utf-8"))
        total += len(text)
        if total >= limit:
            break
    return docs


def lite_bits_per_byte(lite: LiteGenerator, docs: list[str]) -> float:
    t, nll, nbytes = lite.context_len, 0.0, 0
    for doc in docs:
        ids = [lite.eos, *lite.encode(doc)]
        for start in range(0, len(ids) - 1, t):
            window = ids[start:start + t + 1]
            tokens = np.full([1, t], lite.pad, np.int32)
            tokens[0, :len(window) - 1] = window[:-1]
            logits = lite.prefill(tokens=tokens)["logits"][0, :len(window) - 1]
            nll += float(tf.reduce_sum(token_nll(logits, np.array(window[1:]))))
        nbytes += len(doc.encode("utf-8"))
    return nll / (math.log(2) * nbytes)


def decode_speed(lite: LiteGenerator, steps: int) -> float:
    best = 0.0
    for _ in range(3):
        logits, cache, position = lite._fill([lite.eos, *lite.encode("The quick brown fox jumps over")][:16])
        start = time.perf_counter()
        for i in range(steps):
            logits, cache = lite.step(int(np.argmax(logits)), cache, min(position + i, lite.context_len - 1))
        best = max(best, steps / (time.perf_counter() - start))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-root", default="deepseek_tfx_output")
    parser.add_argument("--model-dir", help="default: the newest pushed version under --output-root")
    parser.add_argument("--eval-bytes", type=int, default=30_000)
    parser.add_argument("--decode-steps", type=int, default=128)
    args = parser.parse_args()
    model_dir = args.model_dir or newest_version(args.output_root)
    docs = eval_documents(args.output_root, args.eval_bytes)
    score = tf.saved_model.load(model_dir).signatures["score"]
    ref_bpb = [float(score(text=tf.constant([d]))["bits_per_byte"][0]) for d in docs]
    weights = [len(d.encode("utf-8")) for d in docs]
    reference = sum(b * w for b, w in zip(ref_bpb, weights, strict=True)) / sum(weights)
    saved_size = sum(os.path.getsize(p) for p in glob.glob(os.path.join(model_dir, "variables", "*")))
    print(f"model: {model_dir}; eval text: {len(docs)} held-out documents, {sum(weights):,} bytes")
    print(f"SavedModel: variables {saved_size / 1e6:.2f} MB, score signature: {reference:.4f} bits per byte")
    print(f"{'quantize':<13} {'size MB':>8} {'decode tok/s':>12} {'bits/byte':>9} {'vs float32':>10}")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for q in tflite_export.QUANTIZATIONS:
            path = tflite_export.export_tflite(model_dir, os.path.join(tmp, q), q)
            lite = LiteGenerator(os.path.dirname(path))
            rows[q] = (os.path.getsize(path), decode_speed(lite, args.decode_steps), lite_bits_per_byte(lite, docs))
            size, speed, bpb = rows[q]
            print(f"{q:<13} {size / 1e6:>8.2f} {speed:>12,.0f} {bpb:>9.4f} {bpb - rows['none'][2]:>+10.4f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
