"""One source of configuration: the dataclasses' defaults, then a preset, a file and ``--set`` assignments.

A config file (YAML or JSON) has up to six sections, each a mapping of one dataclass's fields:

    pipeline:   PipelineConfig   (data, gate, retention; ``preset`` picks the model and training recipe)
    model:      ModelConfig      (changes to the preset's model)
    train:      TrainConfig      (changes to the preset's training recipe)
    tokenizer:  TokenizerConfig
    serving:    ServingConfig    (the exported signatures' request limits)
    data_checks: DataChecksConfig (what stops a bad new span before training)
    tune:       TuneConfig       (TFX's Tuner: off unless tune.enabled; the search space)

``--set SECTION.FIELD=VALUE`` changes one field after the file. Values are parsed by the field's type
(``1e-3`` for a float, ``true``/``false`` for a bool, ``none`` for an optional field); an unknown section or
field, or a value of the wrong type, is a ConfigError naming it. The defaults live only in the dataclasses:
nothing here restates one, and the help texts are the fields' docstrings (``field_docs``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import os
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from deepseek_tfx.pipeline.config import DataChecksConfig, PipelineConfig
from deepseek_tfx.trainer_module.config import (
    ConfigError,
    ModelConfig,
    ServingConfig,
    TokenizerConfig,
    TrainConfig,
    TuneConfig,
    get_preset,
)

SECTIONS: dict[str, type] = {"pipeline": PipelineConfig, "model": ModelConfig, "train": TrainConfig,
                             "tokenizer": TokenizerConfig, "serving": ServingConfig,
                             "data_checks": DataChecksConfig, "tune": TuneConfig}
# PipelineConfig fields with sections of their own:
_NESTED = {"model", "train", "tokenizer", "serving", "data_checks", "tune"}


def fields(section: str) -> dict[str, dataclasses.Field]:
    """The settable fields of ``section``, by name."""
    return {f.name: f for f in dataclasses.fields(SECTIONS[section])
            if not (section == "pipeline" and f.name in _NESTED)}


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under it in the class body), by field name.

    Cached: the command line asks for every flag of every command, and parsing a class's source each time
    cost about 0.4 s of start-up (BENCHMARKS.md, "Command-line start-up").
    """
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, following in zip(body, body[1:], strict=False):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def default(section: str, name: str) -> Any:
    """The dataclass default of ``section.name`` (the model and train defaults are the preset's)."""
    field = fields(section)[name]
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()  # type: ignore[misc]


def parse_value(section: str, name: str, text: Any) -> Any:
    """``text`` (a string from the command line, or a value from a file) as the type of ``section.name``."""
    known = fields(section)
    if name not in known:
        raise ConfigError(f"{section}.{name}: unknown field; {section} has {', '.join(sorted(known))}")
    kind = str(known[name].type).replace(" ", "")
    optional = kind.endswith("|None")
    kind = kind.removesuffix("|None")
    where = f"{section}.{name}"
    expected = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string",
                "bool|str": "true, false or auto"}.get(kind, kind)
    if isinstance(text, str) and optional and text.strip().lower() in ("none", "null", ""):
        return None
    if text is None:
        if optional:
            return None
        raise ConfigError(f"{where}: must be {expected}, got null")
    try:
        if kind == "bool|str" and str(text).strip().lower() == "auto":  # true / false / auto (jit_compile)
            return "auto"
        if kind in ("bool", "bool|str"):
            if isinstance(text, bool):
                return text
            if str(text).strip().lower() in ("true", "yes", "1", "on"):
                return True
            if str(text).strip().lower() in ("false", "no", "0", "off"):
                return False
            raise ValueError(text)
        if kind == "int":
            if isinstance(text, bool) or (isinstance(text, float) and not text.is_integer()):
                raise ValueError(text)
            return int(text)
        if kind == "float":
            if isinstance(text, bool):
                raise ValueError(text)
            return float(text)
        if kind == "str":
            if not isinstance(text, str | int | float) or isinstance(text, bool):
                raise ValueError(text)
            return str(text)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: must be {expected}{' or none' if optional else ''}, got {text!r}") from None
    raise ConfigError(f"{where}: fields of type {kind} cannot be set")  # none today; a new field type must be added


def read_file(path: str) -> dict[str, dict[str, Any]]:
    """The sections of a YAML or JSON config file, each value parsed by its field's type."""
    if not os.path.exists(path):
        raise ConfigError(f"config file {path}: no such file")
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f)  # JSON is YAML
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {path}: not valid YAML or JSON: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"config file {path}: must be a mapping of sections ({', '.join(SECTIONS)})")
    sections: dict[str, dict[str, Any]] = {}
    for section, values in data.items():
        if section not in SECTIONS:
            raise ConfigError(f"config file {path}: unknown section {section!r}; sections are {', '.join(SECTIONS)}")
        if not isinstance(values, Mapping):
            raise ConfigError(f"config file {path}: section {section} must be a mapping of fields")
        try:
            sections[section] = {name: parse_value(section, name, value) for name, value in values.items()}
        except ConfigError as e:
            raise ConfigError(f"config file {path}: {e}") from None
    return sections


def apply_set(sections: dict[str, dict[str, Any]], assignment: str) -> None:
    """Applies ``SECTION.FIELD=VALUE`` to ``sections``."""
    key, sep, value = assignment.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot:
        raise ConfigError(f"--set {assignment!r}: expected SECTION.FIELD=VALUE, e.g. train.learning_rate=1e-3")
    if section not in SECTIONS:
        raise ConfigError(f"--set {assignment!r}: unknown section {section!r}; sections are {', '.join(SECTIONS)}")
    sections.setdefault(section, {})[name] = parse_value(section, name, value.strip())


def build(sections: Mapping[str, Mapping[str, Any]]) -> PipelineConfig:
    """The PipelineConfig of ``sections``: the preset's model and recipe with the model/train changes applied."""
    pipeline = dict(sections.get("pipeline", {}))
    preset = get_preset(pipeline.get("preset", default("pipeline", "preset")))
    nested: dict[str, Any] = {}
    if sections.get("model"):
        nested["model"] = ModelConfig.from_dict({**preset.model.to_dict(), **sections["model"]})
    if sections.get("train"):
        nested["train"] = TrainConfig.from_dict({**preset.train.to_dict(), **sections["train"]})
    if sections.get("tokenizer"):
        nested["tokenizer"] = TokenizerConfig(**sections["tokenizer"])
    if sections.get("serving"):
        nested["serving"] = ServingConfig.from_dict(sections["serving"])
    if sections.get("data_checks"):
        nested["data_checks"] = DataChecksConfig.from_dict(sections["data_checks"])
    if sections.get("tune"):
        nested["tune"] = TuneConfig.from_dict(sections["tune"])
    return PipelineConfig(**pipeline, **nested)


def load(files: Iterable[str] = (), assignments: Iterable[str] = ()) -> PipelineConfig:
    """Defaults, then each file in order, then each ``--set`` assignment in order."""
    sections: dict[str, dict[str, Any]] = {}
    for path in files:
        for section, values in read_file(path).items():
            sections.setdefault(section, {}).update(values)
    for assignment in assignments:
        apply_set(sections, assignment)
    return build(sections)


def effective(config: PipelineConfig) -> dict[str, dict[str, Any]]:
    """Every field of every section as ``config`` resolves it (the preset's model and recipe included)."""
    pipeline = {name: getattr(config, name) for name in fields("pipeline")}
    return {"pipeline": pipeline, "model": config.resolved_model.to_dict(), "train": config.resolved_train.to_dict(),
            "tokenizer": config.tokenizer.to_dict(), "serving": config.serving.to_dict(),
            "data_checks": config.data_checks.to_dict(), "tune": config.tune.to_dict()}


def changes(config: PipelineConfig) -> list[str]:
    """``section.field=value`` for each field that differs from its default (model/train: from the preset's)."""
    preset = get_preset(config.preset)
    baseline = {"pipeline": {name: default("pipeline", name) for name in fields("pipeline")},
                "model": preset.model.to_dict(), "train": preset.train.to_dict(),
                "tokenizer": TokenizerConfig().to_dict(), "serving": ServingConfig().to_dict(),
                "data_checks": DataChecksConfig().to_dict(), "tune": TuneConfig().to_dict()}
    return [f"{section}.{name}={json.dumps(value)}"
            for section, values in effective(config).items() for name, value in values.items()
            if value != baseline[section][name]]


def show(config: PipelineConfig) -> str:
    """The effective config as YAML, each field with its docstring as a comment (``config show``)."""
    lines = []
    for section, values in effective(config).items():
        docs = field_docs(SECTIONS[section])
        lines.append(f"{section}:")
        for name, value in values.items():
            rendered = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
            lines.append(f"  {name}: {rendered}  # {docs.get(name, '')}".rstrip(" #"))
    return "\n".join(lines) + "\n"


def config_from_env(env: Mapping[str, str]) -> PipelineConfig:
    """The config of the root-level runners, which the tfx CLI starts with no arguments.

    ``DEEPSEEK_TFX_CONFIG`` names a config file (the same file ``--config`` takes);
    ``DEEPSEEK_TFX_PRESET`` and ``DEEPSEEK_TFX_TRAIN_STEPS`` change ``pipeline.preset`` and
    ``pipeline.train_steps`` after it.
    """
    files = [env["DEEPSEEK_TFX_CONFIG"]] if env.get("DEEPSEEK_TFX_CONFIG") else []
    assignments = [f"pipeline.{name}={env[var]}" for var, name in
                   (("DEEPSEEK_TFX_PRESET", "preset"), ("DEEPSEEK_TFX_TRAIN_STEPS", "train_steps")) if env.get(var)]
    try:
        return load(files, assignments)
    except ConfigError as e:
        raise ConfigError(f"{e} (from the DEEPSEEK_TFX_* environment variables)") from None
