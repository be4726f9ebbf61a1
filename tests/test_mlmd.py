"""components.mlmd, the one module that queries ML Metadata, on an in-memory store with hand-built lineage."""

from ml_metadata.proto import metadata_store_pb2
from tfx.types import standard_artifacts

from deepseek_tfx.components import mlmd
from deepseek_tfx.components.tokenizer_gen import Tokenizer
from tests.mlmd_fakes import PIPELINE, Lineage

Event, Execution = metadata_store_pb2.Event, metadata_store_pb2.Execution


def _ids(artifacts):
    return [a.id for a in artifacts]


def test_properties_and_spans_read_the_same_from_protos_and_tfx_artifacts():
    w = Lineage()
    examples = w.artifact(standard_artifacts.Examples, span=3, version=2, corpus_bytes=10)
    legacy = w.artifact(standard_artifacts.Examples, span="7")  # older TFX stored the span as a string
    bare = w.artifact(standard_artifacts.Examples)
    proto = w.store.get_artifacts_by_id([examples.id])[0]
    for item in (examples, proto):
        assert mlmd.prop(item, "corpus_bytes") == 10 and mlmd.span(item) == 3 and mlmd.version(item) == 2
        assert mlmd.has_prop(item, "span") and not mlmd.has_prop(item, "missing")
    assert mlmd.prop(examples, "missing", "default") == "default"
    assert mlmd.span(legacy) == 7
    assert mlmd.span(bare) == 0 and mlmd.span(bare, None) is None and mlmd.version(bare) == 0


def test_type_names():
    w = Lineage()
    tokenizer = w.artifact(Tokenizer)
    execution_id = w.execution({}, {"tokenizer": [tokenizer]})
    assert mlmd.artifact_type_name(w.store, tokenizer) == "deepseek_tfx.Tokenizer"
    assert mlmd.artifact_type_name(w.store, w.store.get_artifacts_by_id([tokenizer.id])[0]) == "deepseek_tfx.Tokenizer"
    assert mlmd.execution_type_name(w.store, w.store.get_executions_by_id([execution_id])[0]) == "step"


def test_node_executions_are_the_finished_ones_oldest_first():
    w = Lineage()
    states = [Execution.COMPLETE, Execution.FAILED, Execution.CACHED, Execution.RUNNING, Execution.COMPLETE]
    ids = [w.execution({}, {}, node="Trainer", state=state) for state in states]
    w.execution({}, {}, node="Pusher")
    assert _ids(mlmd.node_executions(w.store, PIPELINE, "Trainer")) == [ids[0], ids[2], ids[4]]
    assert mlmd.node_executions(w.store, PIPELINE, "Evaluator") == []
    assert mlmd.node_executions(w.store, "other-pipeline", "Trainer") == []


def test_declared_events_count_as_inputs_and_outputs():
    """One rule for every caller: TFX's OUTPUT and the Kubeflow V2 launcher's DECLARED_OUTPUT (and inputs)."""
    w = Lineage()
    examples, model, declared = (w.artifact(cls) for cls in (standard_artifacts.Examples, standard_artifacts.Model,
                                                             standard_artifacts.Model))
    plain = w.execution({"examples": [examples]}, {"model": [model]})
    kfp = w.execution({"examples": [examples]}, {"model": [declared]}, output_event=Event.DECLARED_OUTPUT,
                      input_event=Event.DECLARED_INPUT)
    for execution_id, output in ((plain, model), (kfp, declared)):
        assert _ids(mlmd.execution_artifacts(w.store, execution_id)["model"]) == [output.id]
        assert _ids(mlmd.execution_artifacts(w.store, execution_id, outputs=False)["examples"]) == [examples.id]
        assert mlmd.artifact_ids(w.store, execution_id, "examples") == [examples.id]
        assert mlmd.artifact_ids(w.store, execution_id, "model", outputs=True) == [output.id]
        assert mlmd.artifact_ids(w.store, execution_id, "model") == []
        assert mlmd.producer_id(w.store, output.id) == execution_id
        assert mlmd.producer(w.store, output.id).id == execution_id
    assert mlmd.producer_id(w.store, examples.id) is None and mlmd.producer(w.store, examples.id) is None


def test_latest_outputs_are_those_of_the_latest_finished_execution():
    w = Lineage()
    old, new, failed = (w.artifact(standard_artifacts.Model) for _ in range(3))
    w.execution({}, {"model": [old]}, node="Trainer")
    w.execution({}, {"model": [new]}, node="Trainer", state=Execution.CACHED)
    w.execution({}, {"model": [failed]}, node="Trainer", state=Execution.FAILED)
    outputs = mlmd.latest_outputs(w.store, PIPELINE, "Trainer")
    assert _ids(outputs["model"]) == [new.id] and mlmd.single(outputs, "model").id == new.id
    assert mlmd.single(outputs, "model_run") is None
    assert mlmd.latest_outputs(w.store, PIPELINE, "Pusher") == {}


def test_a_runs_outputs_are_its_own_even_when_another_run_finished_later():
    """Two runs sharing a store: the summary of run A reads A's Trainer, not B's later one."""
    w = Lineage()
    mine, theirs = w.artifact(standard_artifacts.Model), w.artifact(standard_artifacts.Model)
    w.execution({}, {"model": [mine]}, node="Trainer", run="run-a", state=Execution.CACHED)
    w.execution({}, {"model": [theirs]}, node="Trainer", run="run-b")
    w.execution({}, {}, node="Pusher", run="run-b")
    assert mlmd.single(mlmd.latest_outputs(w.store, PIPELINE, "Trainer"), "model").id == theirs.id
    assert mlmd.single(mlmd.latest_outputs(w.store, PIPELINE, "Trainer", run_id="run-a"), "model").id == mine.id
    assert mlmd.latest_outputs(w.store, PIPELINE, "Pusher", run_id="run-a") == {}  # run A pushed nothing
    assert mlmd.node_executions(w.store, PIPELINE, "Trainer", run_id="no-such-run") == []


def _pipeline_runs():
    """Two runs of ExampleGen -> Transform -> Trainer -> Pusher; the second trains on the window {1, 2} and
    is pushed; a third model is judged but not pushed."""
    w = Lineage()
    span1, span2 = (w.artifact(standard_artifacts.Examples, span=s) for s in (1, 2))
    w.execution({}, {"examples": [span1]}, node="TextExampleGen")
    w.execution({}, {"examples": [span2]}, node="TextExampleGen")
    models, pushed = [], []
    for window, is_pushed, version in (([span1], True, "100"), ([span2, span1], True, "200"), ([span2], False, "")):
        transformed = w.artifact(standard_artifacts.Examples)
        tokenizer = w.artifact(Tokenizer)
        w.execution({"examples": window, "tokenizer": [tokenizer]}, {"transformed_examples": [transformed]},
                    node="Transform")
        model = w.artifact(standard_artifacts.Model)
        w.execution({"examples": [transformed], "tokenizer": [tokenizer]}, {"model": [model]}, node="Trainer")
        push = w.artifact(standard_artifacts.PushedModel, pushed=int(is_pushed), pushed_version=version,
                          pushed_destination=f"/serving/{version}" if is_pushed else "")
        w.execution({"model": [model]}, {"pushed_model": [push]}, node="Pusher")
        models.append(model)
        pushed.append(push)
    return w, (span1, span2), models, pushed


def test_trained_examples_walk_back_through_transform_oldest_span_first():
    w, (span1, span2), models, _ = _pipeline_runs()
    assert _ids(mlmd.trained_examples(w.store, models[0])) == [span1.id]
    assert _ids(mlmd.trained_examples(w.store, models[1])) == [span1.id, span2.id]
    tokenizers = _ids(mlmd.producer_inputs(w.store, models, "tokenizer"))
    assert len(tokenizers) == 3 and tokenizers == sorted(tokenizers)  # one per training, by id
    assert mlmd.producer_inputs(w.store, [models[0], models[0]], "tokenizer") == mlmd.producer_inputs(
        w.store, [models[0]], "tokenizer")  # each artifact once


def test_pushed_versions_are_the_models_really_pushed_with_their_spans():
    w, (span1, span2), _, pushed = _pipeline_runs()
    assert _ids(mlmd.pushed_models(w.store)) == [pushed[0].id, pushed[1].id]
    assert mlmd.latest_pushed_model(w.store).id == pushed[1].id
    assert mlmd.pushed_versions(w.store) == [
        {"version": "100", "path": "/serving/100", "spans": [1], "examples_uris": [span1.uri]},
        {"version": "200", "path": "/serving/200", "spans": [1, 2], "examples_uris": [span1.uri, span2.uri]}]
    assert mlmd.latest_pushed_model(Lineage().store) is None


def test_ingested_spans_are_read_from_the_example_gen_node():
    w, _, _, _ = _pipeline_runs()
    assert mlmd.ingested_spans(w.store, PIPELINE, "TextExampleGen") == {1, 2}
    assert mlmd.ingested_spans(w.store, PIPELINE, "OtherExampleGen") == set()


def test_after_a_push_only_finished_trainings_lose_their_checkpoints(tmp_path):
    """Checkpoints exist to resume a Trainer that died: a failed execution's stay, a finished one's go."""
    import json

    from ml_metadata.proto import metadata_store_pb2

    from deepseek_tfx.pipeline import local_runner

    w = Lineage()
    directories = {}
    for name, state in (("done", metadata_store_pb2.Execution.COMPLETE),
                        ("cached", metadata_store_pb2.Execution.CACHED),
                        ("died", metadata_store_pb2.Execution.FAILED)):
        run_dir, ckpt = tmp_path / name / "model_run", tmp_path / name / "checkpoints"
        run_dir.mkdir(parents=True)
        ckpt.mkdir()
        (ckpt / "ckpt-10.index").write_text("x")
        (run_dir / "training_summary.json").write_text(json.dumps({"checkpoint_dir": str(ckpt)}))
        model_run = w.artifact(standard_artifacts.ModelRun, uri=str(run_dir))
        w.execution({}, {"model_run": [model_run]}, node="Trainer", state=state)
        directories[name] = ckpt
    assert local_runner.remove_finished_checkpoints(w.store, PIPELINE) == [str(directories["done"])]
    assert not directories["done"].exists()
    assert directories["cached"].exists() and directories["died"].exists()
    assert local_runner.remove_finished_checkpoints(w.store, PIPELINE) == []  # nothing left to remove
