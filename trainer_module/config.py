"""Typed configuration for the model and its training, with named presets.

Config travels pipeline -> Trainer ``custom_config`` -> ``from_dict``; nothing in
``trainer_module`` reads environment variables or pipeline constants. Dimension
names follow the DeepSeek-V2 paper (arXiv:2405.04434) and the DeepSeek-V3 report
(arXiv:2412.19437) so the code can be read beside them.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Mapping


SUMMARY_FILE = "training_summary.json"
"""What run_fn writes into the ModelRun directory: steps, tokens/s, MFU, losses and the configs it trained with."""


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""


def require_field(condition: bool, cls_name: str, field: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{cls_name}.{field}: {message}")


def _from_dict(cls, values: Mapping[str, Any]):
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"{cls.__name__}: unknown field(s) {unknown}; known fields are {sorted(known)}"
        )
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape of a DeepSeek-style decoder (or its dense GPT-style baseline)."""

    vocab_size: int = 0
    """Vocabulary size; 0 means "take it from the tokenizer" (derived, never guessed)."""
    d_model: int = 128
    """Model width D (the papers' d)."""
    n_layers: int = 4
    """Number of decoder blocks."""
    n_heads: int = 4
    """Attention heads H (the papers' n_h)."""
    context_len: int = 128
    """Longest sequence T the model is trained on and attends over."""
    q_lora_rank: int = 0
    """Rank of the low-rank query compression d_c'; 0 projects queries directly."""
    kv_lora_rank: int = 64
    """Rank C of the joint key/value compression d_c (the cached latent c_kv)."""
    qk_nope_head_dim: int = 32
    """Per-head query/key dimension without rotary embedding d_h."""
    qk_rope_head_dim: int = 16
    """Per-head decoupled rotary query/key dimension d_h^R (the key part is shared by all heads)."""
    v_head_dim: int = 32
    """Per-head value dimension."""
    inter_dim: int = 384
    """Hidden width of the dense SwiGLU feed-forward (dense layers and the dense baseline)."""
    moe_inter_dim: int = 96
    """Hidden width of one fine-grained expert."""
    n_routed_experts: int = 8
    """Routed experts N_r per MoE layer."""
    n_shared_experts: int = 1
    """Shared experts N_s per MoE layer (always active)."""
    n_activated_experts: int = 2
    """Routed experts K chosen per token (top-k)."""
    n_dense_layers: int = 1
    """The first n_dense_layers blocks use a dense SwiGLU feed-forward instead of MoE."""
    route_scale: float = 1.0
    """Scale applied to the renormalised gate weights of the selected experts."""
    bias_update_speed: float = 0.001
    """Step gamma of the auxiliary-loss-free balancing bias update (DeepSeek-V3, sec. 2.1.2)."""
    seq_aux_loss_weight: float = 0.0
    """alpha of the optional sequence-wise balance loss (DeepSeek-V3 eq. 17-20); 0 turns it off."""
    score_func: str = "sigmoid"
    """Router affinities: sigmoid (DeepSeek-V3) or softmax over the experts (DeepSeek-V2)."""
    normalize_gates: bool = True
    """Renormalise the chosen experts' gate weights to sum to one (V3: yes; V2: no)."""
    n_expert_groups: int = 1
    """Groups of routed experts for group-limited routing (V2: 8, V3: 8); 1 turns it off."""
    n_limited_groups: int = 1
    """Groups a token may route to (V2: 3, V3: 4)."""
    group_score: str = "top2_sum"
    """How a group is scored for group-limited routing: max (V2) or top2_sum (V3)."""
    mtp_depth: int = 0
    """Multi-token prediction modules (DeepSeek-V3 sec. 2.2): 0 (off) or 1 (also predict token t+2)."""
    mtp_loss_weight: float = 0.3
    """lambda: weight of the multi-token prediction loss when mtp_depth is 1."""
    rope_theta: float = 10000.0
    """Base of the rotary embedding frequencies."""
    rope_scaling: str = "none"
    """none, or yarn: YaRN's frequency interpolation and attention temperature for a context_len beyond
    rope_original_context_len (DeepSeek-V2/V3's long-context extension)."""
    rope_factor: float = 40.0
    """YaRN's scale s: how many times longer than the original context (DeepSeek-V3: 40)."""
    rope_original_context_len: int = 4096
    """YaRN: the context the rotary frequencies were first trained for (DeepSeek-V3: 4096)."""
    rope_beta_fast: float = 32.0
    """YaRN: dimensions turning more than this many times over the original context keep their frequency."""
    rope_beta_slow: float = 1.0
    """YaRN: dimensions turning fewer than this many times are interpolated fully."""
    rope_mscale: float = 1.0
    """YaRN: the softmax scale is multiplied by (0.1 * rope_mscale * ln(rope_factor) + 1)^2."""
    norm_eps: float = 1e-6
    """Epsilon of every RMSNorm."""
    dense: bool = False
    """True builds the GPT-style baseline: standard multi-head attention and dense feed-forward."""

    def __post_init__(self):
        name = type(self).__name__
        for field in ("d_model", "n_layers", "n_heads", "context_len", "kv_lora_rank",
                      "qk_nope_head_dim", "v_head_dim", "inter_dim"):
            require_field(getattr(self, field) > 0, name, field, f"must be > 0, got {getattr(self, field)}")
        require_field(self.vocab_size >= 0, name, "vocab_size", f"must be >= 0, got {self.vocab_size}")
        require_field(self.q_lora_rank >= 0, name, "q_lora_rank", f"must be >= 0, got {self.q_lora_rank}")
        require_field(self.qk_rope_head_dim > 0 and self.qk_rope_head_dim % 2 == 0, name,
                      "qk_rope_head_dim", f"must be a positive even number, got {self.qk_rope_head_dim}")
        require_field(0 <= self.n_dense_layers <= self.n_layers, name, "n_dense_layers",
                      f"must be within [0, n_layers={self.n_layers}], got {self.n_dense_layers}")
        require_field(self.mtp_depth in (0, 1), name, "mtp_depth", f"must be 0 or 1, got {self.mtp_depth}")
        require_field(self.seq_aux_loss_weight >= 0, name, "seq_aux_loss_weight",
                      f"must be >= 0, got {self.seq_aux_loss_weight}")
        require_field(self.rope_scaling in ("none", "yarn"), name, "rope_scaling",
                      f"must be none or yarn, got {self.rope_scaling!r}")
        if self.rope_scaling == "yarn":
            require_field(self.rope_factor > 1, name, "rope_factor", f"must be > 1 with YaRN, got {self.rope_factor}")
            require_field(0 < self.rope_original_context_len < self.context_len, name, "rope_original_context_len",
                          f"must be within [1, context_len={self.context_len}) with YaRN (YaRN only changes a "
                          f"context longer than the original), got {self.rope_original_context_len}")
            require_field(self.rope_beta_fast > self.rope_beta_slow > 0, name, "rope_beta_fast",
                          f"must be > rope_beta_slow > 0, got {self.rope_beta_fast} and {self.rope_beta_slow}")
        if not self.dense and self.n_dense_layers < self.n_layers:
            require_field(self.n_routed_experts > 0, name, "n_routed_experts",
                          f"must be > 0 for a MoE model, got {self.n_routed_experts}")
            require_field(0 < self.n_activated_experts <= self.n_routed_experts, name,
                          "n_activated_experts",
                     f"must be within [1, n_routed_experts={self.n_routed_experts}], "
                     f"got {self.n_activated_experts}")
            require_field(self.moe_inter_dim > 0, name, "moe_inter_dim",
                          f"must be > 0, got {self.moe_inter_dim}")
            require_field(self.n_shared_experts >= 0, name, "n_shared_experts",
                          f"must be >= 0, got {self.n_shared_experts}")
            require_field(self.score_func in ("sigmoid", "softmax"), name, "score_func",
                          f"must be sigmoid or softmax, got {self.score_func!r}")
            require_field(self.group_score in ("max", "top2_sum"), name, "group_score",
                          f"must be max or top2_sum, got {self.group_score!r}")
            groups = self.n_expert_groups
            require_field(groups > 0 and self.n_routed_experts % groups == 0, name, "n_expert_groups",
                          f"must be > 0 and divide n_routed_experts={self.n_routed_experts}, got {groups}")
            require_field(0 < self.n_limited_groups <= groups, name, "n_limited_groups",
                          f"must be within [1, n_expert_groups={groups}], got {self.n_limited_groups}")
            require_field(groups == 1 or self.n_limited_groups * self.n_routed_experts // groups
                          >= self.n_activated_experts, name, "n_limited_groups",
                          f"{self.n_limited_groups} groups of {self.n_routed_experts // groups} experts cannot "
                          f"hold n_activated_experts={self.n_activated_experts}")
            require_field(groups == 1 or self.group_score == "max" or self.n_routed_experts // groups >= 2,
                          name, "group_score", "top2_sum needs at least 2 experts per group")

    @property
    def uses_moe(self) -> bool:
        return not self.dense and self.n_dense_layers < self.n_layers

    def yarn(self) -> dict[str, Any] | None:
        """YaRN's settings for the attention layers, or None when rope_scaling is none."""
        if self.rope_scaling != "yarn":
            return None
        return {"factor": self.rope_factor, "original_context_len": self.rope_original_context_len,
                "beta_fast": self.rope_beta_fast, "beta_slow": self.rope_beta_slow, "mscale": self.rope_mscale}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelConfig:
        return _from_dict(cls, values)

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)


PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")
SET_IN_CONFIG = "set in the config"
"""trainer_module.autotune's reason when neither precision nor jit_compile is auto."""
MOE_DISPATCHES = ("auto", "dropless", "capacity")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How the Trainer optimises the model."""

    train_steps: int = 300
    """Optimizer steps."""
    batch_size: int = 16
    """Global batch size in sequences (split across replicas)."""
    learning_rate: float = 3e-3
    """Peak learning rate, reached after warmup."""
    min_learning_rate_ratio: float = 0.1
    """Cosine decay ends at learning_rate * min_learning_rate_ratio."""
    warmup_steps: int = 30
    """Linear warmup steps."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay, applied to matrices only."""
    grad_clip_norm: float = 1.0
    """Global-norm gradient clipping; 0 disables it."""
    precision: str = "auto"
    """auto (decided from the device at start-up: trainer_module.autotune), float32, mixed_bfloat16 or
    mixed_float16."""
    seed: int = 1234
    """Seed for weight init, shuffling and sampling."""
    shuffle_buffer: int = 2048
    """Blocks held in the shuffle buffer."""
    log_every: int = 25
    """Log a progress line every this many steps."""
    eval_batches: int = 8
    """Batches of the eval split scored for the eval loss curve (the Evaluator scores all of it)."""
    eval_every: int = 50
    """Also score the eval batches every this many steps, for the eval loss curve; 0: only at the end."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; each is batch_size / grad_accum_steps sequences."""
    jit_compile: bool | str = "auto"
    """Compile the train step's loss and gradients with XLA: true, false or auto (decided from the device at
    start-up, like precision). A compiled MoE model uses capacity dispatch."""
    moe_dispatch: str = "auto"
    """How routed experts get their tokens in training: dropless (sorted, exact, data-dependent shapes),
    capacity (static shapes, drops copies over capacity; what XLA needs) or auto (capacity when the step is
    compiled, dropless otherwise). Evaluation and serving always run dropless."""
    moe_capacity_factor: float = 1.25
    """Capacity dispatch: each expert takes at most ceil(factor * tokens * K / E) token copies."""
    recompute_attention: bool = False
    """Recompute each block's attention in the backward pass instead of keeping its activations."""
    checkpoint_every: int = 50
    """Save a checkpoint every this many steps (and always at the end); 0: only at the end."""
    keep_checkpoints: int = 3
    """Checkpoints kept on disk (the newest)."""
    max_train_seconds: float = 0.0
    """Stop training after this much wall-clock time, before train_steps if need be; 0: no limit.
    Single-worker runs only (the Trainer refuses it under MultiWorkerMirroredStrategy)."""

    def __post_init__(self):
        name = type(self).__name__
        for field in ("train_steps", "batch_size", "log_every"):
            require_field(getattr(self, field) > 0, name, field, f"must be > 0, got {getattr(self, field)}")
        require_field(self.learning_rate > 0, name, "learning_rate", f"must be > 0, got {self.learning_rate}")
        require_field(0 <= self.min_learning_rate_ratio <= 1, name, "min_learning_rate_ratio",
                      f"must be within [0, 1], got {self.min_learning_rate_ratio}")
        require_field(self.warmup_steps >= 0, name, "warmup_steps", f"must be >= 0, got {self.warmup_steps}")
        require_field(self.weight_decay >= 0, name, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        require_field(self.grad_clip_norm >= 0, name, "grad_clip_norm",
                      f"must be >= 0, got {self.grad_clip_norm}")
        require_field(self.precision in PRECISIONS, name, "precision",
                      f"must be one of {PRECISIONS}, got {self.precision!r}")
        require_field(self.jit_compile in (True, False, "auto"), name, "jit_compile",
                      f"must be true, false or auto, got {self.jit_compile!r}")
        require_field(self.moe_dispatch in MOE_DISPATCHES, name, "moe_dispatch",
                      f"must be one of {MOE_DISPATCHES}, got {self.moe_dispatch!r}")
        require_field(self.moe_capacity_factor > 0, name, "moe_capacity_factor",
                      f"must be > 0, got {self.moe_capacity_factor}")
        require_field(self.shuffle_buffer > 0, name, "shuffle_buffer",
                      f"must be > 0, got {self.shuffle_buffer}")
        require_field(self.eval_batches >= 0, name, "eval_batches",
                      f"must be >= 0, got {self.eval_batches}")
        for field in ("eval_every", "checkpoint_every"):
            require_field(getattr(self, field) >= 0, name, field, f"must be >= 0, got {getattr(self, field)}")
        require_field(self.grad_accum_steps > 0 and self.batch_size % self.grad_accum_steps == 0, name,
                      "grad_accum_steps", f"must be > 0 and divide batch_size ({self.batch_size}), "
                      f"got {self.grad_accum_steps}")
        require_field(self.keep_checkpoints > 0, name, "keep_checkpoints",
                      f"must be > 0, got {self.keep_checkpoints}")
        require_field(self.max_train_seconds >= 0, name, "max_train_seconds",
                      f"must be >= 0, got {self.max_train_seconds}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        return _from_dict(cls, values)

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)


TUNE_ALGORITHMS = ("random", "bayesian", "hyperband")
TUNABLE = {"learning_rate": ("train", float), "warmup_steps": ("train", int), "d_model": ("model", int),
           "n_routed_experts": ("model", int), "n_activated_experts": ("model", int)}
"""Search-space fields of TuneConfig: the config section each value replaces, and its type."""


def _choices(text: str, kind) -> list:
    return [kind(v) for v in text.replace(" ", "").split(",") if v]


@dataclasses.dataclass(frozen=True)
class TuneConfig:
    """The hyperparameter search of TFX's Tuner (trainer_module.tuning), off unless ``enabled``.

    Each search-space field is optional (empty: not searched, the preset's value is used): ``learning_rate``
    is a log-uniform range ``MIN:MAX``, the others comma-separated choices.
    """

    enabled: bool = False
    """Run TFX's Tuner before the Trainer; the Trainer then trains with the best trial's values."""
    algorithm: str = "random"
    """KerasTuner oracle: random, bayesian or hyperband."""
    trials: int = 3
    """Trials to run (hyperband: the most models it may train)."""
    steps_per_trial: int = 60
    """Training steps of each trial (hyperband: of its longest trials), scored by eval bits per byte."""
    learning_rate: str = "1e-3:1e-2"
    """Peak learning rate, log-uniform over MIN:MAX; empty: not searched."""
    warmup_steps: str = ""
    """Warmup step choices, e.g. 10,30; empty: not searched."""
    d_model: str = ""
    """Model width choices, e.g. 64,128 (must suit n_heads); empty: not searched."""
    n_routed_experts: str = ""
    """Routed expert choices, e.g. 4,8; empty: not searched."""
    n_activated_experts: str = ""
    """Top-k choices, e.g. 1,2; empty: not searched."""

    def __post_init__(self):
        name = type(self).__name__
        require_field(self.algorithm in TUNE_ALGORITHMS, name, "algorithm",
                      f"must be one of {TUNE_ALGORITHMS}, got {self.algorithm!r}")
        require_field(self.trials >= 1, name, "trials", f"must be >= 1, got {self.trials}")
        require_field(self.steps_per_trial >= 1, name, "steps_per_trial", f"must be >= 1, got {self.steps_per_trial}")
        try:
            space = self.search_space()
        except ValueError as e:
            raise ConfigError(f"{name}: a search-space field is not a list of numbers ({e})") from None
        if "learning_rate" in space:
            low, high = space["learning_rate"]
            require_field(0 < low < high, name, "learning_rate", f"must be MIN:MAX with 0 < MIN < MAX, got "
                          f"{self.learning_rate!r}")
        for field, values in space.items():
            if field != "learning_rate":
                require_field(all(v > 0 for v in values), name, field, f"choices must be > 0, got {values}")
        require_field(not self.enabled or bool(space), name, "enabled", "nothing to search: every search-space "
                      "field is empty")

    def search_space(self) -> dict[str, list]:
        """{field: [min, max] (learning_rate) or choices} of the fields that are searched."""
        space = {}
        if self.learning_rate:
            low, sep, high = self.learning_rate.partition(":")
            if not sep:
                raise ValueError(f"learning_rate {self.learning_rate!r} is not MIN:MAX")
            space["learning_rate"] = [float(low), float(high)]
        for field in ("warmup_steps", "d_model", "n_routed_experts", "n_activated_experts"):
            if getattr(self, field):
                space[field] = _choices(getattr(self, field), int)
        return space

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TuneConfig:
        return _from_dict(cls, values)


def tuned_values(hyperparameters: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The TUNABLE values of a Tuner's best_hyperparameters (KerasTuner's HyperParameters config, as the Trainer
    receives it in ``fn_args.hyperparameters``, or a plain {name: value}); None when there are none."""
    if not hyperparameters:
        return None
    values = hyperparameters.get("values", hyperparameters)
    return {k: values[k] for k in sorted(values) if k in TUNABLE} or None


def apply_hyperparameters(model: ModelConfig, train: TrainConfig, values: Mapping[str, Any]
                          ) -> tuple[ModelConfig, TrainConfig]:
    """The configs with the searched values (TUNABLE fields of ``values``; others, like KerasTuner's own
    ``tuner/*`` keys, are ignored)."""
    changes: dict[str, dict[str, Any]] = {"model": {}, "train": {}}
    for key, value in values.items():
        if key in TUNABLE:
            section, kind = TUNABLE[key]
            changes[section][key] = kind(value)
    return model.replace(**changes["model"]), train.replace(**changes["train"])


MIN_SENTENCEPIECE_VOCAB = 4 + 256 + 1
"""4 reserved ids + 256 byte-fallback pieces + at least one learned piece."""


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """The tokenizer TokenizerGen learns from the train split."""

    kind: str = "sentencepiece"
    """sentencepiece (learned subwords, byte fallback) or byte (UTF-8 bytes, nothing learned)."""
    model_type: str = "bpe"
    """SentencePiece algorithm: bpe or unigram."""
    vocab_size: int = 2048
    """Pieces including the 4 reserved ids and 256 byte-fallback pieces; suits ~1 MB corpora."""
    max_sentences: int = 200_000
    """Cap on the lines sampled from the train split to learn from (bounds memory)."""
    seed: int = 1234
    """Seed of the deterministic line sample."""

    def __post_init__(self):
        name = type(self).__name__
        require_field(self.kind in ("sentencepiece", "byte"), name, "kind",
                      f"must be sentencepiece or byte, got {self.kind!r}")
        require_field(self.model_type in ("bpe", "unigram"), name, "model_type",
                      f"must be bpe or unigram, got {self.model_type!r}")
        require_field(self.kind == "byte" or self.vocab_size >= MIN_SENTENCEPIECE_VOCAB, name, "vocab_size",
                      f"must be >= {MIN_SENTENCEPIECE_VOCAB} (4 reserved ids + 256 byte-fallback pieces + "
                      f"1 learned piece), got {self.vocab_size}")
        require_field(self.max_sentences > 0, name, "max_sentences", f"must be > 0, got {self.max_sentences}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ServingConfig:
    """Per-request limits the exported signatures enforce in the graph (memory and time stay bounded).

    A request over a limit is refused with INVALID_ARGUMENT naming the limit; only prompts are cut
    instead (to their last ``max_prompt_bytes`` bytes, at a character boundary, before tokenization).
    """

    max_batch_size: int = 8
    """Most rows in one ``generate`` or ``score`` call; also TF Serving's ``max_batch_size`` in batching.config."""
    max_new_tokens: int = 512
    """Most new tokens one ``generate`` row may ask for."""
    max_text_bytes: int = 1 << 20
    """Most bytes in one ``score`` text or in the ``text`` of one ``serving_default`` example."""
    max_prompt_bytes: int = 1 << 16
    """A longer ``generate`` prompt keeps only its last this-many bytes (generation sees at most the last
    context_len - 1 tokens anyway)."""
    score_chunk_windows: int = 8
    """``score`` runs the model on this many context windows at a time, so peak memory does not grow with
    the text."""

    def __post_init__(self):
        name = type(self).__name__
        for field in ("max_batch_size", "max_new_tokens", "max_text_bytes", "score_chunk_windows"):
            require_field(getattr(self, field) >= 1, name, field, f"must be >= 1, got {getattr(self, field)}")
        require_field(self.max_prompt_bytes >= 4, name, "max_prompt_bytes",
                      f"must be >= 4 (one UTF-8 character), got {self.max_prompt_bytes}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ServingConfig:
        return _from_dict(cls, values)


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named model shape with the training recipe that suits it."""

    model: ModelConfig
    train: TrainConfig
    description: str


PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        model=ModelConfig(
            d_model=64, n_layers=2, n_heads=2, context_len=64, kv_lora_rank=32,
            qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, inter_dim=128,
            moe_inter_dim=32, n_routed_experts=4, n_shared_experts=1, n_activated_experts=2,
            n_dense_layers=1,
        ),
        # Explicit precision and XLA: probing the device would take longer than this preset's training.
        train=TrainConfig(train_steps=30, batch_size=8, warmup_steps=5, log_every=10,
                          eval_batches=2, eval_every=10, precision="float32", jit_compile=False),
        description="2 layers, width 64: for tests; trains in seconds.",
    ),
    "small": Preset(
        model=ModelConfig(),
        train=TrainConfig(),
        description="4 layers, width 128, 8 routed experts: the CPU demo; trains in minutes.",
    ),
    "medium": Preset(
        model=ModelConfig(
            d_model=512, n_layers=12, n_heads=8, context_len=512, kv_lora_rank=256, qk_nope_head_dim=64,
            qk_rope_head_dim=32, v_head_dim=64, inter_dim=1408, moe_inter_dim=288, n_routed_experts=16,
            n_shared_experts=1, n_activated_experts=2, n_dense_layers=1,
        ),
        train=TrainConfig(train_steps=2000, batch_size=32, learning_rate=1e-3, warmup_steps=100, log_every=50,
                          eval_every=200, checkpoint_every=200),
        description="12 layers, width 512, 16 routed experts: 99.9M parameters (30.7M activated) with the "
                    "default 2,048-piece tokenizer; for an accelerator (bench.accelerator_bench).",
    ),
    "deepseek-v2-lite": Preset(
        model=ModelConfig(
            vocab_size=102400, d_model=2048, n_layers=27, n_heads=16, context_len=4096,
            q_lora_rank=0, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
            v_head_dim=128, inter_dim=10944, moe_inter_dim=1408, n_routed_experts=64,
            n_shared_experts=2, n_activated_experts=6, n_dense_layers=1,
            # V2 routing: softmax gate, no top-k renormalisation, an expert-level balance loss (alpha_1
            # 0.001 for Lite) instead of V3's bias.
            score_func="softmax", normalize_gates=False, bias_update_speed=0.0, seq_aux_loss_weight=0.001,
        ),
        train=TrainConfig(batch_size=512, learning_rate=4.2e-4, warmup_steps=2000),
        description="DeepSeek-V2-Lite's shape (15.7B total, 2.4B activated): on paper only.",
    ),
    "deepseek-v2": Preset(
        model=ModelConfig(
            vocab_size=102400, d_model=5120, n_layers=60, n_heads=128, context_len=4096,
            q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
            v_head_dim=128, inter_dim=12288, moe_inter_dim=1536, n_routed_experts=160,
            n_shared_experts=2, n_activated_experts=6, n_dense_layers=1, route_scale=16.0,
            # V2 routing: softmax gate without renormalisation, device-limited to 3 of 8 groups scored by
            # their best expert, an expert-level balance loss (alpha_1 0.003).
            score_func="softmax", normalize_gates=False, n_expert_groups=8, n_limited_groups=3,
            group_score="max", bias_update_speed=0.0, seq_aux_loss_weight=0.003,
        ),
        train=TrainConfig(batch_size=2304, learning_rate=2.4e-4, warmup_steps=2000),
        description="DeepSeek-V2's shape (236B total, 21B activated): on paper only.",
    ),
    "deepseek-v3": Preset(
        model=ModelConfig(
            vocab_size=129280, d_model=7168, n_layers=61, n_heads=128, context_len=4096,
            q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
            v_head_dim=128, inter_dim=18432, moe_inter_dim=2048, n_routed_experts=256,
            n_shared_experts=1, n_activated_experts=8, n_dense_layers=3, route_scale=2.5,
            # V3 routing: sigmoid gate renormalised over the chosen experts, node-limited to 4 of 8 groups
            # scored by their two best biased affinities, bias balancing plus a tiny sequence-wise loss.
            score_func="sigmoid", normalize_gates=True, n_expert_groups=8, n_limited_groups=4,
            group_score="top2_sum", bias_update_speed=0.001, seq_aux_loss_weight=0.0001,
        ),
        train=TrainConfig(batch_size=15360, learning_rate=2.2e-4, warmup_steps=2000),
        description="DeepSeek-V3's shape (671B total, 37B activated, without MTP): on paper only.",
    ),
}

PAPER_PRESETS = ("deepseek-v2-lite", "deepseek-v2", "deepseek-v3")
"""Presets that are only counted, never built: they do not fit this machine."""


def get_preset(name: str) -> Preset:
    """Returns the preset called ``name`` or raises ConfigError listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}") from None
