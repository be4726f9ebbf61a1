"""Keras layers of a DeepSeek-style decoder.

Implements, with the papers' dimension names:
  * RMSNorm (Zhang & Sennrich, 2019).
  * Rotary position embedding, RoPE (Su et al., 2021), in the half-split form.
  * SwiGLU feed-forward (Shazeer, 2020).
  * Multi-head Latent Attention, MLA (DeepSeek-V2, arXiv:2405.04434, sec. 2.1).
  * DeepSeekMoE with shared and fine-grained routed experts, sigmoid affinities and
    auxiliary-loss-free balancing (DeepSeek-V3, arXiv:2412.19437, sec. 2.1.2).
  * Standard multi-head attention, for the dense GPT-style baseline.

Shape letters: B batch, T query time, S key time, D model width, H heads,
E routed experts, K top-k, C latent (compressed KV) rank, R rope dim, N tokens (B*T).

Float32 islands: norms, softmax, router and (in the model) the loss run in
float32 whatever the mixed-precision policy.
"""

from __future__ import annotations

import math

import tensorflow as tf
import tf_keras as keras


def _dense(units: int, name: str, dtype) -> keras.layers.Dense:
    return keras.layers.Dense(
        units,
        use_bias=False,
        kernel_initializer=keras.initializers.RandomNormal(stddev=0.02),
        name=name,
        dtype=dtype,
    )


class RMSNorm(keras.layers.Layer):
    """Root-mean-square layer norm, computed in float32.

    Args:
        epsilon: added to the mean square before the reciprocal square root.

    Example:
        >>> norm = RMSNorm(epsilon=1e-6)
        >>> y = norm(tf.ones([2, 3, 8]))
    """

    def __init__(self, epsilon: float = 1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        # experimental_autocast=False: read as float32 even under a mixed policy.
        self.scale = self.add_weight(name="scale", shape=[input_shape[-1]], initializer="ones",
                                     dtype=tf.float32, experimental_autocast=False)
        super().build(input_shape)

    def call(self, x):
        x32 = tf.cast(x, tf.float32)
        y = x32 * tf.math.rsqrt(tf.reduce_mean(tf.square(x32), axis=-1, keepdims=True) + self.epsilon)
        return tf.cast(y * self.scale, self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}


def yarn_inv_freq(rot_dim: int, theta: float, scaling: dict) -> list[float]:
    """YaRN's rotary frequencies (Peng et al., 2023) as DeepSeek-V3's ``precompute_freqs_cis`` computes them.

    Dimensions that turn fewer than ``beta_slow`` times over the original context are interpolated
    (frequency / factor), those that turn more than ``beta_fast`` times keep theirs, and a linear ramp
    blends the dimensions between.
    """
    factor, original = scaling["factor"], scaling["original_context_len"]

    def correction_dim(rotations):
        return rot_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(correction_dim(scaling["beta_fast"])), 0)
    high = min(math.ceil(correction_dim(scaling["beta_slow"])), rot_dim - 1)
    high = high + 0.001 if low == high else high
    freqs = []
    for i in range(rot_dim // 2):
        base = 1.0 / theta ** (2 * i / rot_dim)
        smooth = 1 - min(max((i - low) / (high - low), 0.0), 1.0)
        freqs.append(base / factor * (1 - smooth) + base * smooth)
    return freqs


def yarn_softmax_scale(scaling: dict | None) -> float:
    """YaRN's attention temperature: the softmax scale is multiplied by mscale^2 (DeepSeek-V3's MLA)."""
    if not scaling:
        return 1.0
    mscale = 0.1 * scaling["mscale"] * math.log(scaling["factor"]) + 1.0
    return mscale * mscale


def rope_angles(positions: tf.Tensor, rot_dim: int, theta: float,
                scaling: dict | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """Returns (cos, sin) of shape positions.shape + [rot_dim // 2], float32; ``scaling``: YaRN's, or None."""
    if scaling:
        inv_freq = tf.constant(yarn_inv_freq(rot_dim, theta, scaling), tf.float32)
    else:
        inv_freq = 1.0 / (theta ** (tf.range(0, rot_dim, 2, dtype=tf.float32) / rot_dim))
    angles = tf.cast(positions, tf.float32)[..., None] * inv_freq
    return tf.cos(angles), tf.sin(angles)


def apply_rope(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor) -> tf.Tensor:
    """Rotates the last dim of x [B, T, ..., R] by angles cos/sin [B or 1, T, R/2].

    Half-split pairing (x_i, x_{i+R/2}); any fixed pairing is equivalent up to a
    permutation of the projection weights.
    """
    while len(cos.shape) < len(x.shape):  # broadcast over the head axis
        cos, sin = cos[..., None, :], sin[..., None, :]
    dtype = x.dtype
    x = tf.cast(x, tf.float32)
    x1, x2 = tf.split(x, 2, axis=-1)
    out = tf.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return tf.cast(out, dtype)


def _attention_bias(t: int, s: int, offset, key_mask) -> tf.Tensor:
    """Additive float32 mask [B or 1, 1, T, S]: query i (at offset+i) sees keys j <= offset+i."""
    q_pos = tf.range(t)[:, None] + offset
    k_pos = tf.range(s)[None, :]
    allowed = (k_pos <= q_pos)[None, None]
    if key_mask is not None:
        allowed = tf.logical_and(allowed, tf.cast(key_mask, tf.bool)[:, None, None, :])
    return tf.where(allowed, 0.0, -1e9)


def _write(cache: tf.Tensor, new: tf.Tensor, position) -> tf.Tensor:
    """cache [B, S, ...] with new [B, 1, ...] written at time ``position``."""
    s = tf.shape(cache)[1]
    at = tf.reshape(tf.one_hot(position, s, dtype=cache.dtype), [1, -1] + [1] * (len(cache.shape) - 2))
    return cache * (1 - at) + new * at


class SwiGLU(keras.layers.Layer):
    """Gated feed-forward w2(silu(w1 x) * w3 x).

    Args:
        hidden_dim: inner width.
        output_dim: output width (the model width D).

    Example:
        >>> ffn = SwiGLU(hidden_dim=256, output_dim=64)
        >>> y = ffn(tf.ones([2, 3, 64]))
    """

    def __init__(self, hidden_dim: int, output_dim: int, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.output_dim = output_dim
        self.w1 = _dense(hidden_dim, "w1", self.dtype_policy)
        self.w3 = _dense(hidden_dim, "w3", self.dtype_policy)
        self.w2 = _dense(output_dim, "w2", self.dtype_policy)

    def call(self, x):
        return self.w2(tf.nn.silu(self.w1(x)) * self.w3(x))

    def get_config(self):
        return {**super().get_config(), "hidden_dim": self.hidden_dim, "output_dim": self.output_dim}


class MultiHeadLatentAttention(keras.layers.Layer):
    """Multi-head Latent Attention (DeepSeek-V2, sec. 2.1).

    Keys and values are rebuilt from a jointly compressed latent c_kv (rank C,
    RMS-normalised), plus a decoupled rotary key k_pe of R dims shared by all
    heads. Only (c_kv, k_pe) needs caching for incremental decoding.

    Args:
        d_model: model width D.
        n_heads: heads H.
        q_lora_rank: rank of the query compression; 0 projects queries directly.
        kv_lora_rank: rank C of the joint KV compression.
        qk_nope_head_dim: per-head query/key dims without RoPE.
        qk_rope_head_dim: per-head rotary dims R.
        v_head_dim: per-head value dims.
        rope_theta: RoPE base.
        norm_eps: RMSNorm epsilon.
        rope_scaling: YaRN's settings (``factor``, ``original_context_len``, ``beta_fast``,
            ``beta_slow``, ``mscale``; ModelConfig.yarn()) or None for plain RoPE.

    Example:
        >>> mla = MultiHeadLatentAttention(64, 2, 0, 32, 16, 8, 16)
        >>> y = mla(tf.random.normal([2, 5, 64]))
    """

    def __init__(self, d_model: int, n_heads: int, q_lora_rank: int, kv_lora_rank: int,
                 qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int,
                 rope_theta: float = 10000.0, norm_eps: float = 1e-6, rope_scaling: dict | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.n_heads = n_heads
        self.q_lora_rank = q_lora_rank
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.rope_theta = rope_theta
        self.norm_eps = norm_eps
        self.rope_scaling = dict(rope_scaling) if rope_scaling else None
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.softmax_scale = yarn_softmax_scale(self.rope_scaling) / math.sqrt(self.qk_head_dim)
        policy = self.dtype_policy
        if q_lora_rank > 0:
            self.wq_a = _dense(q_lora_rank, "wq_a", policy)
            self.q_norm = RMSNorm(norm_eps, name="q_norm", dtype=policy)
            self.wq_b = _dense(n_heads * self.qk_head_dim, "wq_b", policy)
        else:
            self.wq = _dense(n_heads * self.qk_head_dim, "wq", policy)
        self.wkv_a = _dense(kv_lora_rank + qk_rope_head_dim, "wkv_a", policy)
        self.kv_norm = RMSNorm(norm_eps, name="kv_norm", dtype=policy)
        self.wkv_b = _dense(n_heads * (qk_nope_head_dim + v_head_dim), "wkv_b", policy)
        self.wo = _dense(d_model, "wo", policy)

    def _queries(self, x, cos, sin):
        q = self.wq_b(self.q_norm(self.wq_a(x))) if self.q_lora_rank > 0 else self.wq(x)
        q = tf.reshape(q, tf.concat([tf.shape(x)[:2], [self.n_heads, self.qk_head_dim]], 0))  # BTH(d+R)
        q_nope, q_pe = tf.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], axis=-1)
        return q_nope, apply_rope(q_pe, cos, sin)

    def latent(self, x, cos, sin):
        """Returns the cacheable latent: c_kv [B, S, C] (normalised) and k_pe [B, S, R] (rotated)."""
        kv = self.wkv_a(x)
        c_kv, k_pe = tf.split(kv, [self.kv_lora_rank, self.qk_rope_head_dim], axis=-1)
        return self.kv_norm(c_kv), apply_rope(k_pe, cos, sin)

    def attend(self, q_nope, q_pe, c_kv, k_pe, bias):
        """Attention of queries [B, T, H, *] over the latent of S keys with additive bias [*, 1, T, S]."""
        kv = self.wkv_b(c_kv)
        kv = tf.reshape(kv, tf.concat([tf.shape(c_kv)[:2],
                                       [self.n_heads, self.qk_nope_head_dim + self.v_head_dim]], 0))
        k_nope, v = tf.split(kv, [self.qk_nope_head_dim, self.v_head_dim], axis=-1)  # BSH*
        scores = tf.einsum("bthd,bshd->bhts", q_nope, k_nope)
        scores += tf.einsum("bthr,bsr->bhts", q_pe, k_pe)
        scores = tf.cast(scores, tf.float32) * self.softmax_scale + bias
        probs = tf.cast(tf.nn.softmax(scores, axis=-1), v.dtype)
        out = tf.einsum("bhts,bshd->bthd", probs, v)
        out = tf.reshape(out, tf.concat([tf.shape(out)[:2], [self.n_heads * self.v_head_dim]], 0))
        return self.wo(out)

    def call(self, x, key_mask=None):
        return self.prefill(x, key_mask)[0]

    def prefill(self, x, key_mask=None, cache_len=None):
        """Full causal attention over x [B, T, D]; also returns the cache (c_kv, k_pe) padded to cache_len."""
        t = tf.shape(x)[1]
        cos, sin = rope_angles(tf.range(t)[None, :], self.qk_rope_head_dim, self.rope_theta, self.rope_scaling)
        q_nope, q_pe = self._queries(x, cos, sin)
        c_kv, k_pe = self.latent(x, cos, sin)
        out = self.attend(q_nope, q_pe, c_kv, k_pe, _attention_bias(t, t, 0, key_mask))
        if cache_len is not None:
            pad = [[0, 0], [0, cache_len - t], [0, 0]]
            c_kv, k_pe = tf.pad(c_kv, pad), tf.pad(k_pe, pad)
        return out, (c_kv, k_pe)

    def decode(self, x, cache, position, key_mask=None):
        """One new token per row, x [B, 1, D] at ``position``, attending over the cache.

        ``cache`` is (c_kv [B, S, C], k_pe [B, S, R]); the new token's latent is
        written at ``position`` and the updated cache returned. Attention runs in
        the absorbed form: W_UK is folded into the query and W_UV into the output,
        so per-head keys and values are never rebuilt from the cache.
        """
        cos, sin = rope_angles(tf.reshape(position, [1, 1]), self.qk_rope_head_dim, self.rope_theta,
                               self.rope_scaling)
        q_nope, q_pe = self._queries(x, cos, sin)
        c_new, k_new = self.latent(x, cos, sin)
        c_kv = _write(cache[0], c_new, position)
        k_pe = _write(cache[1], k_new, position)
        kernel = tf.cast(self.wkv_b.kernel, x.dtype)
        w = tf.reshape(kernel, [self.kv_lora_rank, self.n_heads, self.qk_nope_head_dim + self.v_head_dim])
        w_uk, w_uv = tf.split(w, [self.qk_nope_head_dim, self.v_head_dim], axis=-1)  # CHd
        q_latent = tf.einsum("bthd,chd->bthc", q_nope, w_uk)
        scores = tf.einsum("bthc,bsc->bhts", q_latent, c_kv) + tf.einsum("bthr,bsr->bhts", q_pe, k_pe)
        s = tf.shape(c_kv)[1]
        bias = _attention_bias(1, s, position, key_mask)
        probs = tf.nn.softmax(tf.cast(scores, tf.float32) * self.softmax_scale + bias, axis=-1)
        out_latent = tf.einsum("bhts,bsc->bthc", tf.cast(probs, c_kv.dtype), c_kv)
        out = tf.einsum("bthc,chd->bthd", out_latent, w_uv)
        out = tf.reshape(out, tf.concat([tf.shape(out)[:2], [self.n_heads * self.v_head_dim]], 0))
        return self.wo(out), (c_kv, k_pe)

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model, "n_heads": self.n_heads, "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank, "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim, "v_head_dim": self.v_head_dim,
            "rope_theta": self.rope_theta, "norm_eps": self.norm_eps, "rope_scaling": self.rope_scaling,
        }


class MultiHeadAttention(keras.layers.Layer):
    """Standard causal multi-head attention with RoPE on the whole head (the dense baseline).

    Args:
        d_model: model width D; head dim is D / H.
        n_heads: heads H.
        rope_theta: RoPE base.
        rope_scaling: YaRN's settings or None (as in MultiHeadLatentAttention).

    Example:
        >>> mha = MultiHeadAttention(64, 4)
        >>> y = mha(tf.random.normal([2, 5, 64]))
    """

    def __init__(self, d_model: int, n_heads: int, rope_theta: float = 10000.0, rope_scaling: dict | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        if d_model % n_heads or (d_model // n_heads) % 2:
            raise ValueError(f"d_model={d_model} must split into n_heads={n_heads} heads of even size")
        self.d_model = d_model
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.rope_theta = rope_theta
        self.rope_scaling = dict(rope_scaling) if rope_scaling else None
        self.wqkv = _dense(3 * d_model, "wqkv", self.dtype_policy)
        self.wo = _dense(d_model, "wo", self.dtype_policy)

    def _qkv(self, x, positions):
        qkv = tf.reshape(self.wqkv(x), tf.concat([tf.shape(x)[:2], [3, self.n_heads, self.head_dim]], 0))
        q, k, v = tf.unstack(qkv, axis=2)  # BTHd each
        cos, sin = rope_angles(positions, self.head_dim, self.rope_theta, self.rope_scaling)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _attend(self, q, k, v, bias):
        scale = yarn_softmax_scale(self.rope_scaling) / math.sqrt(self.head_dim)
        scores = tf.cast(tf.einsum("bthd,bshd->bhts", q, k), tf.float32) * scale
        probs = tf.cast(tf.nn.softmax(scores + bias, -1), v.dtype)
        out = tf.einsum("bhts,bshd->bthd", probs, v)
        return self.wo(tf.reshape(out, tf.concat([tf.shape(q)[:2], [self.d_model]], 0)))

    def call(self, x, key_mask=None):
        return self.prefill(x, key_mask)[0]

    def prefill(self, x, key_mask=None, cache_len=None):
        """Causal attention over x [B, T, D]; also returns the (k, v) cache padded to cache_len."""
        t = tf.shape(x)[1]
        q, k, v = self._qkv(x, tf.range(t)[None, :])
        out = self._attend(q, k, v, _attention_bias(t, t, 0, key_mask))
        if cache_len is not None:
            pad = [[0, 0], [0, cache_len - t], [0, 0], [0, 0]]
            k, v = tf.pad(k, pad), tf.pad(v, pad)
        return out, (k, v)

    def decode(self, x, cache, position, key_mask=None):
        """One new token per row at ``position``; cache is full keys and values [B, S, H, d]."""
        q, k_new, v_new = self._qkv(x, tf.reshape(position, [1, 1]))
        k, v = _write(cache[0], k_new, position), _write(cache[1], v_new, position)
        return self._attend(q, k, v, _attention_bias(1, tf.shape(k)[1], position, key_mask)), (k, v)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "n_heads": self.n_heads,
                "rope_theta": self.rope_theta, "rope_scaling": self.rope_scaling}


SCORE_FUNCS = ("sigmoid", "softmax")
GROUP_SCORES = ("max", "top2_sum")


class DeepSeekMoE(keras.layers.Layer):
    """Shared plus fine-grained routed experts, routed as DeepSeek-V2 and V3 publish it.

    Routing (DeepSeek-V3's ``Gate``): affinities s = sigmoid(u . e_i) (V3) or
    softmax over the experts (V2). Experts are selected by top-K of s + b, where b
    is a non-trainable balancing bias; with ``n_expert_groups`` > 1 only experts in
    the ``n_limited_groups`` best groups may be chosen, a group scored by its best
    biased affinity (``max``, V2) or the sum of its two best (``top2_sum``, V3).
    Gate weights are the unbiased s of the chosen experts, renormalised to sum to
    one when ``normalize_gates`` (V3; V2 does not), times ``route_scale``.

    Balancing: the layer does not change its own state. In training, each call
    leaves ``step_stats`` (the tokens each expert was asked to take, [E], and the
    token copies dropped for capacity); the train step sums them over its
    micro-batches and replicas and calls ``update_balance`` once per optimizer
    step: b_i moves by bias_update_speed toward balance (down for overloaded
    experts, up for underloaded ones). It is not touched by gradients.

    Dispatch, two ways with the same result when nothing is dropped:
      * dropless (``capacity_factor`` None, the default): token copies sorted by
        expert, one matmul per expert on exactly its tokens. No padding, no drop;
        its shapes depend on the routing, so XLA cannot compile it.
      * capacity (GShard / Switch style, ``capacity_factor`` > 0, training only):
        each expert takes at most C = ceil(capacity_factor * N * K / E) token copies
        (first choices fill it before second choices), laid out in a static
        [E, C, D] buffer for one batched matmul; copies over C are dropped (they
        add nothing; the shared expert and the residual still carry the token).

    Args:
        d_model: model width D.
        moe_inter_dim: hidden width of each expert.
        n_routed_experts: routed experts E.
        n_shared_experts: shared experts, fused into one SwiGLU of width
            n_shared_experts * moe_inter_dim.
        n_activated_experts: K experts chosen per token.
        route_scale: scale on the gate weights.
        bias_update_speed: step gamma of the bias update.
        seq_aux_loss_weight: alpha of the optional sequence-wise balance loss (0: off).
        score_func: ``sigmoid`` (V3) or ``softmax`` (V2) affinities.
        normalize_gates: renormalise the chosen experts' gate weights to sum to one.
        n_expert_groups: groups the experts are split into for group-limited routing (1: off).
        n_limited_groups: groups each token may route to.
        group_score: how a group is scored: ``max`` (V2) or ``top2_sum`` (V3).

    Example:
        >>> moe = DeepSeekMoE(64, 32, n_routed_experts=4, n_shared_experts=1, n_activated_experts=2)
        >>> y = moe(tf.random.normal([2, 5, 64]))
    """

    def __init__(self, d_model: int, moe_inter_dim: int, n_routed_experts: int,
                 n_shared_experts: int, n_activated_experts: int, route_scale: float = 1.0,
                 bias_update_speed: float = 0.001, seq_aux_loss_weight: float = 0.0,
                 score_func: str = "sigmoid", normalize_gates: bool = True, n_expert_groups: int = 1,
                 n_limited_groups: int = 1, group_score: str = "top2_sum", **kwargs):
        super().__init__(**kwargs)
        if score_func not in SCORE_FUNCS:
            raise ValueError(f"score_func must be one of {SCORE_FUNCS}, got {score_func!r}")
        if group_score not in GROUP_SCORES:
            raise ValueError(f"group_score must be one of {GROUP_SCORES}, got {group_score!r}")
        if n_routed_experts % n_expert_groups or not 0 < n_limited_groups <= n_expert_groups:
            raise ValueError(f"n_expert_groups={n_expert_groups} must divide n_routed_experts={n_routed_experts} "
                             f"and n_limited_groups={n_limited_groups} must be within [1, n_expert_groups]")
        self.d_model = d_model
        self.moe_inter_dim = moe_inter_dim
        self.n_routed_experts = n_routed_experts
        self.n_shared_experts = n_shared_experts
        self.n_activated_experts = n_activated_experts
        self.route_scale = route_scale
        self.bias_update_speed = bias_update_speed
        self.seq_aux_loss_weight = seq_aux_loss_weight
        self.score_func = score_func
        self.normalize_gates = normalize_gates
        self.n_expert_groups = n_expert_groups
        self.n_limited_groups = n_limited_groups
        self.group_score = group_score
        self.capacity_factor: float | None = None
        """Set by the train loop: None dispatches dropless, a number by capacity (training calls only)."""
        self.all_experts = False
        """Set for a static-shape inference graph (TensorFlow Lite): every expert runs on every token and the
        gates of the unchosen ones are zero. Same result as dropless, E/K times the expert FLOPs."""
        self.step_stats = None
        """(requested load [E] float32, dropped token copies float32) of the last training call."""
        self.shared = (SwiGLU(n_shared_experts * moe_inter_dim, d_model, name="shared_experts",
                              dtype=self.dtype_policy) if n_shared_experts > 0 else None)

    def build(self, input_shape):
        e, d, i = self.n_routed_experts, self.d_model, self.moe_inter_dim
        def init():  # a fresh initializer per weight: a reused unseeded one repeats its values
            return keras.initializers.RandomNormal(stddev=0.02)

        # The router stays float32 under mixed precision.
        self.gate = self.add_weight(name="gate", shape=[d, e], initializer=init(), dtype=tf.float32,
                                    experimental_autocast=False)
        self.expert_bias = self.add_weight(
            name="expert_bias", shape=[e], initializer="zeros", dtype=tf.float32, trainable=False,
            aggregation=tf.VariableAggregation.MEAN, experimental_autocast=False)
        self.expert_load = self.add_weight(
            name="expert_load", shape=[e], initializer="zeros", dtype=tf.float32, trainable=False,
            aggregation=tf.VariableAggregation.MEAN, experimental_autocast=False)
        self.w1 = self.add_weight(name="experts_w1", shape=[e, d, i], initializer=init())
        self.w3 = self.add_weight(name="experts_w3", shape=[e, d, i], initializer=init())
        self.w2 = self.add_weight(name="experts_w2", shape=[e, i, d], initializer=init())
        super().build(input_shape)

    def route(self, x2):
        """Router for tokens x2 [N, D]: returns (expert ids [N, K], gate weights [N, K] float32, scores [N, E])."""
        logits = tf.matmul(tf.cast(x2, tf.float32), self.gate)  # NE
        scores = tf.nn.softmax(logits, axis=-1) if self.score_func == "softmax" else tf.sigmoid(logits)
        biased = scores + self.expert_bias
        g = self.n_expert_groups
        if g > 1:
            grouped = tf.reshape(biased, [-1, g, self.n_routed_experts // g])  # N G E/G
            if self.group_score == "max":
                group_scores = tf.reduce_max(grouped, axis=-1)
            else:
                group_scores = tf.reduce_sum(tf.math.top_k(grouped, k=2).values, axis=-1)
            _, groups = tf.math.top_k(group_scores, k=self.n_limited_groups)  # N, limited groups
            allowed = tf.reduce_sum(tf.one_hot(groups, g), axis=1) > 0  # NG
            allowed = tf.repeat(allowed, self.n_routed_experts // g, axis=1)  # NE
            biased = tf.where(allowed, biased, float("-inf"))
        _, idx = tf.math.top_k(biased, k=self.n_activated_experts)  # NK
        weights = tf.gather(scores, idx, batch_dims=1)
        if self.normalize_gates:
            weights = weights / tf.reduce_sum(weights, axis=-1, keepdims=True)
        return idx, weights * self.route_scale, scores

    def capacity(self, n_tokens):
        """Token copies each expert takes under capacity dispatch: ceil(factor * N * K / E), at most N."""
        e, k = self.n_routed_experts, self.n_activated_experts
        if isinstance(n_tokens, int):
            return max(1, min(n_tokens, math.ceil(self.capacity_factor * n_tokens * k / e)))
        wanted = tf.math.ceil(self.capacity_factor * tf.cast(n_tokens * k, tf.float32) / e)
        return tf.clip_by_value(tf.cast(wanted, tf.int32), 1, n_tokens)

    def _dropless(self, x2, idx, weights, n):
        """Routed output [N, D] and load [E]: each expert's matmul on exactly its token copies."""
        e, k = self.n_routed_experts, self.n_activated_experts
        flat_expert = tf.reshape(idx, [-1])  # (N*K)
        flat_token = tf.repeat(tf.range(n), k)
        flat_weight = tf.reshape(weights, [-1])
        order = tf.argsort(flat_expert, stable=True)
        sorted_token = tf.gather(flat_token, order)
        counts = tf.math.bincount(tf.cast(flat_expert, tf.int32), minlength=e, maxlength=e)
        xs = tf.gather(x2, sorted_token)
        chunks = tf.split(xs, counts, num=e)
        ys = []
        for j in range(e):
            h = tf.nn.silu(tf.matmul(chunks[j], self.w1[j])) * tf.matmul(chunks[j], self.w3[j])
            ys.append(tf.matmul(h, self.w2[j]))
        y = tf.concat(ys, axis=0) * tf.cast(tf.gather(flat_weight, order), x2.dtype)[:, None]
        return tf.math.unsorted_segment_sum(y, sorted_token, n), tf.cast(counts, tf.float32)

    def _capacity_dispatch(self, x2, idx, weights, n):
        """Routed output [N, D], load [E] and dropped copies: static [E, C, D] buffers, copies over C dropped."""
        e, k = self.n_routed_experts, self.n_activated_experts
        cap = self.capacity(n)
        # k-major order: every token's first choice claims a slot before any second choice.
        flat_expert = tf.reshape(tf.transpose(idx), [-1])  # (K*N)
        flat_token = tf.tile(tf.range(n), [k])
        flat_weight = tf.reshape(tf.transpose(weights), [-1])
        onehot = tf.one_hot(flat_expert, e, dtype=tf.int32)  # (K*N) E
        position = tf.reduce_sum(tf.cumsum(onehot, axis=0, exclusive=True) * onehot, axis=1)
        kept = position < cap
        slot = tf.where(kept, flat_expert * cap + position, e * cap)  # a dropped copy goes to a spare row
        xs = tf.math.unsorted_segment_sum(tf.gather(x2, flat_token), slot, e * cap + 1)[:-1]
        xs = tf.reshape(xs, [e, cap, self.d_model])  # E C D
        h = tf.nn.silu(tf.einsum("ecd,edi->eci", xs, self.w1)) * tf.einsum("ecd,edi->eci", xs, self.w3)
        ys = tf.reshape(tf.einsum("eci,eid->ecd", h, self.w2), [e * cap, self.d_model])
        ys = tf.concat([ys, tf.zeros([1, self.d_model], ys.dtype)], axis=0)
        gate = tf.cast(tf.where(kept, flat_weight, 0.0), x2.dtype)
        routed = tf.math.unsorted_segment_sum(tf.gather(ys, slot) * gate[:, None], flat_token, n)
        load = tf.cast(tf.reduce_sum(onehot, axis=0), tf.float32)
        return routed, load, tf.reduce_sum(tf.cast(tf.logical_not(kept), tf.float32))

    def _every_expert(self, x2, idx, weights):
        """Routed output [N, D]: all E experts on all N tokens, combined with gates that are zero off the top-K."""
        gates = tf.reduce_sum(tf.one_hot(idx, self.n_routed_experts) * weights[..., None], axis=1)  # NE
        h = tf.nn.silu(tf.einsum("nd,edi->nei", x2, self.w1)) * tf.einsum("nd,edi->nei", x2, self.w3)
        y = tf.einsum("nei,eid->ned", h, self.w2)
        return tf.einsum("ned,ne->nd", y, tf.cast(gates, y.dtype))

    def call(self, x, training=None):
        shape = tf.shape(x)
        x2 = tf.reshape(x, [-1, self.d_model])  # ND
        n = x2.shape[0] if x2.shape[0] is not None else tf.shape(x2)[0]  # static when known (XLA)
        idx, weights, scores = self.route(x2)
        if self.all_experts and not training:
            routed, load, dropped = self._every_expert(x2, idx, weights), None, None
        elif training and self.capacity_factor:
            routed, load, dropped = self._capacity_dispatch(x2, idx, weights, n)
        else:
            (routed, load), dropped = self._dropless(x2, idx, weights, n), tf.constant(0.0)
        out = routed + self.shared(x2) if self.shared is not None else routed
        if training:
            self.step_stats = (load, dropped)
            if self.seq_aux_loss_weight > 0:
                self.add_loss(self._sequence_balance_loss(idx, scores, shape[0], shape[1]))
        return tf.reshape(out, shape)

    def update_balance(self, load):
        """Once per optimizer step, with the load [E] of the whole step (all micro-batches and replicas)."""
        self.expert_load.assign(load)
        self.expert_bias.assign_add(self.bias_update_speed * tf.sign(tf.reduce_mean(load) - load))

    def _sequence_balance_loss(self, idx, scores, b, t):
        """DeepSeek-V3 eq. 17-20: alpha * sum_i f_i P_i per sequence, averaged over the batch."""
        e, k = self.n_routed_experts, self.n_activated_experts
        chosen = tf.reduce_sum(tf.one_hot(idx, e), axis=1)  # NE
        chosen = tf.reshape(chosen, [b, t, e])
        f = tf.cast(e, tf.float32) / (k * tf.cast(t, tf.float32)) * tf.reduce_sum(chosen, axis=1)
        p = tf.reduce_mean(tf.reshape(scores / tf.reduce_sum(scores, -1, keepdims=True), [b, t, e]), 1)
        return self.seq_aux_loss_weight * tf.reduce_mean(tf.reduce_sum(f * p, axis=-1))

    def get_config(self):
        return {
            **super().get_config(),
            "d_model": self.d_model, "moe_inter_dim": self.moe_inter_dim,
            "n_routed_experts": self.n_routed_experts, "n_shared_experts": self.n_shared_experts,
            "n_activated_experts": self.n_activated_experts, "route_scale": self.route_scale,
            "bias_update_speed": self.bias_update_speed,
            "seq_aux_loss_weight": self.seq_aux_loss_weight, "score_func": self.score_func,
            "normalize_gates": self.normalize_gates, "n_expert_groups": self.n_expert_groups,
            "n_limited_groups": self.n_limited_groups, "group_score": self.group_score,
        }
