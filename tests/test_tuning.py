"""TFX's Tuner in the DAG (trainer_module/tuning.py, components.tokenizer_consumers.TokenizingTuner)."""

import json
import os

import keras_tuner as kt
import pytest

from deepseek_tfx.pipeline import settings
from deepseek_tfx.pipeline.config import PipelineConfig
from deepseek_tfx.trainer_module import trainer, tuning
from deepseek_tfx.trainer_module.config import (
    ConfigError,
    TuneConfig,
    apply_hyperparameters,
    get_preset,
    tuned_values,
)
from tests.test_kubeflow import _compile, _parameter, _spec_of_vertex_job
from tests.test_pipeline_construction import build
from tests.trainer_inputs import fn_args

TINY = get_preset("tiny")


def test_the_search_space_is_optional_per_field_and_checked():
    assert not TuneConfig().enabled  # off by default
    tune = TuneConfig(learning_rate="1e-3:1e-2", warmup_steps="5, 10", d_model="32,64", n_activated_experts="1,2")
    assert tune.search_space() == {"learning_rate": [1e-3, 1e-2], "warmup_steps": [5, 10], "d_model": [32, 64],
                                   "n_activated_experts": [1, 2]}
    hp = tuning.search_space(tune)
    assert {p.name for p in hp.space} == set(tune.search_space())
    for bad, field in (({"learning_rate": "0.01:0.001"}, "learning_rate"), ({"algorithm": "grid"}, "algorithm"),
                       ({"d_model": "64,-8"}, "d_model"), ({"trials": 0}, "trials")):
        with pytest.raises(ConfigError, match=field):
            TuneConfig(**bad)
    with pytest.raises(ConfigError, match="nothing to search"):
        TuneConfig(enabled=True, learning_rate="")
    with pytest.raises(ConfigError, match="not a list of numbers"):
        TuneConfig(warmup_steps="ten")


def test_best_hyperparameters_replace_the_config_fields():
    config = kt.HyperParameters()
    config.Fixed("learning_rate", 0.004)
    config.Fixed("d_model", 96)
    config.Fixed("tuner/epochs", 3)  # KerasTuner's own keys are not config fields
    values = tuned_values(config.get_config())
    assert values == {"d_model": 96, "learning_rate": 0.004}
    model, train = apply_hyperparameters(TINY.model, TINY.train, values)
    assert (model.d_model, train.learning_rate) == (96, 0.004)
    assert model.replace(d_model=TINY.model.d_model) == TINY.model  # nothing else changed
    assert tuned_values(None) is None and tuned_values({"values": {"tuner/trial_id": "1"}}) is None


def test_run_tune_flags_add_the_tuner_before_the_trainer(tmp_path):
    config = settings.load([], ["tune.enabled=true", "tune.trials=4", "tune.d_model=32,64"])
    assert config.tune == TuneConfig(enabled=True, trials=4, d_model="32,64")
    pipeline = build(tmp_path, tune=config.tune)
    nodes = {c.id: c for c in pipeline.components}
    tuner, trainer_node = nodes["Tuner"], nodes["Trainer"]
    assert trainer_node.inputs["hyperparameters"] is tuner.outputs["best_hyperparameters"]
    assert tuner.inputs["examples"] is trainer_node.inputs["examples"]
    assert tuner.inputs["tokenizer"] is trainer_node.inputs["tokenizer"]
    custom = json.loads(tuner.exec_properties["custom_config"])
    assert custom["tune"]["trials"] == 4 and custom["model"]["d_model"] == TINY.model.d_model
    assert "DataChecks" in {n.id for n in tuner.upstream_nodes}  # no tuning on data that failed the checks
    assert "Tuner" not in {c.id for c in build(tmp_path).components}  # off by default


def test_the_tuner_compiles_for_vertex(tmp_path, monkeypatch):
    enabled = PipelineConfig(preset="tiny", train_steps=7, max_bits_per_byte=3.5,
                             tune=TuneConfig(enabled=True, trials=2))
    import deepseek_tfx.pipeline.kubeflow_runner as runner

    real = runner.build_pipeline
    monkeypatch.setattr(runner, "build_pipeline", lambda **kw: real(**{**kw, "config": enabled}))
    spec = _spec_of_vertex_job(_compile(tmp_path, "vertex"))
    assert "Tuner" in spec.root.dag.tasks and "Tuner" in spec.root.dag.tasks["Trainer"].dependent_tasks
    hyper = spec.root.dag.tasks["Trainer"].inputs.artifacts["hyperparameters"].task_output_artifact
    assert (hyper.producer_task, hyper.output_artifact_key) == ("Tuner", "best_hyperparameters")
    assert json.loads(_parameter(spec, "Tuner", "custom_config"))["tune"]["trials"] == 2
    assert _parameter(spec, "Tuner", "tuner_fn") == "deepseek_tfx.trainer_module.tuning.tuner_fn"


@pytest.mark.slow
def test_a_three_trial_search_picks_the_best_trial_and_the_trainer_trains_with_it(trainer_inputs, tmp_path):
    """tuner_fn as TFX's Tuner executor calls it, a 3-trial random search of the learning rate and width on the
    tiny preset, each trial 15 steps of TrainLoop scored by eval bits per byte; then run_fn with the best
    trial's hyperparameters (what the Trainer's ``hyperparameters`` input holds)."""
    tune = TuneConfig(enabled=True, trials=3, steps_per_trial=15, learning_rate="1e-4:3e-2", d_model="32,64")
    train = TINY.train.replace(eval_batches=2)
    custom = {"model": TINY.model.to_dict(), "train": train.to_dict(), "tune": tune.to_dict(), "preset": "tiny"}
    args = fn_args(trainer_inputs, str(tmp_path), 15, custom)
    args.working_dir = str(tmp_path / "work")
    result = tuning.tuner_fn(args)
    result.tuner.search(**result.fit_kwargs)
    trials = [t for t in result.tuner.oracle.trials.values() if t.status == "COMPLETED"]
    assert len(trials) == 3
    scores = {t.trial_id: t.score for t in trials}
    assert len(set(scores.values())) == 3 and all(0 < s < 9 for s in scores.values())  # bits per byte
    best = result.tuner.get_best_hyperparameters()[0]
    best_trial = min(trials, key=lambda t: t.score)
    assert best.values == best_trial.hyperparameters.values

    args.hyperparameters = best.get_config()  # what TFX loads from best_hyperparameters.txt
    trainer.run_fn(args)
    with open(os.path.join(args.model_run_dir, trainer.SUMMARY_FILE)) as f:
        summary = json.load(f)
    assert summary["tuned_hyperparameters"] == {"d_model": best.values["d_model"],
                                                "learning_rate": best.values["learning_rate"]}
    assert summary["model"]["d_model"] == best.values["d_model"]
    assert summary["train"]["learning_rate"] == best.values["learning_rate"]
