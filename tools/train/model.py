"""The trained model: transformers' Qwen3_5ForCausalLM (qwen3_5_text) plus an MTP head.

The MTP head is assembled from transformers' own modules exactly as tools/make_golden.py's
`add_mtp` does, so the engine's MTP forward (src/model, loaded by src/format/hf_loader.cpp under
the names mtp.fc / mtp.pre_fc_norm_embedding / mtp.pre_fc_norm_hidden / mtp.norm /
mtp.layers.0.*) computes the same function:

    x  = fc(concat[norm_e(embed(token t+1)), norm_h(h_t)])    # h_t: main model output after model.norm
    hm = one-full-attention-layer text model(inputs_embeds=x)   # its layers[0] = mtp.layers.0, norm = mtp.norm
    logits(t+2) = lm_head(hm)                                   # shared (tied) embedding / lm_head

Only torch / transformers are needed here; nothing runs at import time besides imports.
"""
import copy
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

# The default size (README: why). 12 layers, 3:1 Gated DeltaNet : gated attention, hidden 256.
PRESETS = {
    "small": dict(
        hidden_size=256, num_hidden_layers=12, intermediate_size=768,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, full_attention_interval=4,
    ),
    # For a smoke test of the whole pipeline in seconds.
    "tiny": dict(
        hidden_size=64, num_hidden_layers=4, intermediate_size=128,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, full_attention_interval=4,
    ),
}


def padded_vocab(n, multiple=128):
    return int(math.ceil(n / multiple) * multiple)


def make_config(vocab_size, preset="small", eos_token_id=None, pad_token_id=None, max_position_embeddings=32768):
    spec = dict(PRESETS[preset])
    n = spec["num_hidden_layers"]
    interval = spec.pop("full_attention_interval")
    layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    cfg = AutoConfig.for_model(
        "qwen3_5_text", vocab_size=vocab_size, layer_types=layer_types, full_attention_interval=interval,
        tie_word_embeddings=True, rms_norm_eps=1e-6, hidden_act="silu", attention_bias=False,
        max_position_embeddings=max_position_embeddings, mtp_num_hidden_layers=1,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
        eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=None, **spec)
    return cfg


def mtp_body_config(cfg):
    """A one-layer (full attention) text model of the same type: the MTP decoder layer + its norm."""
    one = copy.deepcopy(cfg)
    one.num_hidden_layers = 1
    one.layer_types = ["full_attention"]
    one.vocab_size = 16  # its own embedding is never used (inputs_embeds); keep it tiny
    one.pad_token_id = None
    one.tie_word_embeddings = False
    return one


class MTPHead(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H = cfg.hidden_size
        self.body = AutoModel.from_config(mtp_body_config(cfg), attn_implementation="sdpa")
        norm_cls = type(self.body.norm)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = norm_cls(H, eps=cfg.rms_norm_eps)
        self.pre_fc_norm_hidden = norm_cls(H, eps=cfg.rms_norm_eps)
        with torch.no_grad():
            self.fc.weight.normal_(0.0, cfg.initializer_range)
            # Qwen3_5RMSNorm multiplies by (1 + w): zero is the identity, as HF initialises it.
            self.pre_fc_norm_embedding.weight.zero_()
            self.pre_fc_norm_hidden.weight.zero_()

    def forward(self, hidden, next_embeds):
        """hidden: [B, T', H] post-norm main hidden at t; next_embeds: [B, T', H] = embed(token t+1)."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        return self.body(inputs_embeds=x, use_cache=False).last_hidden_state

    def hf_tensors(self):
        """The mtp.* tensors under the names the engine loads (as make_golden.py's add_mtp writes them)."""
        out = {
            "mtp.fc.weight": self.fc.weight,
            "mtp.pre_fc_norm_embedding.weight": self.pre_fc_norm_embedding.weight,
            "mtp.pre_fc_norm_hidden.weight": self.pre_fc_norm_hidden.weight,
            "mtp.norm.weight": self.body.norm.weight,
        }
        for k, v in self.body.layers[0].state_dict().items():
            out["mtp.layers.0." + k] = v
        return out

    def load_hf_tensors(self, tensors):
        with torch.no_grad():
            self.fc.weight.copy_(tensors["mtp.fc.weight"])
            self.pre_fc_norm_embedding.weight.copy_(tensors["mtp.pre_fc_norm_embedding.weight"])
            self.pre_fc_norm_hidden.weight.copy_(tensors["mtp.pre_fc_norm_hidden.weight"])
            self.body.norm.weight.copy_(tensors["mtp.norm.weight"])
            layer = {k[len("mtp.layers.0."):]: v for k, v in tensors.items() if k.startswith("mtp.layers.0.")}
            self.body.layers[0].load_state_dict(layer, strict=True)


def _ce_sum(h, w, y):
    logits = F.linear(h, w).float()
    return F.cross_entropy(logits, y, reduction="sum")


def chunked_ce(h, w, y, chunk=8192):
    """Mean cross-entropy of h @ w^T against y without keeping [N, vocab] logits for backward:
    each chunk is recomputed in the backward pass (torch.utils.checkpoint)."""
    h = h.reshape(-1, h.shape[-1])
    y = y.reshape(-1)
    total = h.new_zeros((), dtype=torch.float32)
    for i in range(0, h.shape[0], chunk):
        if torch.is_grad_enabled():
            total = total + checkpoint(_ce_sum, h[i:i + chunk], w, y[i:i + chunk], use_reentrant=False)
        else:
            total = total + _ce_sum(h[i:i + chunk], w, y[i:i + chunk])
    return total / y.numel()


class Qwen36Trainable(nn.Module):
    """lm: Qwen3_5ForCausalLM; mtp: MTPHead. forward(tokens [B, T+1]) -> dict of losses."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.lm = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
        if self.lm.lm_head.weight.data_ptr() != self.lm.model.embed_tokens.weight.data_ptr():
            self.lm.tie_weights()
        assert self.lm.lm_head.weight.data_ptr() == self.lm.model.embed_tokens.weight.data_ptr(), "embeddings not tied"
        self.mtp = MTPHead(cfg)

    def hidden(self, x):
        return self.lm.model(input_ids=x, use_cache=False).last_hidden_state  # after model.norm

    def forward(self, tokens, mtp_weight=0.3, ce_chunk=8192):
        x, y = tokens[:, :-1], tokens[:, 1:]
        h = self.hidden(x)                                        # [B, T, H]
        w = self.lm.lm_head.weight
        loss_main = chunked_ce(h, w, y, ce_chunk)
        e = self.lm.model.embed_tokens(tokens[:, 1:-1])           # token t+1 for t = 0..T-2
        hm = self.mtp(h[:, :-1], e)                               # position t predicts token t+2
        loss_mtp = chunked_ce(hm, w, tokens[:, 2:], ce_chunk)
        return dict(loss=loss_main + mtp_weight * loss_mtp, loss_main=loss_main, loss_mtp=loss_mtp)

    @torch.no_grad()
    def evaluate_batch(self, tokens, chunk=8192):
        """Sums over one batch: main CE, MTP CE, main top-1 hits, MTP top-1 hits against the true
        token t+2, and MTP agreement with the main model's own argmax at t+1 (the greedy verify
        of a one-token draft, teacher-forced). Returns (sums dict, n_main, n_mtp)."""
        x, y = tokens[:, :-1], tokens[:, 1:]
        B, T = x.shape
        h = self.hidden(x)
        w = self.lm.lm_head.weight
        hm = self.mtp(h[:, :-1], self.lm.model.embed_tokens(tokens[:, 1:-1]))
        s = dict(ce_main=0.0, ce_mtp=0.0, top1_main=0, top1_mtp=0, agree_mtp=0)
        arg_main = torch.empty(B, T, dtype=torch.long, device=tokens.device)
        hf, yf, af = h.reshape(-1, h.shape[-1]), y.reshape(-1), arg_main.view(-1)
        for i in range(0, hf.shape[0], chunk):
            lg = F.linear(hf[i:i + chunk], w).float()
            s["ce_main"] += float(F.cross_entropy(lg, yf[i:i + chunk], reduction="sum"))
            af[i:i + chunk] = lg.argmax(-1)
        s["top1_main"] = int((arg_main == y).sum())
        y2 = tokens[:, 2:]
        arg_mtp = torch.empty(B, T - 1, dtype=torch.long, device=tokens.device)
        mf, y2f, mtf = hm.reshape(-1, hm.shape[-1]), y2.reshape(-1), arg_mtp.view(-1)
        for i in range(0, mf.shape[0], chunk):
            lg = F.linear(mf[i:i + chunk], w).float()
            s["ce_mtp"] += float(F.cross_entropy(lg, y2f[i:i + chunk], reduction="sum"))
            mtf[i:i + chunk] = lg.argmax(-1)
        s["top1_mtp"] = int((arg_mtp == y2).sum())
        s["agree_mtp"] = int((arg_mtp == arg_main[:, 1:]).sum())
        return s, B * T, B * (T - 1)


def param_counts(model):
    emb = model.lm.model.embed_tokens.weight.numel()
    total = sum(p.numel() for p in model.parameters())  # tied lm_head counted once
    mtp = sum(p.numel() for p in model.mtp.parameters())
    mtp_unused = model.mtp.body.embed_tokens.weight.numel()
    return dict(total=total - mtp_unused, embedding=emb, main_non_embedding=total - emb - mtp, mtp=mtp - mtp_unused)
