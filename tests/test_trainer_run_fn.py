"""The Trainer's run_fn on a real Transform output: preemption, warm start, two workers.

Each test runs run_fn (in this process or in child processes, like TFX's
Trainer would) with the tiny preset and the byte tokenizer.
"""

import json
import math
import os
import signal
import subprocess
import sys
import time

import portpicker
import pytest
import tensorflow as tf

from tests.trainer_inputs import fn_args
from deepseek_tfx.trainer_module import autotune, trainer
from deepseek_tfx.trainer_module.config import get_preset
from deepseek_tfx.trainer_module.model import DeepSeekLM
from deepseek_tfx.trainer_module.tokenizer import ByteTokenizer

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = get_preset("tiny")


def _custom(**train):
    cfg = TINY.train.replace(log_every=5, eval_batches=2, **train)
    return {"model": TINY.model.to_dict(), "train": cfg.to_dict(), "preset": "tiny"}


def _summary(args):
    with open(os.path.join(args.model_run_dir, trainer.SUMMARY_FILE)) as f:
        return json.load(f)


CHILD = r"""
import json, sys
from tests.trainer_inputs import fn_args
from deepseek_tfx.trainer_module import trainer
spec = json.loads(sys.argv[1])
trainer.run_fn(fn_args(spec["inputs"], spec["run_dir"], spec["steps"], spec["custom"], spec.get("base_model")))
"""


def _child(spec: dict, env_extra: dict | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": REPO, "CUDA_VISIBLE_DEVICES": "",
           **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(spec)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigkilled_trainer_resumes_from_its_last_checkpoint(trainer_inputs, tmp_path):
    steps, custom = 300, _custom(checkpoint_every=5)
    first = fn_args(trainer_inputs, str(tmp_path), steps, custom)
    ckpt_dir = trainer.checkpoint_dir(first, custom)
    proc = _child({"inputs": trainer_inputs, "run_dir": str(tmp_path), "steps": steps, "custom": custom})
    deadline = time.time() + 300

    def latest_step():
        latest = tf.train.latest_checkpoint(ckpt_dir)
        return -1 if latest is None else int(latest.rsplit("-")[-1])

    while latest_step() < 10:
        assert proc.poll() is None, f"the trainer ended before it could be killed:\n{proc.stdout.read()}"
        assert time.time() < deadline, "no checkpoint within 300 s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = int(tf.train.latest_checkpoint(ckpt_dir).rsplit("-")[-1])
    assert 10 <= killed_at < steps
    assert not os.path.exists(first.serving_model_dir)  # nothing exported by the killed run

    # TFX runs the Trainer again as a new execution: a new model_run directory, the same inputs.
    again = fn_args(trainer_inputs, str(tmp_path), steps, custom)
    again.model_run_dir = os.path.join(str(tmp_path), "Trainer", "model_run", "2")
    assert trainer.checkpoint_dir(again, custom) == ckpt_dir
    trainer.run_fn(again)
    summary = _summary(again)
    assert summary["resumed_from_step"] >= killed_at  # it may have saved once more before dying
    assert summary["train_steps"] == steps
    assert summary["train_tokens"] == (steps - summary["resumed_from_step"]) * TINY.train.batch_size * 64
    assert os.path.exists(os.path.join(again.serving_model_dir, "saved_model.pb"))

    # The resumed run ends where an uninterrupted run ends: same data order, restored optimizer.
    straight = fn_args(trainer_inputs, str(tmp_path / "straight"), steps,
                       {**custom, "checkpoint_root": str(tmp_path / "straight_ckpt")})
    trainer.run_fn(straight)
    assert _summary(straight)["resumed_from_step"] == 0
    assert summary["final_train_loss"] == pytest.approx(_summary(straight)["final_train_loss"], rel=1e-3)
    assert summary["eval_loss_sampled"] == pytest.approx(_summary(straight)["eval_loss_sampled"], rel=1e-3)


@pytest.fixture(scope="module")
def base_export(trainer_inputs, tmp_path_factory):
    base = fn_args(trainer_inputs, str(tmp_path_factory.mktemp("base")), 60, _custom())
    trainer.run_fn(base)
    return base


def test_warm_start_continues_from_the_base_model(trainer_inputs, base_export, tmp_path):
    base_loss = _summary(base_export)["eval_loss_sampled"]
    assert base_loss < math.log(ByteTokenizer.vocab_size) - 1  # well below a uniform guess
    frozen = _custom(learning_rate=1e-9, warmup_steps=0, weight_decay=0.0)  # a step that barely moves
    warm = fn_args(trainer_inputs, str(tmp_path), 1, frozen, base_model=base_export.serving_model_dir)
    trainer.run_fn(warm)
    assert _summary(warm)["base_model"] == f"warm-started from {base_export.serving_model_dir}"
    assert _summary(warm)["eval_loss_sampled"] == pytest.approx(base_loss, rel=1e-3)


def test_warm_start_refuses_an_incompatible_base(base_export):
    def model(**changes):
        m = DeepSeekLM(TINY.model.replace(vocab_size=ByteTokenizer.vocab_size, **changes))
        m(tf.zeros([1, 8], tf.int64))
        return m

    assert trainer.warm_start(model(d_model=96), base_export.serving_model_dir, ByteTokenizer()) == \
        "not warm-started: the base model has a different architecture"

    class OtherTokenizer(ByteTokenizer):
        fingerprint = "sentencepiece:other"

    assert trainer.warm_start(model(), base_export.serving_model_dir, OtherTokenizer()) == \
        "not warm-started: the base model was trained with a different tokenizer"
    assert trainer.warm_start(model(), "/nonexistent", ByteTokenizer()).startswith("not warm-started: ")


def test_two_workers_train_identical_weights_and_only_the_chief_exports(trainer_inputs, tmp_path):
    ports = [portpicker.pick_unused_port() for _ in range(2)]
    cluster = {"worker": [f"localhost:{p}" for p in ports]}
    custom = {**_custom(checkpoint_every=10), "checkpoint_root": str(tmp_path / "ckpt")}
    procs = []
    for index in range(2):
        spec = {"inputs": trainer_inputs, "run_dir": str(tmp_path / f"w{index}"), "steps": 20, "custom": custom}
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        procs.append(_child(spec, {"TF_CONFIG": tf_config}))
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    chief = fn_args(trainer_inputs, str(tmp_path / "w0"), 20, custom)
    worker = fn_args(trainer_inputs, str(tmp_path / "w1"), 20, custom)
    worker.model_run_dir = os.path.join(worker.model_run_dir, "worker-1")
    chief_summary, worker_summary = _summary(chief), _summary(worker)
    assert chief_summary["replicas"] == worker_summary["replicas"] == 2
    assert chief_summary["weights_sha256"] == worker_summary["weights_sha256"]
    assert os.path.exists(os.path.join(chief.serving_model_dir, "saved_model.pb"))
    assert not os.path.exists(worker.serving_model_dir)
    checkpoints = tf.train.get_checkpoint_state(trainer.checkpoint_dir(chief, custom)).all_model_checkpoint_paths
    assert [c.rsplit("-")[-1] for c in checkpoints] == ["10", "20"]


def _tensorboard(directory: str) -> dict:
    """{tag: [(step, Summary.Value), ...]} from the event files in ``directory``."""
    import collections
    import glob

    found = collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                found[value.tag].append((event.step, value))
    return found


def test_tensorboard_logs_train_eval_and_hparams(trainer_inputs, tmp_path, monkeypatch):
    """Also the automatic precision: a (faked) CPU probe where float32 with XLA measured fastest makes the
    Trainer compile its step, with capacity dispatch, and record the choice and its reason."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    rates = {("float32", False): 900.0, ("float32", True): 1000.0, ("mixed_bfloat16", False): 400.0,
             ("mixed_bfloat16", True): 800.0}
    monkeypatch.setattr(autotune, "measure_step", lambda model, train, precision, jit, micro: rates[precision, jit])
    custom = {**_custom(eval_every=20, precision="auto", jit_compile="auto"), "checkpoint_root": str(tmp_path / "ckpt")}
    args = fn_args(trainer_inputs, str(tmp_path), 40, custom)
    trainer.run_fn(args)
    run_dir = args.model_run_dir
    summary = _summary(args)
    assert summary["autotune"]["precision"] == "float32" and summary["autotune"]["jit_compile"] is True
    assert summary["autotune"]["reason"].startswith("CPU, measured tokens/s of a one-block probe: float32+xla 1,000")
    assert summary["train"]["precision"] == "float32" and summary["train"]["jit_compile"] is True
    assert summary["moe_dispatch"] == "capacity"
    assert len(os.listdir(tmp_path / "ckpt" / "autotune")) == 1  # the probe's result, kept for the next run

    train = _tensorboard(os.path.join(run_dir, "train"))
    every_log = list(range(5, 41, 5))  # log_every=5
    for tag in ("train/loss", "train/grad_norm", "train/learning_rate", "train/tokens_per_second", "train/mfu"):
        assert [step for step, _ in train[tag]] == every_log, tag
    moe_layers = TINY.model.n_layers - TINY.model.n_dense_layers
    assert {t for t in train if t.startswith("moe/")} == {
        f"moe/{name}/{i}" for i in range(moe_layers) for name in ("load_max_over_mean", "dropped_fraction")}
    losses = [float(tf.make_ndarray(v.tensor)) for _, v in train["train/loss"]]
    assert losses[-1] < losses[0] and all(math.isfinite(x) for x in losses)
    assert float(tf.make_ndarray(train["train/loss"][-1][1].tensor)) == pytest.approx(
        _summary(args)["final_train_loss"], rel=1e-5)

    evaluation = _tensorboard(os.path.join(run_dir, "eval"))
    assert [step for step, _ in evaluation["eval/loss"]] == [20, 40]  # every eval_every steps, and at the end
    assert float(tf.make_ndarray(evaluation["eval/loss"][-1][1].tensor)) == pytest.approx(
        _summary(args)["eval_loss_sampled"], rel=1e-5)

    hparams = [v for values in _tensorboard(os.path.join(run_dir, "hparams")).values() for _, v in values
               if v.metadata.plugin_data.plugin_name == "hparams"]
    recorded = {}
    for value in hparams:
        data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
        for name, v in data.session_start_info.hparams.items():
            recorded[name] = v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
    assert recorded["preset"] == "tiny"
    assert recorded["model/d_model"] == TINY.model.d_model
    assert recorded["train/learning_rate"] == pytest.approx(TINY.train.learning_rate)
    assert recorded["train/eval_every"] == 20
    assert recorded["train/jit_compile"] is True and recorded["autotune/reason"] == summary["autotune"]["reason"]
