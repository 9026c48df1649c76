#!/usr/bin/env python3
"""Golden fixtures from transformers, the reference implementation of Qwen3.5/3.6.

Run where transformers (5.x) and torch are installed (the GPU machine):
    python3 tools/make_golden.py OUT_DIR
For each case it writes OUT_DIR/<case>/: config.json, generation_config.json,
model.safetensors (bf16), tokens.i32 (int32 LE), logits.f32 (float32 LE [n_tokens x vocab],
model run in float32 on the CPU), case.json (tokens, greedy prompt and continuation, versions).

The cases cover what the engine must get right: GQA ratios, DeltaNet key dim != value dim,
several value heads per key head, tied and untied embeddings, partial rotary, explicit
layer_types, MoE top-k with a shared expert, and sequences longer than one 64-token chunk.
Weights are widened beyond the default tiny init so logits are not flat.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

N_TOKENS = 100          # > 64: chunked DeltaNet crosses a chunk boundary
GREEDY_PROMPT = 12
GREEDY_NEW = 24

CASES = {
    # GQA 4:1, DeltaNet 3 value heads per key head, key dim 32 != value dim 48, untied head.
    "dense-gqa": dict(
        model_type="qwen3_5_text", seed=101,
        hidden_size=96, num_hidden_layers=4, intermediate_size=96, vocab_size=256,
        num_attention_heads=4, num_key_value_heads=1, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=32, linear_value_head_dim=48,
        linear_conv_kernel_dim=4, full_attention_interval=4, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
    ),
    # Tied embeddings, explicit irregular layer_types, half-rotary heads, GQA 3:1.
    "dense-tied": dict(
        model_type="qwen3_5_text", seed=102,
        hidden_size=96, num_hidden_layers=6, intermediate_size=96, vocab_size=200,
        num_attention_heads=6, num_key_value_heads=2, head_dim=16,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=24,
        linear_conv_kernel_dim=4, tie_word_embeddings=True,
        layer_types=["linear_attention", "full_attention", "linear_attention",
                     "linear_attention", "full_attention", "linear_attention"],
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.5),
    ),
    # MoE: 8 experts top-2 with a shared expert; GQA 2:1; untied.
    "moe-shared": dict(
        model_type="qwen3_5_moe_text", seed=103,
        hidden_size=96, num_hidden_layers=4, vocab_size=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, full_attention_interval=2, tie_word_embeddings=False,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
    ),
    # MoE: 16 experts top-4, tied embeddings, DeltaNet key dim 16 != value dim 32, 4 v heads per k head.
    "moe-top4-tied": dict(
        model_type="qwen3_5_moe_text", seed=104,
        hidden_size=64, num_hidden_layers=3, vocab_size=160,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        linear_num_key_heads=1, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=32,
        linear_conv_kernel_dim=4, full_attention_interval=3, tie_word_embeddings=True,
        num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
    ),
}

# MTP cases: transformers has no MTP module, so the reference is built from its own parts:
# mtp.layers.0 is a one-layer text model of the same type (one full-attention decoder layer,
# its final norm serving as mtp.norm); fc and the two pre-fc norms are nn.Linear / the
# model's RMSNorm. For every position t < n-1 the head sees the target's post-norm hidden
# state h_t and the next token t+1 (embedding first in the concat), and predicts token t+2.
MTP_CASES = {
    "dense-mtp": dict(
        model_type="qwen3_5_text", seed=105,
        hidden_size=48, num_hidden_layers=2, intermediate_size=64, vocab_size=128,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=24,
        linear_conv_kernel_dim=4, full_attention_interval=2, tie_word_embeddings=False, mtp_num_hidden_layers=1,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
    ),
    "moe-mtp": dict(
        model_type="qwen3_5_moe_text", seed=106,
        hidden_size=48, num_hidden_layers=2, vocab_size=128,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, full_attention_interval=2, tie_word_embeddings=True, mtp_num_hidden_layers=1,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
    ),
}


def bf16_round(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(torch.bfloat16).to(torch.float32))


def add_mtp(name, spec, out_dir):
    """Adds mtp.* weights to a saved case and writes mtp_logits.f32 [n_tokens-1 x vocab]."""
    d = os.path.join(out_dir, name)
    seed = spec["seed"] + 1000
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    cfg = ref.config
    one = AutoConfig.for_model(cfg.model_type, **{k: v for k, v in spec.items() if k not in ("model_type", "seed")})
    one.num_hidden_layers = 1
    one.layer_types = ["full_attention"]
    head = AutoModel.from_config(one, dtype=torch.float32).eval()  # layers[0] + norm (= mtp.norm)
    widen(head, gen)
    H = cfg.hidden_size
    fc = torch.nn.Linear(2 * H, H, bias=False)
    norm_e = type(head.norm)(H, eps=cfg.rms_norm_eps)
    norm_h = type(head.norm)(H, eps=cfg.rms_norm_eps)
    with torch.no_grad():
        fc.weight.copy_(torch.randn(fc.weight.shape, generator=gen) * 0.08)
        norm_e.weight.add_(torch.randn(H, generator=gen) * 0.1)
        norm_h.weight.add_(torch.randn(H, generator=gen) * 0.1)
    for m in (head, fc, norm_e, norm_h):
        bf16_round(m)

    tokens = torch.from_numpy(__import__("numpy").fromfile(os.path.join(d, "tokens.i32"), dtype="<i4")).long()[None]
    with torch.no_grad():
        hidden = ref.model(input_ids=tokens).last_hidden_state[0]  # post final norm
        emb = ref.model.embed_tokens(tokens[0, 1:])
        x = fc(torch.cat([norm_e(emb), norm_h(hidden[:-1])], dim=-1))
        hm = head(inputs_embeds=x[None]).last_hidden_state[0]
        logits = ref.lm_head(hm).float().contiguous()
    logits.numpy().astype("<f4").tofile(os.path.join(d, "mtp_logits.f32"))

    path = os.path.join(d, "model.safetensors")
    tensors = load_file(path)
    tensors["mtp.fc.weight"] = fc.weight.detach().to(torch.bfloat16).contiguous()
    tensors["mtp.pre_fc_norm_embedding.weight"] = norm_e.weight.detach().to(torch.bfloat16).contiguous()
    tensors["mtp.pre_fc_norm_hidden.weight"] = norm_h.weight.detach().to(torch.bfloat16).contiguous()
    tensors["mtp.norm.weight"] = head.norm.weight.detach().to(torch.bfloat16).contiguous()
    for k, v in head.layers[0].state_dict().items():
        tensors["mtp.layers.0." + k] = v.detach().to(torch.bfloat16).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})
    print(f"{name}: mtp head added, mtp logits {tuple(logits.shape)}, max |logit| {float(logits.abs().max()):.3f}")


def widen(model, gen):
    """Spread the weights so activations and logits are not flat."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen) * 2 - 1)
            elif name.endswith("dt_bias"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
            elif p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.08)
            else:  # norm weights
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)


def make_case(name, spec, out_dir):
    spec = dict(spec)
    model_type = spec.pop("model_type")
    seed = spec.pop("seed")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    cfg = AutoConfig.for_model(model_type, **spec)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    widen(model, gen)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)

    # Reference: the saved (bf16) weights, computed in float32 on the CPU.
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    tokens = torch.randint(0, cfg.vocab_size, (1, N_TOKENS), generator=gen)
    with torch.no_grad():
        logits = ref(input_ids=tokens).logits[0].float().contiguous()
        prompt = tokens[:, :GREEDY_PROMPT]
        out = ref.generate(prompt, max_new_tokens=GREEDY_NEW, min_new_tokens=GREEDY_NEW, do_sample=False,
                           pad_token_id=0, eos_token_id=None)
    greedy = out[0, GREEDY_PROMPT:].tolist()
    tokens.to(torch.int32).numpy().tofile(os.path.join(d, "tokens.i32"))
    logits.numpy().astype("<f4").tofile(os.path.join(d, "logits.f32"))
    case = dict(
        case=name, model_type=model_type, seed=seed, n_tokens=N_TOKENS, vocab=cfg.vocab_size,
        tokens=tokens[0].tolist(), greedy_prompt=prompt[0].tolist(), greedy_out=greedy,
        n_params=sum(p.numel() for p in ref.parameters()),
        safetensors_dtype="bfloat16", logits_dtype="float32 (model run in float32 on CPU)",
        transformers=transformers.__version__, torch=torch.__version__,
        max_abs_logit=float(logits.abs().max()),
    )
    with open(os.path.join(d, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
    print(f"{name}: {case['n_params']} params, max |logit| {case['max_abs_logit']:.3f}, greedy {greedy[:8]}...")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/data/golden"
    torch.set_num_threads(4)
    only = sys.argv[2:]  # optional case names
    for name, spec in {**CASES, **MTP_CASES}.items():
        if not only or name in only:
            make_case(name, spec, out_dir)
            if name in MTP_CASES:
                add_mtp(name, spec, out_dir)


if __name__ == "__main__":
    main()
