#!/usr/bin/env python3
"""Writes a tiny random DFlash drafter checkpoint in the z-lab `DFlashDraftModel` layout
(config.json + model.safetensors, bf16 matrices, written by hand: stdlib only).

The default geometry fits the tiny target fixture tests/data/golden/dense-mtp (hidden 48,
2 decoder layers, vocabulary 128): 2 drafter layers, the first a sliding-window layer with a
12-token window (so short test prompts already run past it), the second full attention;
both target layers condition it. The drafter has no embedding and no lm_head, as the real
ones: the target's are used.

    python3 tools/make_dflash_fixture.py tests/data/dflash/dense-mtp-b16
    python3 tools/make_dflash_fixture.py OUT --schema old   # block_size at the top level
"""
import argparse
import json
import math
import os
import random
import struct


def bf16_bytes(values):
    out = bytearray()
    for x in values:
        u = struct.unpack("<I", struct.pack("<f", x))[0]
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even
        out += struct.pack("<H", u & 0xFFFF)
    return bytes(out)


def write_safetensors(path, tensors):
    """tensors: list of (name, shape, list of floats) stored as BF16."""
    header, blobs, offset = {}, [], 0
    for name, shape, values in tensors:
        assert len(values) == math.prod(shape), name
        data = bf16_bytes(values)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=48)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--intermediate", type=int, default=96)
    ap.add_argument("--vocab", type=int, default=128)
    ap.add_argument("--target-layer-ids", default="0,1")
    ap.add_argument("--num-target-layers", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--mask-token-id", type=int, default=127)
    ap.add_argument("--sliding-window", type=int, default=12)
    ap.add_argument("--sliding-layers", type=int, default=1, help="leading layers that are sliding_attention")
    ap.add_argument("--schema", choices=["new", "old"], default="new")
    ap.add_argument("--seed", type=int, default=36)
    a = ap.parse_args()

    rng = random.Random(a.seed)
    ids = [int(x) for x in a.target_layer_ids.split(",")]
    H, I, hd = a.hidden, a.intermediate, a.head_dim
    layer_types = ["sliding_attention"] * a.sliding_layers + ["full_attention"] * (a.layers - a.sliding_layers)

    def matrix(rows, cols):
        s = 1.0 / math.sqrt(cols)
        return [rng.gauss(0.0, s) for _ in range(rows * cols)]

    def norm(n):
        return [1.0 + rng.gauss(0.0, 0.1) for _ in range(n)]

    tensors = [
        ("fc.weight", (H, len(ids) * H), matrix(H, len(ids) * H)),
        ("hidden_norm.weight", (H,), norm(H)),
        ("norm.weight", (H,), norm(H)),
    ]
    for i in range(a.layers):
        p = f"layers.{i}."
        tensors += [
            (p + "input_layernorm.weight", (H,), norm(H)),
            (p + "post_attention_layernorm.weight", (H,), norm(H)),
            (p + "self_attn.q_proj.weight", (a.heads * hd, H), matrix(a.heads * hd, H)),
            (p + "self_attn.k_proj.weight", (a.kv_heads * hd, H), matrix(a.kv_heads * hd, H)),
            (p + "self_attn.v_proj.weight", (a.kv_heads * hd, H), matrix(a.kv_heads * hd, H)),
            (p + "self_attn.o_proj.weight", (H, a.heads * hd), matrix(H, a.heads * hd)),
            (p + "self_attn.q_norm.weight", (hd,), norm(hd)),
            (p + "self_attn.k_norm.weight", (hd,), norm(hd)),
            (p + "mlp.gate_proj.weight", (I, H), matrix(I, H)),
            (p + "mlp.up_proj.weight", (I, H), matrix(I, H)),
            (p + "mlp.down_proj.weight", (H, I), matrix(H, I)),
        ]

    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "attention_bias": False,
        "hidden_act": "silu",
        "hidden_size": H,
        "intermediate_size": I,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": hd,
        "vocab_size": a.vocab,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "layer_types": layer_types,
        "sliding_window": a.sliding_window if a.sliding_layers else None,
        "num_target_layers": a.num_target_layers,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
    }
    dflash = {"mask_token_id": a.mask_token_id, "target_layer_ids": ids}
    if a.schema == "old":  # block_size at the top level, rope_theta flat
        config["block_size"] = a.block_size
        config["rope_theta"] = 10000.0
    else:  # block_size inside dflash_config, rope in rope_parameters
        dflash["block_size"] = a.block_size
        config["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}
    config["dflash_config"] = dflash

    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(a.out, "model.safetensors"), tensors)


if __name__ == "__main__":
    main()
