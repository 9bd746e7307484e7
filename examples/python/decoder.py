"""A Llama / Qwen2 / Qwen3 decoder in plain PyTorch with Hugging Face's parameter names (`model.layers.0.self_attn.
q_proj.weight`, ...), read from a config.json: the Python twin of tessera's C++ DecoderLm (core/nn/decoder.cpp) at
tensor-parallel size 1, written operation for operation as that one is (RMSNorm in fp32, RoPE by rotate_half, GQA by
grouping query heads under their KV head, an additive causal mask, fp32 logits). Its names and shapes are what
tessera's weight sync and Hugging Face export expect, so a Python training script can push it into a C++ rollout
engine of any TP size.

    model = Decoder(json.load(open("examples/grpo/policy/config.json")))
    initialise(model, seed=1)                 # DecoderLm's initial weights, bit for bit
    logits = model(ids)                       # [B, T] int64 -> [B, T, vocab] fp32

A tied head goes through the embedding module's own call (embed_tokens(x, head=True)), so ZeRO-3's forward hooks
gather the shared weight for the head as for the lookup."""
import math

import torch
import torch.nn.functional as F


class Config:
    """The config.json keys the decoder needs, with transformers' defaults per family."""

    def __init__(self, c):
        self.family = c["model_type"]
        if self.family not in ("llama", "qwen2", "qwen3"):
            raise ValueError(f"model_type '{self.family}' is not one of llama, qwen2, qwen3")
        self.vocab_size, self.hidden_size = c["vocab_size"], c["hidden_size"]
        self.intermediate_size, self.layers = c["intermediate_size"], c["num_hidden_layers"]
        self.heads = c["num_attention_heads"]
        self.kv_heads = c.get("num_key_value_heads", self.heads)
        self.head_dim = c.get("head_dim", 128 if self.family == "qwen3" else self.hidden_size // self.heads)
        self.eps, self.rope_theta = c.get("rms_norm_eps", 1e-6), c.get("rope_theta", 10000.0)
        self.tie = c.get("tie_word_embeddings", False)
        self.qkv_bias = True if self.family == "qwen2" else c.get("attention_bias", False)
        self.o_bias = False if self.family == "qwen2" else c.get("attention_bias", False)
        self.mlp_bias = c.get("mlp_bias", False) if self.family == "llama" else False
        self.qk_norm = self.family == "qwen3"
        self.initializer_range = c.get("initializer_range", 0.02)


class RmsNorm(torch.nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.ones(n)), eps

    def forward(self, x):  # in fp32 whatever the dtype, rounded back before the weight
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


class Attention(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        d, hd = c.hidden_size, c.head_dim
        self.c = c
        self.q_proj = torch.nn.Linear(d, c.heads * hd, bias=c.qkv_bias)
        self.k_proj = torch.nn.Linear(d, c.kv_heads * hd, bias=c.qkv_bias)
        self.v_proj = torch.nn.Linear(d, c.kv_heads * hd, bias=c.qkv_bias)
        self.o_proj = torch.nn.Linear(c.heads * hd, d, bias=c.o_bias)
        if c.qk_norm:
            self.q_norm, self.k_norm = RmsNorm(hd, c.eps), RmsNorm(hd, c.eps)

    def forward(self, x, cos, sin, bias):
        B, T, _ = x.shape
        H, KV, hd = self.c.heads, self.c.kv_heads, self.c.head_dim
        q = self.q_proj(x).view(B, T, H, hd)
        k = self.k_proj(x).view(B, T, KV, hd)
        v = self.v_proj(x).view(B, T, KV, hd).transpose(1, 2)
        if self.c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        # C++ evaluates the right operand of `q * cos + rotate_half(q) * sin` first (GCC: right to left), which
        # orders the backward's sums; the same order here keeps the gradients bitwise equal to DecoderLm's.
        rq = rotate_half(q) * sin
        q = q * cos + rq
        rk = rotate_half(k) * sin
        k = k * cos + rk
        G = H // KV  # query heads grouped under their KV head, KV broadcast over the group
        scores = torch.matmul(q.reshape(B, KV, G, T, hd), k.unsqueeze(2).transpose(-1, -2))
        scores = scores.float() * (1.0 / math.sqrt(hd)) + bias
        probs = torch.softmax(scores, -1).to(v.dtype)
        out = torch.matmul(probs, v.unsqueeze(2)).reshape(B, H, T, hd).transpose(1, 2).reshape(B, T, H * hd)
        return self.o_proj(out)


class SwiGlu(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        d, f = c.hidden_size, c.intermediate_size
        self.gate_proj = torch.nn.Linear(d, f, bias=c.mlp_bias)
        self.up_proj = torch.nn.Linear(d, f, bias=c.mlp_bias)
        self.down_proj = torch.nn.Linear(f, d, bias=c.mlp_bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn, self.mlp = Attention(c), SwiGlu(c)
        self.input_layernorm = RmsNorm(c.hidden_size, c.eps)
        self.post_attention_layernorm = RmsNorm(c.hidden_size, c.eps)

    def forward(self, x, cos, sin, bias):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, bias)
        return x + self.mlp(self.post_attention_layernorm(x))


class Embedding(torch.nn.Embedding):
    """The lookup, and with head=True the tied head (x @ weight^T) through the same module call."""

    def forward(self, x, head=False):
        return F.linear(x, self.weight) if head else super().forward(x)


class Backbone(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size)
        self.layers = torch.nn.ModuleList([Layer(c) for _ in range(c.layers)])
        self.norm = RmsNorm(c.hidden_size, c.eps)


class Decoder(torch.nn.Module):
    def __init__(self, config_json):
        super().__init__()
        self.c = c = Config(config_json)
        self.model = Backbone(c)
        if not c.tie:
            self.lm_head = torch.nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        hd = c.head_dim
        self.register_buffer("inv_freq", 1.0 / torch.pow(torch.tensor(c.rope_theta, dtype=torch.float32),
                                                         torch.arange(0, hd, 2).float() / float(hd)), persistent=False)

    def forward(self, ids):
        B, T = ids.shape
        x = self.model.embed_tokens(ids)
        freqs = torch.arange(0, T).expand(B, T).float().unsqueeze(-1) * self.inv_freq
        emb = torch.cat([freqs, freqs], -1)
        dtype = x.dtype
        cos, sin = emb.cos().to(dtype).unsqueeze(1), emb.sin().to(dtype).unsqueeze(1)
        slots = torch.arange(0, T)
        allowed = (slots.unsqueeze(0) <= slots.unsqueeze(1)).unsqueeze(0)  # [1, T, T] causal
        bias = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf")).unsqueeze(1).unsqueeze(1)
        for layer in self.model.layers:
            x = layer(x, cos, sin, bias)
        x = self.model.norm(x)
        projected = self.model.embed_tokens(x, head=True) if self.c.tie else self.lm_head(x)
        return projected.float()


def name_seed(seed, name):
    """core/nn/decoder.cpp's per-parameter seed: FNV-1a over the name, keyed by the seed."""
    h = 1469598103934665603 ^ seed
    for ch in name.encode():
        h = ((h ^ ch) * 1099511628211) & ((1 << 64) - 1)
    return h


def initialise(model, seed):
    """DecoderLm's random initialisation: norms 1, biases 0, every other weight N(0, initializer_range) from a
    generator seeded by its name (so the C++ policy and this one start from the same bits)."""
    std = model.c.initializer_range
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=torch.Generator().manual_seed(name_seed(seed, name)))
