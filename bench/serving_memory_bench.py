"""Peak memory of a fresh process serving ``score`` and ``generate`` requests of 1 KB, 100 KB and 1 MB.

    python -m bench.serving_memory_bench [--preset small] [--model-dir VERSION_DIR] [--sizes 1000,100000,1000000]

Each measurement is its own fresh Python process (TensorFlow and tensorflow_text only, as a server has them):
it loads the SavedModel, reads its resident memory (VmRSS), answers one request, and reports its peak
resident memory (VmHWM, the kernel's high-water mark) and the request's time. The text is real English prose
(the Python documentation topics every CPython ships in ``pydoc_data``), repeated to the size.

Without ``--model-dir`` the preset is exported with random weights and the byte tokenizer (one token per
byte: the most tokens a text can make, so the worst case for memory; weights do not change memory), through
the real export code with its default limits (trainer_module.config.ServingConfig). ``generate`` asks for
16 new tokens; its prompt keeps only its last ``max_prompt_bytes`` bytes before tokenization.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import deepseek_tfx.trainer_module  # noqa: F401  (first: sets TF_USE_LEGACY_KERAS)

SERVE_ONE_REQUEST = r"""
import json, sys, time
import tensorflow as tf
import tensorflow_text  # noqa: F401

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

model_dir, signature_name, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
from pydoc_data.topics import topics
prose = "\n\n".join(topics[k] for k in sorted(topics)).encode("utf-8")
text = (prose * (size // len(prose) + 1))[:size].decode("utf-8", errors="ignore")
model = tf.saved_model.load(model_dir)
signature = model.signatures[signature_name]
if signature_name == "generate":
    inputs = {"prompt": tf.constant([text]), "max_new_tokens": tf.constant([16]), "temperature": tf.constant([0.0]),
              "top_k": tf.constant([0]), "seed": tf.constant([0])}
else:
    inputs = {"text": tf.constant([text])}
loaded = status("VmRSS")
start = time.perf_counter()
try:
    outputs = signature(**inputs)
    result = {k: v.numpy().tolist()[0] for k, v in outputs.items()}
    result = {k: (v.decode("utf-8")[:40] if isinstance(v, bytes) else round(float(v), 4)) for k, v in result.items()}
except tf.errors.InvalidArgumentError as e:
    result = {"INVALID_ARGUMENT": e.message.split("assertion failed:")[-1].strip()[:120]}
print(json.dumps({"loaded_rss": loaded, "peak_rss": status("VmHWM"), "seconds": time.perf_counter() - start,
                  "result": result}))
"""


def _export_random(preset: str, directory: str) -> str:
    import tensorflow as tf

    from deepseek_tfx.trainer_module import export
    from deepseek_tfx.trainer_module.config import get_preset
    from deepseek_tfx.trainer_module.model import DeepSeekLM
    from deepseek_tfx.trainer_module.preprocessing import preprocessing_fn
    from deepseek_tfx.trainer_module.tokenizer import ByteTokenizer

    class _TransformOutput:  # what export_serving_model reads from tft.TFTransformOutput
        def raw_feature_spec(self):
            return {"text": tf.io.FixedLenFeature([1], tf.string)}

        def transform_features_layer(self):
            return lambda features: preprocessing_fn(features, {})

    tokenizer = ByteTokenizer()
    tf.random.set_seed(0)
    model = DeepSeekLM(get_preset(preset).model.replace(vocab_size=tokenizer.vocab_size))
    model(tf.zeros([1, 8], tf.int64))
    export.export_serving_model(model, _TransformOutput(), tokenizer, directory)
    return f"preset {preset}, random weights, byte tokenizer, {model.count_params():,} parameters"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--model-dir", help="a pushed version directory (default: export --preset here)")
    parser.add_argument("--sizes", default="1000,100000,1000000", help="request text sizes in bytes")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        described = f"model {model_dir}"
        if model_dir is None:
            model_dir = os.path.join(tmp, "model")
            described = _export_random(args.preset, model_dir)
        with open(os.path.join(model_dir, "assets.extra", "deepseek_config.json")) as f:
            exported = json.load(f)
        print(f"{described}; context {exported['model']['context_len']}; limits {exported.get('serving')}; "
              f"CPU threads: {os.cpu_count()}")
        print(f"{'signature':>9} {'bytes':>9} {'RSS loaded MB':>13} {'peak RSS MB':>11} {'peak/1KB':>8} "
              f"{'seconds':>8}  result")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["TF_CPP_MIN_LOG_LEVEL"] = "2"
        for signature in ("score", "generate"):
            first = None
            for size in sizes:
                done = subprocess.run([sys.executable, "-c", SERVE_ONE_REQUEST, model_dir, signature, str(size)],
                                      capture_output=True, text=True, env=env, cwd="/", check=False)
                if done.returncode != 0:
                    print(f"{signature:>9} {size:>9} failed: {done.stderr.strip().splitlines()[-1:]}")
                    continue
                row = json.loads(done.stdout.strip().splitlines()[-1])
                first = first or row["peak_rss"]
                print(f"{signature:>9} {size:>9} {row['loaded_rss'] / 2**20:>13.0f} {row['peak_rss'] / 2**20:>11.0f} "
                      f"{row['peak_rss'] / first:>8.2f} {row['seconds']:>8.2f}  {row['result']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
