"""The gate's metric choice and the atomic, retained push, without running a pipeline."""

import json
import os
import threading

import pytest
import tensorflow_model_analysis as tfma
from tfx.types import standard_artifacts

from deepseek_tfx.components import model_gate
from deepseek_tfx.pipeline.config import PipelineConfig
from deepseek_tfx.pipeline.pipeline import eval_config


def _model_artifact(tmp_path, name, fingerprint):
    artifact = standard_artifacts.Model()
    artifact.uri = str(tmp_path / name)
    extra = tmp_path / name / "Format-Serving" / "assets.extra"
    extra.mkdir(parents=True)
    if fingerprint is not None:
        (extra / "deepseek_config.json").write_text(json.dumps({"tokenizer_fingerprint": fingerprint}))
    return artifact


def test_same_tokenizer_compares_perplexity_different_compares_bits_per_byte(tmp_path):
    a = _model_artifact(tmp_path, "a", "sentencepiece:aaa")
    a2 = _model_artifact(tmp_path, "a2", "sentencepiece:aaa")
    b = _model_artifact(tmp_path, "b", "sentencepiece:bbb")
    old = _model_artifact(tmp_path, "old", None)  # an export from before fingerprints
    assert model_gate.comparison_metric(a, None) is None
    assert model_gate.comparison_metric(a, a2) == "Perplexity"
    assert model_gate.comparison_metric(a, b) == "BitsPerByte"
    assert model_gate.comparison_metric(a, old) == "BitsPerByte"  # unknown: only bpb is safe


def _change_thresholds(config):
    return {m.class_name for spec in config.metrics_specs for m in spec.metrics
            if m.threshold.HasField("change_threshold")}


def test_keep_change_threshold_keeps_one_metric_and_the_absolute_bounds():
    config = eval_config(PipelineConfig(preset="tiny", max_perplexity=100.0, max_bits_per_byte=3.0))
    assert _change_thresholds(config) == {"Perplexity", "BitsPerByte"}
    for metric in ("Perplexity", "BitsPerByte"):
        kept = model_gate.keep_change_threshold_on(config, metric)
        assert _change_thresholds(kept) == {metric}
        bounds = {m.class_name: m.threshold.value_threshold.upper_bound.value
                  for spec in kept.metrics_specs for m in spec.metrics if m.threshold.HasField("value_threshold")}
        assert bounds == {"Perplexity": 100.0, "BitsPerByte": 3.0}
    assert _change_thresholds(config) == {"Perplexity", "BitsPerByte"}  # the input is not modified


def test_missing_change_threshold_is_an_error():
    config = tfma.EvalConfig(metrics_specs=[tfma.MetricsSpec(metrics=[tfma.MetricConfig(class_name="Perplexity")])])
    with pytest.raises(model_gate.GateError, match="no change threshold on BitsPerByte"):
        model_gate.keep_change_threshold_on(config, "BitsPerByte")


def _saved_model(path, files=3, size=1000):
    path.mkdir(parents=True)
    (path / "variables").mkdir()
    for i in range(files):
        (path / "variables" / f"part-{i}").write_bytes(os.urandom(size))
    (path / "saved_model.pb").write_bytes(b"graph")
    return str(path)


def test_push_writes_increasing_versions(tmp_path):
    model = _saved_model(tmp_path / "model")
    base = str(tmp_path / "serving" / "deepseek")
    versions = [model_gate.push_atomically(model, base)[1] for _ in range(4)]
    assert versions == sorted(set(versions))  # strictly increasing, even within one second
    assert sorted(os.listdir(base)) == sorted(str(v) for v in versions)  # the push itself deletes nothing
    for v in versions:
        assert sorted(os.listdir(os.path.join(base, str(v)))) == ["saved_model.pb", "variables"]
    assert model_gate.next_version(base, now=0) == versions[-1] + 1
    assert model_gate.next_version(base, now=versions[-1] + 100) == versions[-1] + 100


@pytest.mark.parametrize("base", ["local", "ram://serving/deepseek"])
def test_saved_model_pb_is_copied_last(tmp_path, monkeypatch, base):
    """TF Serving takes saved_model.pb as the sign of a complete model, locally and on object stores (ram://
    is TensorFlow's in-memory filesystem, standing in for gs://: there the model is copied in place)."""
    model = _saved_model(tmp_path / "model", files=5)
    base = str(tmp_path / "serving") if base == "local" else base
    written = []
    real_copy = model_gate.fileio.copy

    def recording_copy(src, dst, overwrite=False):
        written.append(dst)
        real_copy(src, dst, overwrite)

    monkeypatch.setattr(model_gate.fileio, "copy", recording_copy)
    path, version = model_gate.push_atomically(model, base)
    assert len(written) == 6 and os.path.basename(written[-1]) == "saved_model.pb"
    assert all(os.path.basename(w) != "saved_model.pb" for w in written[:-1])
    if "://" in base:
        assert all(w.startswith(f"{base}/{version}/") for w in written)  # in place: no rename on a store
    assert model_gate.fileio.exists(os.path.join(path, "variables", "part-4"))


def test_a_killed_push_leaves_no_temporary_after_the_next_push(tmp_path):
    model = _saved_model(tmp_path / "model")
    base = tmp_path / "serving"
    model_gate.push_atomically(model, str(base))
    killed = base / ".tmp-1000-4242"  # what a push killed mid-copy leaves (an older version number)
    killed.mkdir()
    (killed / "variables").mkdir()
    (killed / "variables" / "part-0").write_bytes(b"half")
    foreign = base / ".tmp-notes"  # not a push's temporary: kept
    foreign.mkdir()
    path, _ = model_gate.push_atomically(model, str(base))
    assert not killed.exists()
    assert foreign.exists()
    assert not [n for n in os.listdir(base) if model_gate._TMP_DIR.fullmatch(n)]
    assert os.path.exists(os.path.join(path, "saved_model.pb"))


def test_a_failed_copy_leaves_no_version_and_no_temporary(tmp_path, monkeypatch):
    model = _saved_model(tmp_path / "model")
    base = tmp_path / "serving"
    real_copy = model_gate.io_utils.copy_dir

    def copy_then_fail(src, dst, **kwargs):  # everything but saved_model.pb is copied, then the copy fails
        real_copy(src, dst, **kwargs)
        raise OSError("disk full")

    monkeypatch.setattr(model_gate.io_utils, "copy_dir", copy_then_fail)
    with pytest.raises(OSError, match="disk full"):
        model_gate.push_atomically(model, str(base))
    assert os.listdir(base) == []


def test_not_a_saved_model_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(model_gate.GateError, match="saved_model.pb is missing"):
        model_gate.push_atomically(str(tmp_path / "empty"), str(tmp_path / "serving"))
    assert not (tmp_path / "serving").exists()


def test_a_polling_server_never_sees_a_partial_version(tmp_path):
    model = _saved_model(tmp_path / "model", files=200, size=20_000)
    base = str(tmp_path / "serving")
    os.makedirs(base)
    seen, partial, errors, stop = set(), [], [], threading.Event()

    def poll():  # what TF Serving's file system poller does: list numeric dirs and load them
        try:
            while not stop.is_set():
                # listed independently of the code under test: every all-digit name is a version to TF Serving
                for name in (n for n in os.listdir(base) if n.isdigit()):
                    files = os.listdir(os.path.join(base, name, "variables"))
                    seen.add(int(name))
                    if len(files) != 200 or not os.path.exists(os.path.join(base, name, "saved_model.pb")):
                        partial.append((name, len(files)))
        except Exception as e:  # recorded and asserted below, not lost with the thread
            errors.append(repr(e))

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        pushed = [model_gate.push_atomically(model, base)[1] for _ in range(3)]
    finally:
        stop.set()
        poller.join()
    assert errors == []  # e.g. a listing that saw a version directory without variables/ yet
    assert partial == []
    assert seen and seen <= set(pushed)


def test_retention_after_pushes_deletes_only_versions_this_pipeline_pushed_never_foreign_or_pinned(tmp_path):
    from deepseek_tfx.pipeline.local_runner import retain_pushed_versions
    from tests.mlmd_fakes import Lineage

    lineage, base = Lineage(), str(tmp_path / "serving" / "deepseek")
    model = _saved_model(tmp_path / "model")

    def push(to):  # a push, recorded in ML Metadata as the Pusher records it
        path, version = model_gate.push_atomically(model, to)
        lineage.artifact(standard_artifacts.PushedModel, pushed=1, pushed_version=str(version),
                         pushed_destination=path)
        return version

    ours = [push(base) for _ in range(3)]
    foreign = str(ours[0] - 1)  # an operator's rollback copy, older than every push: no PushedModel records it
    os.makedirs(os.path.join(base, foreign))
    other = str(tmp_path / "other" / "deepseek")
    theirs = push(other)  # another pipeline's push, elsewhere
    lineage.artifact(standard_artifacts.PushedModel, pushed=0, pushed_version="", pushed_destination="")
    ours += [push(base) for _ in range(2)]

    assert retain_pushed_versions(lineage.store, base, keep=2, pinned=ours[1]) == [ours[0], ours[2]]
    assert sorted(os.listdir(base)) == sorted([foreign, str(ours[1]), str(ours[3]), str(ours[4])])
    assert os.listdir(other) == [str(theirs)]
    assert retain_pushed_versions(lineage.store, base, keep=2, pinned=ours[1]) == []  # idempotent
    assert retain_pushed_versions(lineage.store, base, keep=0) == []  # 0 keeps all
    assert retain_pushed_versions(lineage.store, base, keep=1) == [ours[1], ours[3]]  # the pin lifted
    assert sorted(os.listdir(base)) == sorted([foreign, str(ours[4])])


def test_runtime_bounds_replace_the_compiled_ones_and_zero_keeps_them():
    config = eval_config(PipelineConfig(preset="tiny", max_bits_per_byte=4.0))  # no perplexity bound
    changed = model_gate.with_upper_bounds(config, {"BitsPerByte": 2.5, "Perplexity": 80.0})
    bounds = {m.class_name: m.threshold.value_threshold.upper_bound.value
              for spec in changed.metrics_specs for m in spec.metrics if m.threshold.HasField("value_threshold")}
    assert bounds == {"BitsPerByte": 2.5, "Perplexity": 80.0}
    assert _change_thresholds(changed) == {"Perplexity", "BitsPerByte"}  # the gate against the baseline stays
    assert model_gate.runtime_bounds({"max_bits_per_byte": 0.0, "max_perplexity": 80.0}) == {"Perplexity": 80.0}
    assert model_gate.runtime_bounds({"max_bits_per_byte": None, "eval_config": "{}"}) == {}
    with pytest.raises(model_gate.GateError, match="computes no Accuracy"):
        model_gate.with_upper_bounds(config, {"Accuracy": 0.5})
