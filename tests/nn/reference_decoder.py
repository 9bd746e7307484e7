#!/usr/bin/env python3
"""Float64 reference forward pass of Hugging Face Llama / Qwen2 / Qwen3 decoders.

An independent oracle for the C++ decoder tests, written from the equations of
transformers' modeling_llama.py / modeling_qwen2.py / modeling_qwen3.py (4.5x).
Needs only PyTorch (no transformers, safetensors or numpy).

Usage:
    reference_decoder.py MODEL_DIR INPUTS.safetensors OUTPUT.safetensors
    reference_decoder.py --self-test

MODEL_DIR holds config.json and model.safetensors (F32, BF16 or F16 weights).
INPUTS holds input_ids (I64 [B, T]) and optionally attention_mask (I64 [B, T],
1 = real token, 0 = padding). OUTPUT receives logits (F32 [B, T, vocab_size]),
computed entirely in float64.
"""

import json
import math
import os
import struct
import sys

import torch

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")

# --------------------------------------------------------------------------
# safetensors, by hand

_ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


def _elem_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


def read_safetensors(path):
    """Returns ({name: tensor}, metadata) from a .safetensors file."""
    if sys.byteorder != "little":
        raise RuntimeError("this reader assumes a little-endian host")
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} runs past end of file")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = memoryview(raw)[8 + n:]
    metadata = header.pop("__metadata__", None) or {}
    out = {}
    for name, info in header.items():
        dt = info["dtype"]
        if dt not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dt}")
        dtype = _ST_DTYPES[dt]
        shape = [int(s) for s in info["shape"]]
        begin, end = (int(x) for x in info["data_offsets"])
        numel = 1
        for s in shape:
            numel *= s
        if end - begin != numel * _elem_size(dtype) or begin < 0 or end > len(data):
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {begin},{end} "
                             f"for {dt} {shape}")
        if numel == 0:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        buf = bytearray(data[begin:end])  # own, writable, aligned copy
        t = torch.frombuffer(buf, dtype=torch.uint8)
        if dtype == torch.bool:
            t = t != 0
        else:
            t = t.view(dtype)
        out[name] = t.reshape(shape).clone()
    return out, metadata


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: tensor} as a .safetensors file (data in sorted-name order)."""
    if sys.byteorder != "little":
        raise RuntimeError("this writer assumes a little-endian host")
    header = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in _ST_NAMES:
            raise ValueError(f"tensor {name}: dtype {t.dtype} not writable")
        nbytes = t.numel() * t.element_size()
        blob = bytearray(nbytes)
        if nbytes:
            src = t.reshape(-1)
            src = src.to(torch.uint8) if t.dtype == torch.bool else src.view(torch.uint8)
            torch.frombuffer(blob, dtype=torch.uint8).copy_(src)
        header[name] = {"dtype": _ST_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        blobs.append(blob)
        offset += nbytes
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)  # pad header so the data is 8-aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for blob in blobs:
            f.write(blob)


# --------------------------------------------------------------------------
# configuration


class Config:
    """The subset of a HF config.json this reference honours (others refused)."""

    def __init__(self, cfg):
        mt = cfg.get("model_type")
        if mt not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {mt!r} not in {SUPPORTED_MODEL_TYPES}")
        self.model_type = mt
        self.hidden_size = int(cfg["hidden_size"])
        self.intermediate_size = int(cfg["intermediate_size"])
        self.num_layers = int(cfg["num_hidden_layers"])
        self.num_heads = int(cfg["num_attention_heads"])
        kv = cfg.get("num_key_value_heads")
        self.num_kv_heads = int(kv) if kv is not None else self.num_heads
        hd = cfg.get("head_dim")
        if hd is None and mt == "qwen3":
            # Qwen3Config's class default is 128, not hidden/heads: be explicit.
            raise ValueError("qwen3 config must give head_dim explicitly")
        self.head_dim = int(hd) if hd is not None else self.hidden_size // self.num_heads
        self.rms_norm_eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.vocab_size = int(cfg["vocab_size"])
        self.tie_word_embeddings = bool(cfg.get("tie_word_embeddings", False))

        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} not supported (only silu)")
        if cfg.get("rope_scaling") is not None:
            raise ValueError(f"rope_scaling {cfg['rope_scaling']!r} not supported")
        theta = cfg.get("rope_theta")
        rp = cfg.get("rope_parameters")  # newer transformers fold rope_theta in here
        if rp is not None:
            if rp.get("rope_type", "default") != "default":
                raise ValueError(f"rope_parameters {rp!r} not supported")
            if theta is None:
                theta = rp.get("rope_theta")
        self.rope_theta = float(theta) if theta is not None else 10000.0
        if cfg.get("use_sliding_window", False):
            raise ValueError("use_sliding_window=true not supported")
        if any(lt != "full_attention" for lt in (cfg.get("layer_types") or [])):
            raise ValueError("only full_attention layer_types supported")

        if mt == "qwen2":
            # Qwen2Attention: bias=True on q/k/v, bias=False on o, regardless of config.
            self.qkv_bias, self.o_bias = True, False
        else:
            ab = bool(cfg.get("attention_bias", False))
            self.qkv_bias, self.o_bias = ab, ab
        # LlamaMLP honours mlp_bias; Qwen2MLP / Qwen3MLP are always bias-free.
        self.mlp_bias = bool(cfg.get("mlp_bias", False)) if mt == "llama" else False
        self.qk_norm = mt == "qwen3"

        if self.num_heads % self.num_kv_heads != 0:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.head_dim % 2 != 0:
            raise ValueError("head_dim must be even for RoPE")


def expected_weight_shapes(c):
    """{name: shape} of every tensor the model must (and may) contain."""
    H, I, D = c.hidden_size, c.intermediate_size, c.head_dim
    shapes = {"model.embed_tokens.weight": (c.vocab_size, H), "model.norm.weight": (H,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, H)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
        shapes[p + "self_attn.q_proj.weight"] = (c.num_heads * D, H)
        shapes[p + "self_attn.k_proj.weight"] = (c.num_kv_heads * D, H)
        shapes[p + "self_attn.v_proj.weight"] = (c.num_kv_heads * D, H)
        shapes[p + "self_attn.o_proj.weight"] = (H, c.num_heads * D)
        if c.qkv_bias:
            shapes[p + "self_attn.q_proj.bias"] = (c.num_heads * D,)
            shapes[p + "self_attn.k_proj.bias"] = (c.num_kv_heads * D,)
            shapes[p + "self_attn.v_proj.bias"] = (c.num_kv_heads * D,)
        if c.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (H,)
        if c.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (D,)
            shapes[p + "self_attn.k_norm.weight"] = (D,)
        shapes[p + "mlp.gate_proj.weight"] = (I, H)
        shapes[p + "mlp.up_proj.weight"] = (I, H)
        shapes[p + "mlp.down_proj.weight"] = (H, I)
        if c.mlp_bias:
            shapes[p + "mlp.gate_proj.bias"] = (I,)
            shapes[p + "mlp.up_proj.bias"] = (I,)
            shapes[p + "mlp.down_proj.bias"] = (H,)
    return shapes


def prepare_weights(c, weights):
    """Checks names/shapes strictly and returns float64 copies."""
    weights = {k: v for k, v in weights.items() if not k.endswith("rotary_emb.inv_freq")}
    if c.tie_word_embeddings and "lm_head.weight" in weights:
        lm = weights.pop("lm_head.weight")
        if not torch.equal(lm, weights.get("model.embed_tokens.weight", lm)):
            raise ValueError("tie_word_embeddings=true but lm_head.weight != embed_tokens")
    shapes = expected_weight_shapes(c)
    missing = sorted(set(shapes) - set(weights))
    unexpected = sorted(set(weights) - set(shapes))
    if missing or unexpected:
        raise ValueError(f"weight names mismatch: missing={missing} unexpected={unexpected}")
    out = {}
    for name, shape in shapes.items():
        w = weights[name]
        if tuple(w.shape) != tuple(shape):
            raise ValueError(f"{name}: shape {tuple(w.shape)}, expected {tuple(shape)}")
        if not w.is_floating_point():
            raise ValueError(f"{name}: dtype {w.dtype} is not floating point")
        out[name] = w.to(torch.float64)
    if c.tie_word_embeddings:
        out["lm_head.weight"] = out["model.embed_tokens.weight"]
    return out


# --------------------------------------------------------------------------
# the forward pass (float64 throughout)


def rms_norm(x, w, eps):
    # HF *RMSNorm: w * (x * rsqrt(mean(x^2, -1) + eps))
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def linear(x, w, b=None):
    y = x @ w.t()
    return y + b if b is not None else y


def rotate_half(x):
    d = x.shape[-1] // 2
    return torch.cat((-x[..., d:], x[..., :d]), dim=-1)


def rope_cos_sin(position_ids, head_dim, theta):
    """cos, sin of shape [B, T, head_dim] (frequencies duplicated, HF layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = position_ids.to(torch.float64)[..., None] * inv_freq  # [B, T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def positions_from_mask(mask):
    # generate(): cumsum(mask) - 1; padding positions are set to 0 here.
    pos = mask.cumsum(-1) - 1
    return pos.masked_fill(mask == 0, 0)


def attention_allowed(mask):
    """[B, 1, T, T] bool: query i may see key j iff j <= i and key j is real.

    Each query additionally always sees itself, so that padding queries (whose
    outputs are don't-care) still have a non-empty softmax row and no NaN;
    for real queries this changes nothing (they see themselves anyway).
    """
    B, T = mask.shape
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    allowed = causal[None] & (mask != 0)[:, None, :]
    allowed = allowed | torch.eye(T, dtype=torch.bool)[None]
    return allowed[:, None]


def forward(c, W, input_ids, attention_mask=None):
    """logits [B, T, vocab] float64 for input_ids [B, T]."""
    B, T = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= c.vocab_size:
        raise ValueError("input_ids out of range [0, vocab_size)")
    pos = positions_from_mask(attention_mask)
    cos, sin = rope_cos_sin(pos, c.head_dim, c.rope_theta)
    cos, sin = cos[:, None], sin[:, None]  # broadcast over heads: [B, 1, T, D]
    allowed = attention_allowed(attention_mask)
    nh, nkv, D = c.num_heads, c.num_kv_heads, c.head_dim
    groups = nh // nkv
    scale = 1.0 / math.sqrt(D)

    x = W["model.embed_tokens.weight"][input_ids]  # [B, T, H]
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        g = lambda n: W.get(p + n)  # noqa: E731
        # --- self attention
        h = rms_norm(x, g("input_layernorm.weight"), c.rms_norm_eps)
        q = linear(h, g("self_attn.q_proj.weight"), g("self_attn.q_proj.bias"))
        k = linear(h, g("self_attn.k_proj.weight"), g("self_attn.k_proj.bias"))
        v = linear(h, g("self_attn.v_proj.weight"), g("self_attn.v_proj.bias"))
        q = q.view(B, T, nh, D)
        k = k.view(B, T, nkv, D)
        v = v.view(B, T, nkv, D)
        if c.qk_norm:  # Qwen3: per-head RMSNorm over head_dim, before RoPE
            q = rms_norm(q, g("self_attn.q_norm.weight"), c.rms_norm_eps)
            k = rms_norm(k, g("self_attn.k_norm.weight"), c.rms_norm_eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, h, T, D]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # GQA: query head j uses kv head j // groups
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(-1, -2)) * scale  # [B, nh, T, T]
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        a = (probs @ v).transpose(1, 2).reshape(B, T, nh * D)
        x = x + linear(a, g("self_attn.o_proj.weight"), g("self_attn.o_proj.bias"))
        # --- SwiGLU MLP
        h = rms_norm(x, g("post_attention_layernorm.weight"), c.rms_norm_eps)
        gate = linear(h, g("mlp.gate_proj.weight"), g("mlp.gate_proj.bias"))
        up = linear(h, g("mlp.up_proj.weight"), g("mlp.up_proj.bias"))
        x = x + linear(torch.nn.functional.silu(gate) * up,
                       g("mlp.down_proj.weight"), g("mlp.down_proj.bias"))
    x = rms_norm(x, W["model.norm.weight"], c.rms_norm_eps)
    return x @ W["lm_head.weight"].t()


# --------------------------------------------------------------------------
# CLI


def run_cli(model_dir, inputs_path, output_path):
    with open(os.path.join(model_dir, "config.json")) as f:
        c = Config(json.load(f))
    weights, _ = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    W = prepare_weights(c, weights)
    inputs, _ = read_safetensors(inputs_path)
    if "input_ids" not in inputs:
        raise ValueError(f"{inputs_path}: no input_ids")
    ids = inputs["input_ids"]
    if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_ids must be integer [B, T], got {ids.dtype} {list(ids.shape)}")
    ids = ids.to(torch.int64)
    mask = inputs.get("attention_mask")
    if mask is not None:
        if tuple(mask.shape) != tuple(ids.shape):
            raise ValueError("attention_mask shape differs from input_ids")
        mask = mask.to(torch.int64)
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("attention_mask must hold only 0 and 1")
    with torch.no_grad():
        logits = forward(c, W, ids, mask)
    if not bool(torch.isfinite(logits).all()):
        raise RuntimeError("non-finite logits")
    write_safetensors(output_path, {"logits": logits.to(torch.float32)},
                      {"producer": "tests/nn/reference_decoder.py", "compute": "float64"})


# --------------------------------------------------------------------------
# self test


def _tiny_config(model_type):
    cfg = {"model_type": model_type, "hidden_size": 24, "intermediate_size": 40,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": 37,
           "hidden_act": "silu", "rope_scaling": None}
    if model_type == "llama":
        cfg.update(head_dim=8, attention_bias=True, mlp_bias=True, tie_word_embeddings=False)
    elif model_type == "qwen2":
        cfg.update(tie_word_embeddings=True, rope_theta=1000000.0)  # head_dim = 24/4 = 6
    else:
        cfg.update(head_dim=10, attention_bias=False, tie_word_embeddings=False)
    return cfg


def _random_weights(c, gen):
    W = {}
    for name, shape in expected_weight_shapes(c).items():
        if name.endswith("norm.weight"):
            W[name] = 1.0 + 0.3 * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            W[name] = 0.5 * torch.randn(shape, generator=gen, dtype=torch.float64)
    return W


def _naive_forward_one(c, W, ids):
    """Loop-heavy forward of one unpadded sequence (positions 0..T-1), to
    cross-check the vectorised reshapes, GQA indexing and RoPE pairing."""
    T, D, groups = len(ids), c.head_dim, c.num_heads // c.num_kv_heads
    half = D // 2
    x = [W["model.embed_tokens.weight"][t].clone() for t in ids]

    def norm(v, w):
        return w * v / math.sqrt(float((v * v).sum()) / v.numel() + c.rms_norm_eps)

    def rot(v, t):
        out = v.clone()
        for j in range(half):
            ang = t * c.rope_theta ** (-(2.0 * j) / D)
            a, b = float(v[j]), float(v[j + half])
            out[j] = a * math.cos(ang) - b * math.sin(ang)
            out[j + half] = b * math.cos(ang) + a * math.sin(ang)
        return out

    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        b = lambda n: W.get(p + n, 0.0)  # noqa: E731
        hs = [norm(v, W[p + "input_layernorm.weight"]) for v in x]
        qs, ks, vs = [], [], []
        for t, h in enumerate(hs):
            q = W[p + "self_attn.q_proj.weight"] @ h + b("self_attn.q_proj.bias")
            k = W[p + "self_attn.k_proj.weight"] @ h + b("self_attn.k_proj.bias")
            v = W[p + "self_attn.v_proj.weight"] @ h + b("self_attn.v_proj.bias")
            qh = [q[j * D:(j + 1) * D] for j in range(c.num_heads)]
            kh = [k[j * D:(j + 1) * D] for j in range(c.num_kv_heads)]
            vh = [v[j * D:(j + 1) * D] for j in range(c.num_kv_heads)]
            if c.qk_norm:
                qh = [norm(u, W[p + "self_attn.q_norm.weight"]) for u in qh]
                kh = [norm(u, W[p + "self_attn.k_norm.weight"]) for u in kh]
            qs.append([rot(u, t) for u in qh])
            ks.append([rot(u, t) for u in kh])
            vs.append(vh)
        new_x = []
        for t in range(T):
            heads = []
            for j in range(c.num_heads):
                kvh = j // groups
                s = [float(qs[t][j] @ ks[u][kvh]) / math.sqrt(D) for u in range(t + 1)]
                m = max(s)
                e = [math.exp(z - m) for z in s]
                tot = sum(e)
                heads.append(sum(e[u] / tot * vs[u][kvh] for u in range(t + 1)))
            a = torch.cat(heads)
            y = x[t] + W[p + "self_attn.o_proj.weight"] @ a + b("self_attn.o_proj.bias")
            h = norm(y, W[p + "post_attention_layernorm.weight"])
            gate = W[p + "mlp.gate_proj.weight"] @ h + b("mlp.gate_proj.bias")
            up = W[p + "mlp.up_proj.weight"] @ h + b("mlp.up_proj.bias")
            act = gate / (1.0 + torch.exp(-gate)) * up
            new_x.append(y + W[p + "mlp.down_proj.weight"] @ act + b("mlp.down_proj.bias"))
        x = new_x
    return torch.stack([W["lm_head.weight"] @ norm(v, W["model.norm.weight"]) for v in x])


def self_test():
    import tempfile

    gen = torch.Generator().manual_seed(1234)
    for mt in SUPPORTED_MODEL_TYPES:
        cfg = _tiny_config(mt)
        c = Config(cfg)
        W64 = _random_weights(c, gen)
        W = prepare_weights(c, W64)

        def check(cond, what):
            if not cond:
                raise AssertionError(f"[{mt}] self-test failed: {what}")

        # (0) vectorised forward equals the naive per-token/per-head loop
        ids = torch.randint(0, c.vocab_size, (7,), generator=gen)
        ref = _naive_forward_one(c, W, ids.tolist())
        got = forward(c, W, ids[None])[0]
        err = float((ref - got).abs().max())
        check(err < 1e-10, f"vectorised vs naive forward differ by {err:.3g}")

        # (a) left padding: real tokens of a padded row == that row alone
        T = 9
        lens = [9, 5, 1, 7]
        rows = [torch.randint(0, c.vocab_size, (n,), generator=gen) for n in lens]
        batch = torch.zeros(len(rows), T, dtype=torch.int64)
        mask = torch.zeros(len(rows), T, dtype=torch.int64)
        for r, seq in enumerate(rows):
            batch[r, T - len(seq):] = seq
            # padding ids are arbitrary (nonzero) to prove they are ignored
            batch[r, :T - len(seq)] = (r * 5 + 3) % c.vocab_size
            mask[r, T - len(seq):] = 1
        out = forward(c, W, batch, mask)
        check(bool(torch.isfinite(out).all()), "non-finite logits with padding")
        for r, seq in enumerate(rows):
            alone = forward(c, W, seq[None])[0]
            err = float((out[r, T - len(seq):] - alone).abs().max())
            check(err < 1e-10, f"padded row {r} differs from unpadded run by {err:.3g}")
        # explicit all-ones mask == no mask
        full = forward(c, W, batch, torch.ones_like(batch))
        check(torch.equal(full, forward(c, W, batch)), "all-ones mask != no mask")

        # (b) causality: changing token t leaves logits before t unchanged
        seq = torch.randint(0, c.vocab_size, (1, 8), generator=gen)
        base = forward(c, W, seq)
        for t in (0, 3, 7):
            alt = seq.clone()
            alt[0, t] = (alt[0, t] + 1) % c.vocab_size
            o = forward(c, W, alt)
            check(torch.equal(o[:, :t], base[:, :t]), f"logits before {t} changed")
            check(float((o[:, t] - base[:, t]).abs().max()) > 1e-6,
                  f"changing token {t} did not change its own logits")

        # (c) CLI end to end through safetensors files, weights in bf16
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f)
            Wbf = {k: v.to(torch.bfloat16) for k, v in W64.items()}
            write_safetensors(os.path.join(d, "model.safetensors"), Wbf, {"format": "pt"})
            back, _ = read_safetensors(os.path.join(d, "model.safetensors"))
            check(set(back) == set(Wbf) and all(torch.equal(back[k], Wbf[k]) for k in Wbf),
                  "safetensors bf16 round trip")
            write_safetensors(os.path.join(d, "in.safetensors"),
                              {"input_ids": batch, "attention_mask": mask})
            run_cli(d, os.path.join(d, "in.safetensors"), os.path.join(d, "out.safetensors"))
            res, _ = read_safetensors(os.path.join(d, "out.safetensors"))
            Wb64 = prepare_weights(c, {k: v.to(torch.float64) for k, v in Wbf.items()})
            want = forward(c, Wb64, batch, mask).to(torch.float32)
            check(res["logits"].dtype == torch.float32
                  and list(res["logits"].shape) == [len(rows), T, c.vocab_size],
                  "CLI output dtype/shape")
            check(torch.equal(res["logits"], want), "CLI logits differ from in-memory forward")
        print(f"[{mt}] ok (vectorised==naive, left padding, causality, CLI round trip)")

    # refusals
    for bad in ({"hidden_act": "gelu"}, {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
                {"model_type": "mistral"}, {"use_sliding_window": True}):
        cfg = _tiny_config("llama")
        cfg.update(bad)
        try:
            Config(cfg)
        except ValueError:
            continue
        raise AssertionError(f"self-test failed: config {bad} was not refused")
    print("ok")


def main(argv):
    if len(argv) == 2 and argv[1] == "--self-test":
        torch.set_num_threads(1)
        self_test()
        return 0
    if len(argv) != 4:
        sys.stderr.write(__doc__)
        return 2
    run_cli(argv[1], argv[2], argv[3])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
