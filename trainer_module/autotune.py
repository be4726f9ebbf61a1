"""Chooses the training precision and XLA compilation for this machine at start-up (``auto``).

Rules (TrainConfig.precision / jit_compile ``auto``; an explicit value is kept as set):

* a TPU, or a GPU of compute capability 8.0 or more (native bfloat16): mixed_bfloat16 and XLA;
* an older GPU: mixed_float16 (with loss scaling) and XLA;
* a CPU: measured. CPUs differ (with or without native bfloat16 matmuls; XLA's fusion helps on some and
  its small batched dots hurt on others), so a short probe trains a one-block copy of the model (its MoE
  block when it has one; same width, experts and context, the micro-batch cut to PROBE_TOKENS tokens) for a
  few steps in each candidate setting and keeps the fastest, preferring the simpler one (float32 before
  mixed_bfloat16, TensorFlow's own kernels before XLA) unless the other measured at least PROBE_MARGIN faster:
  a tie within the probe's noise does not flip the setting from one run to the next. The result is kept in a
  small JSON file keyed by the CPU (model name, flags, cores), the TensorFlow version and the probed shape,
  so a machine probes a shape once.
* several CPU workers (MultiWorkerMirroredStrategy): float32 without XLA, unprobed, since workers probing on
  their own could choose differently and then disagree in the first all-reduce.

The decision and its reason go to the log, ``training_summary.json`` (``autotune``), the HParams and the
run summary.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
import tf_keras as keras

from deepseek_tfx.trainer_module.config import SET_IN_CONFIG, ModelConfig, TrainConfig

log = logging.getLogger(__name__)

PROBE_MARGIN = 1.05
"""A setting less simple than another must measure at least this many times its tokens/s to be chosen
(repeated probes of one shape on one machine differ by a few per cent)."""

PROBE_STEPS = 3
"""Timed steps per candidate (after two untimed ones that trace, compile and warm up)."""
PROBE_TOKENS = 4096
"""Most tokens in one probe step: the micro-batch is cut to this (a 100M model's 16K-token micro-batch made
the probe take minutes on a CPU); the relative speed of the candidates is what the probe needs."""


@dataclasses.dataclass(frozen=True)
class Device:
    """What the decision needs to know about one accelerator: its kind and (GPU) compute capability."""

    kind: str
    """TPU, GPU or CPU."""
    compute_capability: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class Decision:
    """The precision and compilation a run trains with, and why."""

    precision: str
    jit_compile: bool
    reason: str
    probe: dict[str, float] = dataclasses.field(default_factory=dict)
    """Tokens/s measured per candidate (``precision+xla`` or ``precision``), when a probe ran."""
    probe_seconds: float = 0.0
    cached_in: str = ""
    """The file the probe's result was read from, when it was measured by an earlier run."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def local_devices() -> list[Device]:
    """This process's accelerators (TPU first, then GPUs with their compute capability), else one CPU."""
    tpus = tf.config.list_physical_devices("TPU")
    if tpus:
        return [Device("TPU") for _ in tpus]
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return [Device("GPU", tf.config.experimental.get_device_details(g).get("compute_capability"))
                for g in gpus]
    return [Device("CPU")]


def decide(train: TrainConfig, model: ModelConfig, devices: Sequence[Device] | None = None,
           multi_worker: bool = False, replicas: int = 1,
           probe: Callable[[str, bool], float] | None = None, cache_dir: str | None = None) -> Decision:
    """The precision and jit_compile to train with; ``auto`` fields are decided, explicit ones kept.

    Args:
        train, model: the run's configs (model with vocab_size set).
        devices: the accelerators (default: ``local_devices()``).
        multi_worker: several workers train together (no CPU probe then).
        replicas: replicas in sync, to probe the per-replica micro-batch.
        probe: ``(precision, jit) -> tokens/s`` (default: ``measure_step``); tests pass a fake.
        cache_dir: where CPU probe results are kept between runs (None: not kept).
    """
    auto_precision, auto_jit = train.precision == "auto", train.jit_compile == "auto"
    if not (auto_precision or auto_jit):
        return Decision(train.precision, bool(train.jit_compile), SET_IN_CONFIG)
    devices = list(devices if devices is not None else local_devices())
    kind = devices[0].kind
    if kind in ("TPU", "GPU"):
        capability = devices[0].compute_capability
        if kind == "TPU" or (capability and tuple(capability) >= (8, 0)):
            precision, why = "mixed_bfloat16", ("a TPU" if kind == "TPU" else
                                                f"a GPU of compute capability {capability[0]}.{capability[1]} "
                                                "(native bfloat16)")
        else:
            cc = f"{capability[0]}.{capability[1]}" if capability else "unknown"
            precision, why = "mixed_float16", f"a GPU of compute capability {cc} (< 8.0: float16, loss-scaled)"
        return _keep_explicit(train, Decision(precision, True, f"{why}; XLA on the accelerator"))
    if multi_worker:
        return _keep_explicit(train, Decision(
            "float32", False, "CPU with several workers: float32 without XLA, not probed (workers probing "
            "on their own could choose differently)"))
    precisions = ["float32", "mixed_bfloat16"] if auto_precision else [train.precision]
    jits = [False, True] if auto_jit else [bool(train.jit_compile)]
    candidates = [_label(p, j) for p in precisions for j in jits]
    micro = max(1, train.batch_size // (train.grad_accum_steps * replicas))
    micro = max(1, min(micro, PROBE_TOKENS // model.context_len))
    path = _cache_path(cache_dir, model, micro, candidates)
    rates, seconds, cached = _read_cache(path), 0.0, path
    if rates is None:
        if probe is None:
            def probe(precision, jit):
                return measure_step(model, train, precision, jit, micro)
        start = time.perf_counter()
        rates = {c: probe(c.split("+")[0], c.endswith("+xla")) for c in candidates}
        seconds, cached = time.perf_counter() - start, ""
        _write_cache(path, rates)
    fastest = max(rates.values())
    best = next(c for c in candidates if rates.get(c, 0.0) * PROBE_MARGIN >= fastest)  # simplest first
    measured = ", ".join(f"{k} {v:,.0f}" for k, v in sorted(rates.items(), key=lambda kv: -kv[1]))
    where = f" (probed by an earlier run on this machine: {path})" if cached else ""
    return Decision(best.split("+")[0], best.endswith("+xla"),
                    f"CPU, measured tokens/s of a one-block probe: {measured}{where}", rates, seconds, cached)


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_flags() -> set[str]:
    """The CPU's instruction-set flags (e.g. avx512_bf16, amx_bf16)."""
    return set(_cpuinfo().get("flags", "").split())


def cpu_signature() -> str:
    """What tells CPUs apart for speed: model name, instruction-set flags and core count."""
    fields = _cpuinfo()
    return f"{fields.get('model name', '')}|{fields.get('flags', '')}|{os.cpu_count()}"


def _cache_path(cache_dir: str | None, model: ModelConfig, micro: int, candidates: list[str]) -> str | None:
    if not cache_dir:
        return None
    key = json.dumps({"cpu": cpu_signature(), "tf": tf.__version__, "model": probe_model(model).to_dict(),
                      "micro_batch": micro, "candidates": candidates}, sort_keys=True)
    return os.path.join(cache_dir, hashlib.sha256(key.encode()).hexdigest()[:16] + ".json")


def _read_cache(path: str | None) -> dict[str, float] | None:
    if not path or not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path) as f:
            return {k: float(v) for k, v in json.load(f).items()}
    except (ValueError, AttributeError, tf.errors.OpError) as e:
        log.warning("Ignoring the unreadable probe result %s (%s); probing again", path, e)
        return None


def _write_cache(path: str | None, rates: dict[str, float]) -> None:
    """Writes to a temporary name and renames, so a reader never sees half a file."""
    if not path:
        return
    tf.io.gfile.makedirs(os.path.dirname(path))
    tmp = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(tmp, "w") as f:
        json.dump(rates, f, indent=2, sort_keys=True)
    tf.io.gfile.rename(tmp, path, overwrite=True)


def _label(precision: str, jit: bool) -> str:
    return precision + ("+xla" if jit else "")


def _keep_explicit(train: TrainConfig, decision: Decision) -> Decision:
    """``decision`` with the fields the config set explicitly put back."""
    precision = decision.precision if train.precision == "auto" else train.precision
    jit = decision.jit_compile if train.jit_compile == "auto" else bool(train.jit_compile)
    return dataclasses.replace(decision, precision=precision, jit_compile=jit)


def apply(train: TrainConfig, decision: Decision) -> TrainConfig:
    """``train`` with the decided precision and jit_compile."""
    return train.replace(precision=decision.precision, jit_compile=decision.jit_compile)


def probe_model(model: ModelConfig) -> ModelConfig:
    """The model the CPU probe trains: one block of the same shape (the MoE block when the model has MoE
    layers; they hold most of its work), no multi-token prediction."""
    return model.replace(n_layers=1, n_dense_layers=0 if model.uses_moe else 1, mtp_depth=0)


def measure_step(model: ModelConfig, train: TrainConfig, precision: str, jit: bool, micro: int,
                 steps: int = PROBE_STEPS) -> float:
    """Tokens/s of the train step of ``probe_model(model)`` on a micro-batch of ``micro`` sequences, in
    ``precision`` with or without XLA (two untimed steps first)."""
    from deepseek_tfx.trainer_module.model import DeepSeekLM  # noqa: PLC0415
    from deepseek_tfx.trainer_module.train_loop import TrainLoop, make_optimizer  # noqa: PLC0415

    cfg = train.replace(precision=precision, jit_compile=jit, batch_size=micro, grad_accum_steps=1,
                        recompute_attention=False)
    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(precision)
    try:
        lm = DeepSeekLM(probe_model(model))
        lm(tf.zeros([1, 8], tf.int64))
        loop = TrainLoop(lm, make_optimizer(lm, cfg), tf.distribute.get_strategy(), cfg)
        ids = np.random.default_rng(0).integers(0, model.vocab_size, size=(micro, model.context_len + 1))
        x, y = tf.constant(ids[:, :-1]), tf.constant(ids[:, 1:])
        for _ in range(2):
            float(loop.step(x, y)[0])
        start = time.perf_counter()
        for _ in range(steps):
            float(loop.step(x, y)[0])
        return steps * micro * model.context_len / (time.perf_counter() - start)
    finally:
        keras.mixed_precision.set_global_policy(previous)
