"""Plain NumPy MLA and DeepSeekMoE, written from the papers' equations, for parity tests.

MLA: DeepSeek-V2 (arXiv:2405.04434) eqs. 9-19. DeepSeekMoE with sigmoid gating and
bias-for-selection-only: DeepSeek-V3 (arXiv:2412.19437) eqs. 12-16. RoPE pairs
dimension i with i + R/2 (the half-split convention the TF layers document).
"""

import numpy as np


def rms_norm(x, scale, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def yarn_freqs(r, theta, factor, original_len, beta_fast, beta_slow):
    """DeepSeek-V3 inference/model.py ``precompute_freqs_cis``, its frequency part, in NumPy."""
    def correction_dim(num_rotations):
        return r * np.log(original_len / (num_rotations * 2 * np.pi)) / (2 * np.log(theta))

    low = max(int(np.floor(correction_dim(beta_fast))), 0)
    high = min(int(np.ceil(correction_dim(beta_slow))), r - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(r // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    smooth = 1 - ramp
    freqs = 1.0 / (theta ** (np.arange(0, r, 2, dtype=np.float64) / r))
    return freqs / factor * (1 - smooth) + freqs * smooth


def rope(x, positions, theta=10000.0, freqs=None):
    """x [..., T, (H,) R]; rotate pairs (i, i + R/2) by position * theta^(-2i/R) (or by ``freqs``)."""
    r = x.shape[-1]
    inv = theta ** (-np.arange(0, r, 2) / r) if freqs is None else freqs
    ang = positions[:, None] * inv[None, :]  # T, R/2
    if x.ndim == 4:  # B T H R
        ang = ang[:, None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    a, b = x[..., : r // 2], x[..., r // 2:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def mla(x, w, n_heads, nope, rope_dim, v_dim, kv_rank, q_rank, eps=1e-6, freqs=None, mscale=1.0):
    """x [B, T, D]; w: dict of kernels named as in the paper (W_DQ, W_UQ / W_Q, W_DKV, W_UKV, W_O).

    ``freqs``: rotary frequencies (YaRN's), ``mscale``: YaRN's factor on the softmax scale (DeepSeek-V3's MLA
    multiplies the scale by mscale squared).
    """
    b, t, _ = x.shape
    pos = np.arange(t, dtype=np.float64)
    if q_rank:
        c_q = rms_norm(x @ w["W_DQ"], w["q_norm"], eps)  # eq. 12
        q = c_q @ w["W_UQ"]
    else:
        q = x @ w["W_Q"]
    q = q.reshape(b, t, n_heads, nope + rope_dim)
    q_c, q_r = q[..., :nope], rope(q[..., nope:], pos, freqs=freqs)  # eq. 13-14
    kv_a = x @ w["W_DKV"]
    c_kv = rms_norm(kv_a[..., :kv_rank], w["kv_norm"], eps)  # eq. 9, latent with RMSNorm
    k_r = rope(kv_a[..., kv_rank:], pos, freqs=freqs)  # eq. 15: one rotary key shared by all heads
    kv = (c_kv @ w["W_UKV"]).reshape(b, t, n_heads, nope + v_dim)
    k_c, v = kv[..., :nope], kv[..., nope:]  # eq. 10-11
    out = np.zeros((b, t, n_heads, v_dim))
    mask = np.triu(np.full((t, t), -np.inf), k=1)
    for h in range(n_heads):
        scores = (q_c[:, :, h] @ k_c[:, :, h].transpose(0, 2, 1)
                  + q_r[:, :, h] @ k_r.transpose(0, 2, 1)) / np.sqrt(nope + rope_dim) * mscale ** 2  # eq. 18
        out[:, :, h] = softmax(scores + mask) @ v[:, :, h]
    return out.reshape(b, t, n_heads * v_dim) @ w["W_O"]  # eq. 19


def silu(z):
    return z / (1 + np.exp(-z))


def swiglu(x, w1, w3, w2):
    return (silu(x @ w1) * (x @ w3)) @ w2


def deepseek_moe(x, gate, bias, experts, shared, top_k, route_scale=1.0):
    """x [N, D]; experts: list of (w1, w3, w2); shared: (w1, w3, w2) or None."""
    s = 1 / (1 + np.exp(-(x @ gate)))  # eq. 15: sigmoid affinity
    out = np.zeros_like(x)
    for n in range(x.shape[0]):
        chosen = np.argsort(-(s[n] + bias))[:top_k]  # eq. 16: bias only for selection
        g = s[n, chosen] / s[n, chosen].sum() * route_scale  # eq. 13: normalised unbiased weights
        for weight, e in zip(g, chosen, strict=True):
            out[n] += weight * swiglu(x[n:n + 1], *experts[e])[0]
    if shared is not None:
        out += swiglu(x, *shared)
    return out


def gate(x, weight, bias, top_k, score_func="sigmoid", n_groups=1, topk_groups=1, group_score="top2_sum",
         normalize=True, route_scale=1.0):
    """DeepSeek-V3 inference/model.py ``Gate.forward`` in NumPy, one token at a time: (weights, indices).

    The published code picks the group score by whether the gate has a bias (none: max, V2; bias: top-2
    sum, V3) and renormalises for sigmoid only; here both are explicit.
    """
    weights, indices = [], []
    for token in x:
        logits = token @ weight
        if score_func == "softmax":
            scores = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        else:
            scores = 1 / (1 + np.exp(-logits))
        original = scores
        scores = scores + bias
        if n_groups > 1:
            groups = scores.reshape(n_groups, -1)
            group_scores = groups.max(-1) if group_score == "max" else np.sort(groups, -1)[:, -2:].sum(-1)
            keep = np.argsort(-group_scores, kind="stable")[:topk_groups]
            mask = np.ones(n_groups, bool)
            mask[keep] = False
            scores = np.where(np.repeat(mask, groups.shape[1]), -np.inf, scores)
        idx = np.argsort(-scores, kind="stable")[:top_k]
        w = original[idx]
        if normalize:
            w = w / w.sum()
        weights.append(w * route_scale)
        indices.append(idx)
    return np.array(weights), np.array(indices)


def capacity_moe(x, weights, indices, experts, capacity):
    """Routed output of capacity dispatch (GShard / Switch): each expert takes the first ``capacity`` token
    copies in priority order, all first choices before any second choice; later copies are dropped.
    Returns (output [N, D], dropped copy count)."""
    out = np.zeros_like(x)
    taken = np.zeros(len(experts), int)
    dropped = 0
    for k in range(indices.shape[1]):
        for n in range(x.shape[0]):
            e = indices[n, k]
            if taken[e] >= capacity:
                dropped += 1
                continue
            taken[e] += 1
            out[n] += weights[n, k] * swiglu(x[n:n + 1], *experts[e])[0]
    return out, dropped
