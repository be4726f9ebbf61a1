"""Automatic precision and XLA (trainer_module/autotune.py): device rules, the CPU probe and its cache."""

import os

import pytest

from deepseek_tfx.trainer_module import autotune
from deepseek_tfx.trainer_module.autotune import Device
from deepseek_tfx.trainer_module.config import ConfigError, TrainConfig, get_preset

MODEL = get_preset("tiny").model.replace(vocab_size=97)
AUTO = TrainConfig(batch_size=8)  # precision and jit_compile default to auto


def _never(precision, jit):
    raise AssertionError("an accelerator or an explicit config must not be probed")


def test_auto_is_the_default_and_other_values_are_refused():
    assert (AUTO.precision, AUTO.jit_compile, AUTO.moe_dispatch) == ("auto", "auto", "auto")
    with pytest.raises(ConfigError, match="jit_compile: must be true, false or auto"):
        TrainConfig(jit_compile="yes")
    with pytest.raises(ConfigError, match="moe_dispatch"):
        TrainConfig(moe_dispatch="sorted")


@pytest.mark.parametrize("devices, precision, why", [
    ([Device("TPU")], "mixed_bfloat16", "a TPU"),
    ([Device("GPU", (9, 0)), Device("GPU", (9, 0))], "mixed_bfloat16", "compute capability 9.0 (native bfloat16)"),
    ([Device("GPU", (8, 0))], "mixed_bfloat16", "compute capability 8.0"),
    ([Device("GPU", (7, 5))], "mixed_float16", "compute capability 7.5 (< 8.0: float16, loss-scaled)"),
])
def test_accelerators_follow_the_rules_without_a_probe(devices, precision, why):
    decision = autotune.decide(AUTO, MODEL, devices, probe=_never)
    assert (decision.precision, decision.jit_compile) == (precision, True)
    assert why in decision.reason


def test_an_explicit_field_is_kept_and_only_the_other_is_decided():
    decision = autotune.decide(AUTO.replace(precision="float32"), MODEL, [Device("GPU", (9, 0))], probe=_never)
    assert (decision.precision, decision.jit_compile) == ("float32", True)
    probed = []
    decision = autotune.decide(AUTO.replace(jit_compile=False), MODEL, [Device("CPU")],
                               probe=lambda p, j: probed.append((p, j)) or {"float32": 1.0}.get(p, 2.0))
    assert probed == [("float32", False), ("mixed_bfloat16", False)]  # XLA set off: only precisions probed
    assert (decision.precision, decision.jit_compile) == ("mixed_bfloat16", False)
    both = autotune.decide(AUTO.replace(precision="float32", jit_compile=False), MODEL, probe=_never)
    assert (both.precision, both.jit_compile, both.reason) == ("float32", False, "set in the config")


@pytest.mark.parametrize("rates, chosen", [
    ({"float32": 900, "float32+xla": 600, "mixed_bfloat16": 400, "mixed_bfloat16+xla": 700}, ("float32", False)),
    ({"float32": 900, "float32+xla": 600, "mixed_bfloat16": 400, "mixed_bfloat16+xla": 1200},
     ("mixed_bfloat16", True)),
    ({"float32": 900, "float32+xla": 950, "mixed_bfloat16": 400, "mixed_bfloat16+xla": 700}, ("float32", True)),
    # within PROBE_MARGIN (5%) of the fastest, the simpler setting is kept: a tie does not flip the choice
    ({"float32": 900, "float32+xla": 930, "mixed_bfloat16": 400, "mixed_bfloat16+xla": 940}, ("float32", False)),
    ({"float32": 499, "float32+xla": 522, "mixed_bfloat16": 221, "mixed_bfloat16+xla": 527}, ("float32", True)),
])
def test_a_cpu_is_probed_and_the_fastest_setting_wins(rates, chosen):
    decision = autotune.decide(AUTO, MODEL, [Device("CPU")],
                               probe=lambda p, j: rates[p + ("+xla" if j else "")])
    assert (decision.precision, decision.jit_compile) == chosen
    assert decision.probe == rates
    assert decision.reason.startswith("CPU, measured tokens/s of a one-block probe: ")


def test_several_cpu_workers_are_not_probed():
    decision = autotune.decide(AUTO, MODEL, [Device("CPU")], multi_worker=True, probe=_never)
    assert (decision.precision, decision.jit_compile) == ("float32", False)
    assert "several workers" in decision.reason


def test_the_probe_result_is_kept_per_machine_and_shape(tmp_path):
    calls = []

    def probe(precision, jit):
        calls.append((precision, jit))
        return 100.0 if (precision, jit) == ("float32", True) else 50.0

    first = autotune.decide(AUTO, MODEL, [Device("CPU")], probe=probe, cache_dir=str(tmp_path))
    assert len(calls) == 4 and not first.cached_in
    again = autotune.decide(AUTO, MODEL, [Device("CPU")], probe=probe, cache_dir=str(tmp_path))
    assert len(calls) == 4  # read back, not probed again
    assert (again.precision, again.jit_compile) == ("float32", True) and again.probe == first.probe
    assert again.cached_in.startswith(str(tmp_path)) and "probed by an earlier run" in again.reason
    autotune.decide(AUTO, MODEL.replace(d_model=96), [Device("CPU")], probe=probe, cache_dir=str(tmp_path))
    assert len(calls) == 8  # another shape is probed
    assert len(os.listdir(tmp_path)) == 2
    broken = os.path.join(tmp_path, sorted(os.listdir(tmp_path))[0])
    with open(broken, "w") as f:
        f.write("{not json")
    autotune.decide(AUTO, MODEL, [Device("CPU")], probe=probe, cache_dir=str(tmp_path))
    autotune.decide(AUTO, MODEL.replace(d_model=96), [Device("CPU")], probe=probe, cache_dir=str(tmp_path))
    assert len(calls) == 12  # the unreadable one was probed again, the other was read


def test_the_real_probe_measures_a_one_block_model():
    assert autotune.probe_model(MODEL).n_layers == 1 and autotune.probe_model(MODEL).uses_moe
    assert autotune.measure_step(MODEL, AUTO, "float32", False, micro=2, steps=2) > 0


def test_the_probe_cuts_a_large_micro_batch(monkeypatch):
    micro = []
    monkeypatch.setattr(autotune, "measure_step", lambda model, train, p, j, m: micro.append(m) or 1.0)
    autotune.decide(AUTO.replace(batch_size=256), MODEL, [Device("CPU")])
    assert micro == [autotune.PROBE_TOKENS // MODEL.context_len] * 4  # 64 sequences of 64, not 256
    micro.clear()
    autotune.decide(AUTO.replace(batch_size=8, grad_accum_steps=2), MODEL, [Device("CPU")], replicas=2)
    assert micro == [2] * 4  # one replica's micro-batch: 8 / 2 accumulation steps / 2 replicas
