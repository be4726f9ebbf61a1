"""Configuration from one source: dataclass defaults, preset, --config files, flags and --set."""

import dataclasses
import json

import pytest

from deepseek_tfx.pipeline import cli, settings
from deepseek_tfx.pipeline.config import PipelineConfig
from deepseek_tfx.trainer_module.config import ConfigError, ModelConfig, ServingConfig, TrainConfig, get_preset


def _config(*argv):
    return cli._config_from_args(cli._build_parser().parse_args(["run", *argv]))


def test_without_options_the_config_is_exactly_the_dataclass_defaults():
    """No flag restates a default: with none given, nothing is set."""
    assert _config() == PipelineConfig()
    assert settings.changes(PipelineConfig()) == []


def test_a_changed_dataclass_default_reaches_the_command_line(monkeypatch):
    names = [f.name for f in dataclasses.fields(PipelineConfig)]
    defaults = list(PipelineConfig.__init__.__defaults__)
    assert len(defaults) == len(names)  # every field has a default, in field order
    for name, value in (("eval_fraction", 0.25), ("keep_versions", 9), ("max_bits_per_byte", 2.5)):
        defaults[names.index(name)] = value
    monkeypatch.setattr(PipelineConfig.__init__, "__defaults__", tuple(defaults))
    config = _config()
    assert (config.eval_fraction, config.keep_versions, config.max_bits_per_byte) == (0.25, 9, 2.5)


def test_every_flag_is_a_shortcut_for_its_field_and_its_help_is_the_field_docstring(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, section, name, _ in cli._CONFIG_FLAGS:
        doc = settings.field_docs(settings.SECTIONS[section])[name]
        assert " ".join(doc.split())[:40] in text, flag
        assert f"--set {section}.{name}=..." in text, flag
    values = {"--preset": "tiny", "--train-steps": "7", "--eval-fraction": "0.2", "--max-bits-per-byte": "3",
              "--max-perplexity": "50", "--regression-tolerance": "0.5", "--bpb-regression-tolerance": "0.1",
              "--keep-versions": "2", "--tokenizer": "byte", "--tokenizer-model": "unigram", "--vocab-size": "300",
              "--tune-trials": "5"}
    for flag, section, name, options in cli._CONFIG_FLAGS:
        argv = [flag] if options.get("action") == "store_true" else [flag, values[flag]]
        via_set = "true" if len(argv) == 1 else values[flag]
        assert _config(*argv) == _config("--set", f"{section}.{name}={via_set}"), flag
        assert _config(*argv) != PipelineConfig(), flag


def test_a_file_then_flags_then_set_each_win_over_the_one_before(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("pipeline:\n  preset: tiny\n  max_bits_per_byte: 3.0\n  keep_versions: 1\n"
                    "train:\n  learning_rate: 1.0e-2\n  batch_size: 4\nmodel:\n  n_layers: 3\n"
                    "tokenizer:\n  kind: byte\nserving:\n  max_new_tokens: 64\n")
    config = _config("--config", str(path), "--keep-versions", "3", "--set", "train.batch_size=2")
    tiny = get_preset("tiny")
    assert config.preset == "tiny" and config.max_bits_per_byte == 3.0
    assert config.keep_versions == 3  # the flag wins over the file
    assert config.resolved_train == tiny.train.replace(learning_rate=1e-2, batch_size=2)  # --set wins over both
    assert config.resolved_model == tiny.model.replace(n_layers=3)  # the preset's model, one field changed
    assert config.tokenizer.kind == "byte" and config.serving == ServingConfig(max_new_tokens=64)
    custom = config.trainer_custom_config()  # what the Trainer receives (and ML Metadata records)
    assert custom["train"]["learning_rate"] == 1e-2 and custom["model"]["n_layers"] == 3
    assert custom["serving"]["max_new_tokens"] == 64
    assert config.resolved_train_steps == tiny.train.train_steps
    assert sorted(settings.changes(config)) == sorted([
        'pipeline.preset="tiny"', "pipeline.max_bits_per_byte=3.0", "pipeline.keep_versions=3",
        "model.n_layers=3", "train.batch_size=2", "train.learning_rate=0.01", 'tokenizer.kind="byte"',
        "serving.max_new_tokens=64"])
    json_path = tmp_path / "config.json"
    json_path.write_text(json.dumps({"train": {"learning_rate": 0.001}, "pipeline": {"max_perplexity": None}}))
    assert _config("--config", str(json_path)).resolved_train.learning_rate == 0.001


@pytest.mark.parametrize(("text", "value"), [("auto", "auto"), ("true", True), ("off", False), ("AUTO", "auto")])
def test_jit_compile_takes_true_false_or_auto(text, value):
    assert settings.load([], [f"train.jit_compile={text}"]).resolved_train.jit_compile == value


@pytest.mark.parametrize(("assignment", "message"), [
    ("train.learning_rate=fast", r"train.learning_rate: must be a number, got 'fast'"),
    ("train.batch_size=2.5", r"train.batch_size: must be an integer, got '2.5'"),
    ("train.jit_compile=maybe", r"train.jit_compile: must be true, false or auto, got 'maybe'"),
    ("train.precision=fp8", r"TrainConfig.precision: must be one of \('auto', 'float32'"),
    ("train.speed=3", r"train.speed: unknown field; train has .*learning_rate"),
    ("optimizer.lr=3", r"unknown section 'optimizer'; sections are pipeline, model, train, tokenizer, serving"),
    ("learning_rate=3", r"expected SECTION.FIELD=VALUE"),
    ("train.learning_rate", r"expected SECTION.FIELD=VALUE"),
    ("train.learning_rate=-1", r"TrainConfig.learning_rate"),
    ("pipeline.keep_versions=-1", r"PipelineConfig.keep_versions: must be >= 0"),
    ("pipeline.preset=deepseek-v3", r"PipelineConfig.preset: deepseek-v3 is a paper-sized preset"),
    ("pipeline.model=x", r"pipeline.model: unknown field"),
])
def test_bad_assignments_name_the_field(assignment, message):
    with pytest.raises(ConfigError, match=message):
        settings.load([], [assignment])


def test_bad_files_name_the_file_and_the_field(tmp_path):
    cases = {"a.yaml": ("train: [1, 2]\n", "section train must be a mapping"),
             "b.yaml": ("trainer:\n  steps: 1\n", "unknown section 'trainer'"),
             "c.yaml": ("model:\n  d_model: wide\n", "model.d_model: must be an integer, got 'wide'"),
             "d.yaml": ("model: {d_model: [\n", "not valid YAML or JSON"),
             "e.yaml": ("- 1\n", "must be a mapping of sections")}
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ConfigError, match=message) as error:
            settings.load([str(tmp_path / name)])
        assert str(error.value).startswith(f"config file {tmp_path / name}: "), name
    with pytest.raises(ConfigError, match="no such file"):
        settings.load([str(tmp_path / "missing.yaml")])


def test_a_bad_config_is_a_usage_error_on_the_command_line(tmp_path, capsys):
    assert cli.main(["run", "--output", str(tmp_path), "--set", "train.learning_rate=fast"]) == cli.EXIT_USAGE
    assert "train.learning_rate: must be a number" in capsys.readouterr().err
    assert not (tmp_path / "pipeline_root").exists()


def test_config_show_prints_every_field_with_its_value_and_docstring(capsys):
    assert cli.main(["config", "show", "--preset", "tiny", "--set", "train.learning_rate=2e-3"]) == 0
    out = capsys.readouterr().out
    shown = {}
    section = None
    for line in out.splitlines():
        if not line.startswith(" "):
            section = line.rstrip(":")
            continue
        name, rest = line.strip().split(": ", 1)
        shown[(section, name)] = rest
    for section in settings.SECTIONS:
        for name in settings.fields(section):
            assert (section, name) in shown, (section, name)
    assert shown[("train", "learning_rate")].startswith("0.002  # Peak learning rate")
    assert shown[("pipeline", "preset")].startswith("tiny  # ")
    assert shown[("model", "d_model")].startswith(f"{get_preset('tiny').model.d_model}  # ")


def test_field_docs_are_the_docstrings_under_the_fields():
    docs = settings.field_docs(TrainConfig)
    assert set(docs) == {f for f in TrainConfig.__dataclass_fields__}
    assert docs["learning_rate"].startswith("Peak learning rate")
    assert set(settings.field_docs(ModelConfig)) == set(ModelConfig.__dataclass_fields__)


def test_the_tfx_cli_runners_read_the_same_file_from_the_environment(tmp_path):
    path = tmp_path / "team.yaml"
    path.write_text("pipeline:\n  preset: tiny\ntrain:\n  warmup_steps: 3\n")
    config = settings.config_from_env({"DEEPSEEK_TFX_CONFIG": str(path), "DEEPSEEK_TFX_TRAIN_STEPS": "9"})
    assert (config.preset, config.train_steps, config.resolved_train.warmup_steps) == ("tiny", 9, 3)
    with pytest.raises(ConfigError, match=r"train_steps: must be an integer or none.*DEEPSEEK_TFX_\* environment"):
        settings.config_from_env({"DEEPSEEK_TFX_TRAIN_STEPS": "many"})


def test_a_compiled_pipeline_takes_the_same_file(tmp_path):
    path = tmp_path / "team.yaml"
    path.write_text("pipeline:\n  preset: tiny\n  max_bits_per_byte: 3.5\ntrain:\n  learning_rate: 4.0e-3\n")
    out = tmp_path / "job.json"
    assert cli.main(["compile", "--engine", "vertex", "--image", "img:1", "--pipeline-root", "gs://b/root",
                     "--corpus", "gs://b/corpus", "--output", str(out), "--config", str(path)]) == 0
    tasks = json.loads(out.read_text())["pipelineSpec"]["root"]["dag"]["tasks"]

    def parameter(task, name):
        return tasks[task]["inputs"]["parameters"][name]["runtimeValue"]["constantValue"]["stringValue"]

    custom = json.loads(parameter("Trainer", "custom_config"))
    assert custom["preset"] == "tiny" and custom["train"]["learning_rate"] == 4e-3
    assert '"upper_bound": 3.5' in parameter("Evaluator", "eval_config")
