"""Training speed and MFU on whatever device this process has (GPU, TPU or CPU), XLA on and off.

    python -m bench.accelerator_bench [--seconds 20] [--presets small,medium] [--precision auto]
        [--xla both|off|on] [--json OUT.json]

For each preset (``small``; ``medium``, the ~100M-parameter one) it runs the Trainer's own ``TrainLoop`` on
the bytes of ``--corpus`` as token ids, from memory (vocabulary 2,048, the pipeline's default tokenizer size;
the preset's batch and context), under the strategy the Trainer would pick (trainer.get_strategy), with and
without XLA, in the precision ``auto`` picks for this device (trainer_module.autotune; ``--precision`` to
force one). XLA with MoE layers uses capacity dispatch (factor 1.25); without XLA, dropless dispatch, and the
CPU rows also run capacity dispatch without XLA, to say which dispatch is faster where. It prints tokens/s
after the first step (tracing and compiling excluded), the share of token copies dropped, and MFU = tokens/s x
model FLOPs per token / the device's own matmul peak measured in the same run: bfloat16 (a 4096^2 matmul on an
accelerator, 1024^2 on a CPU), and float32 too; on a CPU without native bfloat16 the float32 peak is the one
to read (it says so).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import deepseek_tfx.trainer_module  # noqa: F401  (first: sets TF_USE_LEGACY_KERAS)
import numpy as np
import tensorflow as tf
import tf_keras as keras

from deepseek_tfx.trainer_module import autotune
from deepseek_tfx.trainer_module.config import TrainConfig, get_preset
from deepseek_tfx.trainer_module.flops import measure_matmul_peak, training_flops_per_token
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.params import count_parameters
from deepseek_tfx.trainer_module.trainer import get_strategy
from deepseek_tfx.trainer_module.train_loop import TrainLoop, make_optimizer

VOCAB = 2048


def native_bfloat16(device: autotune.Device) -> bool:
    """Whether bfloat16 matmuls are native: TPU, GPU of compute capability >= 8, or a CPU with AVX512-BF16/AMX."""
    if device.kind == "TPU":
        return True
    if device.kind == "GPU":
        return bool(device.compute_capability) and tuple(device.compute_capability) >= (8, 0)
    return bool({"avx512_bf16", "amx_bf16"} & autotune.cpu_flags())


CORPUS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data",
                      "tinyshakespeare.txt")


def batches(vocab: int, batch: int, context: int, corpus: str) -> tf.data.Dataset:
    """Blocks of the corpus's bytes as token ids (real text, so the router sees real structure: on random
    tokens nothing can be learned and routing collapses), or random ids when there is no corpus."""
    rows = 64 * batch
    if os.path.exists(corpus):
        ids = np.frombuffer(open(corpus, "rb").read(), np.uint8).astype(np.int64)
        rows = min(rows, len(ids) // (context + 1))
        tokens = ids[: rows * (context + 1)].reshape(rows, context + 1)
    else:
        tokens = np.random.default_rng(0).integers(4, vocab, size=(rows, context + 1))
    ds = tf.data.Dataset.from_tensor_slices((tokens[:, :-1], tokens[:, 1:])).shuffle(rows, seed=0)
    return ds.repeat().batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def measure(preset: str, precision: str, xla: bool, dispatch: str, seconds: float, corpus: str) -> dict:
    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(0)
    p = get_preset(preset)
    model_cfg = p.model.replace(vocab_size=VOCAB)
    cfg = p.train.replace(train_steps=1_000_000, precision=precision, jit_compile=xla, moe_dispatch=dispatch,
                          log_every=1_000_000, checkpoint_every=0, eval_batches=0, max_train_seconds=seconds)
    strategy = get_strategy()
    with strategy.scope():
        model = DeepSeekLM(model_cfg)
        model(tf.zeros([1, 8], tf.int64))
        optimizer = make_optimizer(model, cfg)
        loop = TrainLoop(model, optimizer, strategy, cfg)
    data = batches(VOCAB, cfg.batch_size, model_cfg.context_len, corpus)
    start = time.perf_counter()
    loop.train(data, 1)
    first = time.perf_counter() - start
    result = loop.train(data, 1_000_000, start_step=1)
    last = loop.step(*next(iter(strategy.experimental_distribute_dataset(data))))
    keras.mixed_precision.set_global_policy("float32")
    # Steady rate (tracing excluded); a step longer than --seconds gives only the one step (no tracing in it).
    return {"first_step_s": first, "tokens_per_second": result.tokens_per_second,
            "steps": result.steps - 1, "dispatch": loop.dispatch,
            "dropped": float(np.mean(last[2].numpy())) if loop.dispatch == "capacity" else 0.0,
            "flops_per_token": training_flops_per_token(model_cfg), "replicas": strategy.num_replicas_in_sync}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="timed training per row")
    parser.add_argument("--presets", default="small,medium")
    parser.add_argument("--precision", default="auto", help="auto (this device's rule or probe) or a policy name")
    parser.add_argument("--xla", choices=("both", "off", "on"), default="both",
                        help="which rows: with and without XLA (default), or only one kind")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--corpus", default=CORPUS, help="text whose bytes are the training tokens")
    args = parser.parse_args()
    logging.getLogger("deepseek_tfx").setLevel(logging.WARNING)

    device = autotune.local_devices()[0]
    accelerator = device.kind != "CPU"
    n = 4096 if accelerator else 1024
    peaks = {d: measure_matmul_peak(d, n=n, seconds=2.0) for d in ("bfloat16", "float32")}
    native = native_bfloat16(device)
    name = {"GPU": "GPU " + ", ".join(d.get("device_name", "?") for d in [
        tf.config.experimental.get_device_details(g) for g in tf.config.list_physical_devices("GPU")])}.get(
        device.kind, device.kind)
    print(f"device: {name}; compute capability {device.compute_capability}; native bfloat16: "
          f"{'yes' if native else 'no'}; {os.cpu_count()} CPU threads; TensorFlow {tf.__version__}")
    print(f"matmul peak ({n}^2, this run): bfloat16 {peaks['bfloat16'] / 1e12:.3f} TFLOP/s, "
          f"float32 {peaks['float32'] / 1e12:.3f} TFLOP/s")
    rows = []
    print(f"{'preset':<7} {'params':>7} {'precision':<15} {'XLA':<4} {'dispatch':<9} {'first s':>7} "
          f"{'tokens/s':>9} {'dropped':>7} {'MFU bf16':>8} {'MFU f32':>8}")
    for preset in args.presets.split(","):
        model_cfg = get_preset(preset).model.replace(vocab_size=VOCAB)
        precision = args.precision
        decision = None
        if precision == "auto":
            decision = autotune.decide(TrainConfig(batch_size=get_preset(preset).train.batch_size), model_cfg)
            precision = decision.precision
            print(f"{preset}: auto picks {precision}, XLA {'on' if decision.jit_compile else 'off'} "
                  f"({decision.reason}; probe {decision.probe_seconds:.1f} s)")
        # XLA last: its compiled step's buffers stay with the process (a 100M model's OOMed the next row).
        combos = [(False, "dropless")] + ([] if accelerator else [(False, "capacity")]) + [(True, "capacity")]
        combos = [(xla, d) for xla, d in combos if args.xla == "both" or xla == (args.xla == "on")]
        for xla, dispatch in combos:
            r = measure(preset, precision, xla, dispatch, args.seconds, args.corpus)
            mfu = {d: r["tokens_per_second"] * r["flops_per_token"] / (peaks[d] * r["replicas"]) for d in peaks}
            rows.append({"preset": preset, "precision": precision, "xla": xla, **r,
                         "mfu_bf16_peak": mfu["bfloat16"], "mfu_f32_peak": mfu["float32"]})
            print(f"{preset:<7} {count_parameters(model_cfg).total / 1e6:>6.1f}M {precision:<15} "
                  f"{'yes' if xla else 'no':<4} {r['dispatch']:<9} {r['first_step_s']:>7.1f} "
                  f"{r['tokens_per_second']:>9,.0f} {100 * r['dropped']:>6.2f}% {100 * mfu['bfloat16']:>7.1f}% "
                  f"{100 * mfu['float32']:>7.1f}%", flush=True)
    if not native:
        print("This device has no native bfloat16: read MFU against the float32 peak (MFU f32).")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "native_bfloat16": native, "peaks": peaks, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
