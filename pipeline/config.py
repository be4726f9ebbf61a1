"""Typed pipeline configuration: data, evaluation gate, and which model preset to train."""

from __future__ import annotations

import dataclasses
from typing import Any

from deepseek_tfx.trainer_module.config import (
    PAPER_PRESETS,
    PRESETS,
    ConfigError,
    ModelConfig,
    ServingConfig,
    TokenizerConfig,
    TrainConfig,
    TuneConfig,
    get_preset,
    require_field,
)

PIPELINE_NAME = "deepseek-tfx"
MODEL_NAME = "deepseek"

# Node ids of the components that the run summary reads back (ML Metadata contexts "<pipeline>.<node>").
EXAMPLE_GEN = "TextExampleGen"
TRANSFORM = "Transform"
DATA_CHECKS = "DataChecks"
TRAINER = "Trainer"
TUNER = "Tuner"
TFLITE_EXPORTER = "TFLiteExporter"
EVALUATOR = "Evaluator"
PUSHER = "Pusher"
INFRA_VALIDATOR = "InfraValidator"


@dataclasses.dataclass(frozen=True)
class DataChecksConfig:
    """What stops a new span before training (components.data_checks), on Transform's post-transform statistics.

    The document-length and token-count ranges are frozen with the pipeline's schema (``deepseek-tfx schema``);
    the thresholds here apply at every run.
    """

    freeze_schema: bool = True
    """Freeze the schema and the text ranges from the first run whose model is pushed; later runs import them."""
    range_margin: float = 2.0
    """Frozen ranges are the observed document bytes and token counts, widened by this factor each way."""
    max_replacement_share: float | None = 0.01
    """Most U+FFFD characters (invalid UTF-8 that ExampleGen replaced) as a share of all characters; none: no check."""
    max_token_drift: float | None = 0.2
    """Most Jensen-Shannon divergence between the token frequencies of the last blessed model's data and the new
    data (TFDV's drift comparator; measured: 0.003 for more of the same English text, 0.80 for random bytes,
    0.999 for Chinese text); none: no check."""

    def __post_init__(self):
        name = type(self).__name__
        require_field(self.range_margin >= 1.0, name, "range_margin", f"must be >= 1, got {self.range_margin}")
        require_field(self.max_replacement_share is None or 0.0 <= self.max_replacement_share <= 1.0, name,
                      "max_replacement_share", f"must be within [0, 1], got {self.max_replacement_share}")
        require_field(self.max_token_drift is None or 0.0 < self.max_token_drift <= 1.0, name,
                      "max_token_drift", f"must be within (0, 1], got {self.max_token_drift}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DataChecksConfig:
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Everything create_pipeline needs besides paths and the orchestrator."""

    preset: str = "small"
    """Model preset: the model shape and training recipe that model and train change (see trainer_module.config)."""
    model: ModelConfig | None = None
    """The model to train; None takes the preset's."""
    train: TrainConfig | None = None
    """The training recipe; None takes the preset's."""
    train_steps: int | None = None
    """Trainer steps (TFX's TrainArgs); None takes train.train_steps."""
    eval_fraction: float = 0.1
    """Share of documents hashed into the eval split."""
    max_document_chars: int = 4096
    """Longer documents are split into chunks of at most this many characters."""
    text_field: str = "text"
    """Field that holds the text in .jsonl corpora."""
    max_line_bytes: int = 1 << 20
    """Lines are read in pieces of at most this many bytes (memory stays bounded); a longer .jsonl line is an
    error, a longer plain-text paragraph is split as long documents are."""
    max_perplexity: float | None = None
    """Absolute upper bound on eval perplexity for blessing; None: no bound on perplexity."""
    max_bits_per_byte: float | None = 4.0
    """Absolute upper bound on eval bits per byte for blessing (8.0 is a uniform guess over bytes)."""
    regression_tolerance: float = 0.0
    """A candidate may be worse than the last blessed model by at most this much perplexity."""
    bpb_regression_tolerance: float = 0.0
    """The same, in bits per byte: used instead when the two models' tokenizers differ."""
    reference_bpb_tolerance: float | None = 0.05
    """A candidate may be worse than the last blessed model on the reference eval set (the eval split of the
    first blessed run's data, so a bad new span cannot hide forgetting) by at most this many bits per byte;
    none: no reference check. Local runs only (the reference resolver does not compile for Kubeflow / Vertex)."""
    keep_versions: int = 5
    """Versions this pipeline pushed that a local run keeps (it deletes its older pushes; foreign and pinned
    versions always stay); 0 keeps all."""
    model_name: str = MODEL_NAME
    """Name of the model directory under the serving base directory."""
    tokenizer: TokenizerConfig = dataclasses.field(default_factory=TokenizerConfig)
    """What TokenizerGen learns when it learns a tokenizer."""
    serving: ServingConfig = dataclasses.field(default_factory=ServingConfig)
    """Request limits the exported signatures enforce (and TF Serving's batching.config follows)."""
    data_checks: DataChecksConfig = dataclasses.field(default_factory=DataChecksConfig)
    """What stops a bad new span before training."""
    export_tflite: str | None = None
    """Also convert each pushed version to TensorFlow Lite (a TFLiteExporter step after the Pusher): none (off),
    or the quantization: float32, float16 or dynamic-int8."""
    tune: TuneConfig = dataclasses.field(default_factory=TuneConfig)
    """TFX's Tuner before the Trainer (off unless tune.enabled)."""
    retrain_tokenizer: bool = False
    """Learn a new tokenizer even when a blessed model exists (default: reuse the blessed model's)."""
    remove_checkpoints_after_push: bool = True
    """After a push, delete the checkpoints of every Trainer execution that finished (they exported their
    model; a checkpoint is only needed to resume a Trainer that died). False keeps them."""
    warm_start: bool = True
    """Start training from the latest blessed model's weights when it is compatible."""
    last_spans: int = 1
    """Train, learn the tokenizer and evaluate on the last this-many spans (1: the newest span only).
    Local runs only: the span-window resolver does not compile for Kubeflow / Vertex."""

    def __post_init__(self):
        name = type(self).__name__
        get_preset(self.preset)
        trainable = sorted(set(PRESETS) - set(PAPER_PRESETS))
        require_field(self.preset not in PAPER_PRESETS, name, "preset",
                      f"{self.preset} is a paper-sized preset, counted but not built; choose one of {trainable}")
        require_field(self.train_steps is None or self.train_steps > 0, name, "train_steps",
                      f"must be > 0, got {self.train_steps}")
        require_field(0.0 < self.eval_fraction < 1.0, name, "eval_fraction",
                      f"must be within (0, 1), got {self.eval_fraction}")
        require_field(self.max_line_bytes >= 4096, name, "max_line_bytes",
                      f"must be >= 4096, got {self.max_line_bytes}")
        require_field(self.max_document_chars >= 64, name, "max_document_chars",
                      f"must be >= 64, got {self.max_document_chars}")
        require_field(self.max_perplexity is None or self.max_perplexity > 1.0, name, "max_perplexity",
                      f"must be > 1, got {self.max_perplexity}")
        require_field(self.max_bits_per_byte is None or self.max_bits_per_byte > 0, name,
                      "max_bits_per_byte", f"must be > 0, got {self.max_bits_per_byte}")
        require_field(self.regression_tolerance >= 0, name, "regression_tolerance",
                      f"must be >= 0, got {self.regression_tolerance}")
        require_field(self.bpb_regression_tolerance >= 0, name, "bpb_regression_tolerance",
                      f"must be >= 0, got {self.bpb_regression_tolerance}")
        require_field(self.reference_bpb_tolerance is None or self.reference_bpb_tolerance >= 0, name,
                      "reference_bpb_tolerance", f"must be >= 0, got {self.reference_bpb_tolerance}")
        require_field(self.keep_versions >= 0, name, "keep_versions",
                      f"must be >= 0 (0 keeps all), got {self.keep_versions}")
        require_field(self.last_spans >= 1, name, "last_spans", f"must be >= 1, got {self.last_spans}")
        require_field(self.export_tflite in (None, "float32", "float16", "dynamic-int8"), name, "export_tflite",
                      f"must be none, float32, float16 or dynamic-int8, got {self.export_tflite!r}")
        require_field(bool(self.model_name) and "/" not in self.model_name, name, "model_name",
                      f"must be a non-empty directory name, got {self.model_name!r}")

    def trainer_custom_config(self) -> dict[str, Any]:
        """The Trainer's custom_config: the model and train configs, and the serving limits."""
        return {"model": self.resolved_model.to_dict(), "train": self.resolved_train.to_dict(),
                "serving": self.serving.to_dict(), "preset": self.preset}

    @property
    def resolved_model(self) -> ModelConfig:
        return self.model or get_preset(self.preset).model

    @property
    def resolved_train(self) -> TrainConfig:
        return self.train or get_preset(self.preset).train

    @property
    def resolved_train_steps(self) -> int:
        return self.train_steps or self.resolved_train.train_steps

    @property
    def resolved_eval_batches(self) -> int:
        """The Trainer's EvalArgs.num_steps: the recipe's eval batches (0: no sampled eval loss)."""
        return self.resolved_train.eval_batches

    def replace(self, **changes) -> PipelineConfig:
        return dataclasses.replace(self, **changes)


__all__ = ["PipelineConfig", "DataChecksConfig", "ConfigError", "PIPELINE_NAME", "MODEL_NAME", "EXAMPLE_GEN",
           "TRANSFORM", "TRAINER", "TUNER", "TFLITE_EXPORTER", "EVALUATOR", "PUSHER", "INFRA_VALIDATOR"]
