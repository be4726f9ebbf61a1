import pytest

from deepseek_tfx.pipeline.config import PipelineConfig
from deepseek_tfx.trainer_module.config import PRESETS, ConfigError, ModelConfig, TrainConfig, get_preset


def test_presets_are_valid_and_round_trip():
    for name, preset in PRESETS.items():
        assert ModelConfig.from_dict(preset.model.to_dict()) == preset.model, name
        assert TrainConfig.from_dict(preset.train.to_dict()) == preset.train, name


@pytest.mark.parametrize("field,value", [
    ("d_model", 0), ("qk_rope_head_dim", 3), ("n_dense_layers", 9), ("n_activated_experts", 99),
])
def test_model_config_errors_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"ModelConfig.{field}"):
        ModelConfig(**{field: value})


@pytest.mark.parametrize("field,value", [("precision", "float8"), ("train_steps", 0), ("learning_rate", -1.0)])
def test_train_config_errors_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"TrainConfig.{field}"):
        TrainConfig(**{field: value})


def test_unknown_fields_and_presets_are_rejected():
    with pytest.raises(ConfigError, match="unknown field"):
        ModelConfig.from_dict({"d_modle": 3})
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        get_preset("huge")


def test_pipeline_config_validation_and_trainer_config():
    with pytest.raises(ConfigError, match="PipelineConfig.eval_fraction"):
        PipelineConfig(eval_fraction=1.0)
    with pytest.raises(ConfigError, match="unknown preset"):
        PipelineConfig(preset="nope")
    config = PipelineConfig(preset="tiny", train_steps=7)
    assert config.resolved_train_steps == 7
    custom = config.trainer_custom_config()
    assert ModelConfig.from_dict(custom["model"]) == get_preset("tiny").model
