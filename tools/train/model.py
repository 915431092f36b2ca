"""A DeepseekV3ForCausalLM-shaped model in PyTorch 1.13 (Debian python3-torch) whose
forward pass is the one dsinfer computes (src/model/deepseek.cc):

- MLA with q_lora: q = q_b(norm(q_a(x))); kv_a(x) = [latent | k_pe]; latent normed,
  kv_b(latent) = per head [k_nope | v]; rope on adjacent pairs (2i, 2i+1) of q_pe and
  the shared k_pe (plain RoPE, no YaRN); softmax scale qk_head_dim^-0.5.
- dense SwiGLU MLP for the first `first_k_dense_replace` layers, then MoE: sigmoid
  scores, top-k by score + e_score_correction_bias (the bias only steers the choice),
  weights = the chosen scores normalised, times routed_scaling_factor; one shared
  expert. The bias is trained by DeepSeek-V3's auxiliary-loss-free balancing (a step
  of +-gamma towards equal load after every optimizer step), not by gradients.
- MTP (one module): enorm(embed(t[i+1])) ++ hnorm(final_norm(h[i])) -> eh_proj -> one
  MoE block -> shared_head.norm -> head, predicting t[i+2].

Vocabulary restriction: embeddings and head hold rows only for `used_ids` plus one
"other" row shared by every unused id. The full-vocabulary softmax is still exact:
the other row's logit is counted n_other times (logit + log n_other), so the loss is
the loss of the exported 129,280-row model.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Config:
    def __init__(self, **kw):
        self.vocab_size = 129280
        self.hidden_size = 256
        self.intermediate_size = 512
        self.moe_intermediate_size = 128
        self.num_hidden_layers = 3
        self.num_attention_heads = 4
        self.q_lora_rank = 128
        self.kv_lora_rank = 64
        self.qk_nope_head_dim = 32
        self.qk_rope_head_dim = 32
        self.v_head_dim = 32
        self.n_routed_experts = 8
        self.n_shared_experts = 1
        self.num_experts_per_tok = 2
        self.routed_scaling_factor = 1.0
        self.first_k_dense_replace = 1
        self.num_nextn_predict_layers = 1
        self.rms_norm_eps = 1e-6
        self.rope_theta = 10000.0
        self.max_position_embeddings = 4096
        for k, v in kw.items():
            if not hasattr(self, k):
                raise ValueError(f"unknown config field {k}")
            setattr(self, k, v)

    def to_hf(self):
        """config.json as dsinfer's parse_hf_config reads it."""
        return {
            "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
            "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank, "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim, "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim, "n_routed_experts": self.n_routed_experts,
            "n_shared_experts": self.n_shared_experts,
            "num_experts_per_tok": self.num_experts_per_tok, "n_group": 1, "topk_group": 1,
            "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": True,
            "routed_scaling_factor": self.routed_scaling_factor,
            "first_k_dense_replace": self.first_k_dense_replace, "moe_layer_freq": 1,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
            "hidden_act": "silu", "attention_bias": False, "torch_dtype": "bfloat16",
        }


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    """x [..., S, d] rotated on adjacent pairs; cos/sin [S, d/2] (broadcast)."""
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        nh, qk = c.num_attention_heads, c.qk_nope_head_dim + c.qk_rope_head_dim
        self.q_a_proj = nn.Linear(c.hidden_size, c.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
        self.q_b_proj = nn.Linear(c.q_lora_rank, nh * qk, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(c.hidden_size, c.kv_lora_rank + c.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        self.kv_b_proj = nn.Linear(c.kv_lora_rank, nh * (c.qk_nope_head_dim + c.v_head_dim), bias=False)
        self.o_proj = nn.Linear(nh * c.v_head_dim, c.hidden_size, bias=False)
        self.scale = qk ** -0.5

    def forward(self, x, cos, sin, mask):
        c = self.c
        B, S, _ = x.shape
        nh, nope, rd, vd = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, S, nh, nope + rd).transpose(1, 2)
        kv = self.kv_a_proj_with_mqa(x)
        latent, k_pe = kv[..., :c.kv_lora_rank], kv[..., c.kv_lora_rank:]
        kvb = self.kv_b_proj(self.kv_a_layernorm(latent)).view(B, S, nh, nope + vd).transpose(1, 2)
        k_nope, v = kvb[..., :nope], kvb[..., nope:]
        q = torch.cat([q[..., :nope], rope(q[..., nope:], cos, sin)], dim=-1) * self.scale
        k_pe = rope(k_pe.unsqueeze(1), cos, sin)  # [B, 1, S, rd], shared by the heads
        k = torch.cat([k_nope, k_pe.expand(B, nh, S, rd)], dim=-1)
        # mask: additive [B, 1, S, S] (0 / -inf)
        scores = torch.baddbmm(mask.expand(B, nh, S, S).reshape(B * nh, S, S),
                               q.reshape(B * nh, S, nope + rd),
                               k.reshape(B * nh, S, nope + rd).transpose(1, 2))
        out = (torch.softmax(scores, dim=-1).view(B, nh, S, S) @ v)  # [B, nh, S, vd]
        return self.o_proj(out.transpose(1, 2).reshape(B, S, nh * vd))


class MLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(c.n_routed_experts, c.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(c.n_routed_experts))


class MoE(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.gate = Gate(c)
        self.experts = nn.ModuleList(MLP(c.hidden_size, c.moe_intermediate_size)
                                     for _ in range(c.n_routed_experts))
        self.shared_experts = MLP(c.hidden_size, c.moe_intermediate_size * c.n_shared_experts)
        self.last_load = None  # tokens per expert in the last forward (for balancing)
        self.last_aux = None

    def forward(self, x):
        c = self.c
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        scores = torch.sigmoid(h @ self.gate.weight.t())  # [N, E]
        choice = scores.detach() + self.gate.e_score_correction_bias
        ids = torch.topk(choice, c.num_experts_per_tok, dim=-1).indices  # [N, k]
        w = scores.gather(1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * c.routed_scaling_factor
        out = torch.zeros_like(h)
        load = torch.bincount(ids.flatten(), minlength=c.n_routed_experts)
        self.last_load = load.detach()
        # DeepSeek-V3's complementary balance loss (tiny alpha): frequency x mean affinity.
        frac = load.float() * c.n_routed_experts / (c.num_experts_per_tok * h.shape[0])
        probs = scores / scores.sum(-1, keepdim=True)
        self.last_aux = (frac.detach() * probs.mean(0)).sum()
        for e in range(c.n_routed_experts):
            tok, slot = torch.nonzero(ids == e, as_tuple=True)
            if tok.numel() == 0:
                continue
            y = self.experts[e](h[tok]) * w[tok, slot].unsqueeze(-1)
            out.index_add_(0, tok, y)
        out = out + self.shared_experts(h)
        return out.view(shape)


class Block(nn.Module):
    def __init__(self, c, moe):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MoE(c) if moe else MLP(c.hidden_size, c.intermediate_size)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MTP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.enorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hnorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.block = Block(c, moe=True)
        self.head_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Model(nn.Module):
    def __init__(self, c, used_ids):
        super().__init__()
        self.c = c
        used = torch.as_tensor(sorted(set(int(i) for i in used_ids)), dtype=torch.long)
        self.register_buffer("used_ids", used)
        self.n_other = c.vocab_size - used.numel()
        nv = used.numel() + 1  # + the shared "other" row (last)
        self.embed = nn.Parameter(torch.empty(nv, c.hidden_size))
        self.head = nn.Parameter(torch.empty(nv, c.hidden_size))
        self.layers = nn.ModuleList(Block(c, moe=i >= c.first_k_dense_replace)
                                    for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mtp = MTP(c) if c.num_nextn_predict_layers > 0 else None
        # id -> row (unused ids -> the other row)
        lut = torch.full((c.vocab_size,), nv - 1, dtype=torch.long)
        lut[used] = torch.arange(used.numel())
        self.register_buffer("lut", lut)
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.qk_rope_head_dim, 2).double() / c.qk_rope_head_dim))
        self.register_buffer("inv_freq", inv)
        self.reset_parameters()

    def reset_parameters(self):
        g = torch.Generator().manual_seed(1234)
        n_blocks = 2 * (self.c.num_hidden_layers + 1)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                continue
            std = 0.02
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                std = 0.02 / math.sqrt(n_blocks)
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * std)
        with torch.no_grad():
            self.embed.copy_(torch.randn(self.embed.shape, generator=g))

    def rope_tables(self, pos):
        ang = pos.double().unsqueeze(-1) * self.inv_freq  # [B, S, rd/2]
        dt = self.embed.dtype
        return ang.cos().to(dt).unsqueeze(1), ang.sin().to(dt).unsqueeze(1)  # [B, 1, S, rd/2]

    def logits(self, h):
        """Restricted-vocabulary logits; the last column stands for every unused id."""
        z = h @ self.head.t()
        other = z[..., -1:] + math.log(max(self.n_other, 1))
        return torch.cat([z[..., :-1], other], dim=-1)

    def forward(self, rows, pos, mask):
        """rows: [B, S] row indices (lut-mapped); pos: [B, S]; mask: [B, 1, S, S] bool.
        Returns the final-normed hidden states [B, S, H] (logits: self.logits(h))."""
        cos, sin = self.rope_tables(pos)
        x = self.embed[rows]
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x)

    def mtp_forward(self, h, next_rows, pos, mask):
        m = self.mtp
        cos, sin = self.rope_tables(pos)
        x = m.eh_proj(torch.cat([m.enorm(self.embed[next_rows]), m.hnorm(h)], dim=-1))
        x = m.block(x, cos, sin, mask)
        return m.head_norm(x)  # the MTP head's input (logits: self.logits(...))

    def moe_layers(self):
        out = [l.mlp for l in self.layers if isinstance(l.mlp, MoE)]
        if self.mtp is not None:
            out.append(self.mtp.block.mlp)
        return out

    def hf_tensors(self):
        """(HF name, tensor) for every body tensor; embed/head are handled by export."""
        c = self.c
        out = []

        def block(prefix, b):
            for n, t in b.state_dict().items():
                out.append((prefix + n, t))

        for i, l in enumerate(self.layers):
            block(f"model.layers.{i}.", l)
        out.append(("model.norm.weight", self.norm.weight))
        if self.mtp is not None:
            p = f"model.layers.{c.num_hidden_layers}."
            block(p, self.mtp.block)
            out += [(p + "enorm.weight", self.mtp.enorm.weight),
                    (p + "hnorm.weight", self.mtp.hnorm.weight),
                    (p + "eh_proj.weight", self.mtp.eh_proj.weight),
                    (p + "shared_head.norm.weight", self.mtp.head_norm.weight)]
        return out
