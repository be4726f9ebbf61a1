"""The dense nanoGPT shape: the Trainer's loop with its default (auto) settings against a PyTorch loop.

    make bench-torch     # once: .venv-torch, a Python with torch (a bench-only extra)
    python -m bench.torch_compare [--seconds 20] [--torch-python .venv-torch/bin/python]

Same run, same machine, one after the other: (1) ``bench.train_bench``'s nanoGPT shape (dense GPT switch, 4
layers, 4 heads, width 128, context 64, batch 12, vocabulary 65, SwiGLU 344) trained by the Trainer's
``TrainLoop`` in the precision and XLA setting that ``auto`` picks on this machine (trainer_module.autotune,
its probe included), (2) ``bench/torch_loop.py``, the same model in PyTorch, float32, eager, in a child
process under ``--torch-python``, and (3) ``bench.step_anatomy``'s matmul-only bound: every matmul of one
training step of this shape and nothing else, in one TensorFlow graph (TF kernels and XLA, the faster kept),
the ceiling of any TensorFlow loop of this shape on this machine. Prints the three tokens/s and the ratios of
(1) and (3) to (2).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from bench.step_anatomy import matmul_bound
from bench.train_bench import SHAPES, measure
from deepseek_tfx.trainer_module import autotune
from deepseek_tfx.trainer_module.config import TrainConfig

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--torch-python", default=os.path.join(os.path.dirname(HERE), ".venv-torch", "bin", "python"))
    args = parser.parse_args()
    if not os.path.exists(args.torch_python):
        print(f"no Python with torch at {args.torch_python}: run `make bench-torch` first", file=sys.stderr)
        return 2
    config, batch = SHAPES["nanogpt"]
    decision = autotune.decide(TrainConfig(batch_size=batch), config)
    print(f"auto picks {decision.precision}, XLA {'on' if decision.jit_compile else 'off'}: {decision.reason}")
    ours = measure(config, batch, decision.precision, decision.jit_compile, args.seconds)
    shape = ["--vocab", config.vocab_size, "--d-model", config.d_model, "--layers", config.n_layers,
             "--heads", config.n_heads, "--inter", config.inter_dim, "--context", config.context_len,
             "--batch", batch, "--seconds", args.seconds]
    done = subprocess.run([args.torch_python, os.path.join(HERE, "torch_loop.py"), *map(str, shape)],
                          capture_output=True, text=True, check=True)
    torch = json.loads(done.stdout.strip().splitlines()[-1])
    ratio = ours["tokens_per_second"] / torch["tokens_per_second"]
    bound = max(batch * config.context_len / matmul_bound(config, batch, xla)[0] for xla in (False, True))
    print(f"TrainLoop ({decision.precision}, XLA {'on' if decision.jit_compile else 'off'}): "
          f"{ours['tokens_per_second']:,.0f} tokens/s")
    print(f"PyTorch {torch['torch']} loop (float32, eager, {torch['threads']} threads): "
          f"{torch['tokens_per_second']:,.0f} tokens/s")
    print(f"ratio: {ratio:.2f}x")
    print(f"matmul-only bound (this step's matmuls and nothing else, TensorFlow, the faster of TF kernels and "
          f"XLA): {bound:,.0f} tokens/s = {bound / torch['tokens_per_second']:.2f}x the PyTorch loop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
