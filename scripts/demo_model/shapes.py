"""Candidate model shapes (text_config dicts) for the demo checkpoint."""


def text_config(hidden=256, layers=12, inter=None, vocab=8192, interval=4, head_dim=64,
                n_heads=None, n_kv=None, lin_k_heads=None, lin_v_heads=None, lin_dim=64,
                eos_token_id=2, max_pos=4096):
    n_heads = n_heads or max(1, hidden // 64)
    n_kv = n_kv or max(1, n_heads // 2)
    lin_v_heads = lin_v_heads or max(1, hidden // lin_dim)
    lin_k_heads = lin_k_heads or max(1, lin_v_heads // 2)
    inter = inter or hidden * 3
    return {
        "model_type": "qwen3_5_text",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "linear_num_value_heads": lin_v_heads,
        "linear_num_key_heads": lin_k_heads,
        "linear_key_head_dim": lin_dim,
        "linear_value_head_dim": lin_dim,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": interval,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": max_pos,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "layer_types": [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)
        ],
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": _mrope(head_dim),
            "mrope_interleaved": True,
        },
        "mtp_num_hidden_layers": 1,
        "eos_token_id": eos_token_id,
    }


def n_params(tc: dict, with_mtp: bool = True) -> int:
    H, I, L, V = tc["hidden_size"], tc["intermediate_size"], tc["num_hidden_layers"], tc["vocab_size"]
    hd, nh, nkv = tc["head_dim"], tc["num_attention_heads"], tc["num_key_value_heads"]
    kd = tc["linear_key_head_dim"] * tc["linear_num_key_heads"]
    vd = tc["linear_value_head_dim"] * tc["linear_num_value_heads"]
    nv = tc["linear_num_value_heads"]
    mlp = 3 * H * I
    attn = H * (2 * nh * hd) + 2 * H * nkv * hd + nh * hd * H + 2 * hd
    gdn = H * (2 * kd + vd) + H * vd + 2 * H * nv + vd * H + (2 * kd + vd) * 4 + 2 * nv + tc["linear_value_head_dim"]
    tot = V * H + H
    for i in range(L):
        full = (i + 1) % tc["full_attention_interval"] == 0
        tot += mlp + 2 * H + (attn if full else gdn)
    if with_mtp:
        tot += 2 * H * H + 3 * H + mlp + 2 * H + attn
    return tot


def _mrope(head_dim, factor=0.25):
    half = int(head_dim * factor) // 2
    a = (half * 3 + 7) // 8  # proportions like Qwen's [11, 11, 10] of 32
    b = a
    c = half - a - b
    return [a, b, c]
