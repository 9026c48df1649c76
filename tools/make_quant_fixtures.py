#!/usr/bin/env python3
"""Tiny quantized Hugging Face checkpoints, one per stored layout, and their exact f32 twins.

    python3 tools/make_quant_fixtures.py [OUT_DIR]      (default tests/data/quant; stdlib only)

The model is the dense golden fixture's config (tests/data/golden/dense-mtp) with dimensions
that group quantization can use (hidden 64, or 128 for FP8's 128-wide blocks) and seeded random
bf16 weights. For each format every eligible Linear is quantized by a round-trip quantizer and
written in that format's exact checkpoint layout to OUT_DIR/<format>/ (config.json with its
quantization_config, or hf_quant_config.json, and a hand-written model.safetensors).
OUT_DIR/<format>/f32/ is the same model with each quantized Linear replaced by its dequantized
f32 weight, decoded here from the stored bits (an implementation independent of the C++
loader), every other tensor byte-identical. Modules left unquantized (lm_head, embeddings, the
2-row GDN a/b projections, matrices whose in_features the group does not divide) are named in
the format's ignore list.

f32 arithmetic: every dequantized value is one product of values exact in f32 whose exact
product fits a double (at most 53 bits), rounded once to f32 by struct.pack('<f'): the same
bits as the C++ f32 multiply (quant/hf_blocks.h), so the twins are bit-exact references.
"""
import json
import math
import os
import random
import struct
import sys

BASE = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "golden", "dense-mtp", "config.json")


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f16_bits(x):
    return struct.unpack("<H", struct.pack("<e", x))[0]


def f16_val(b):
    return struct.unpack("<e", struct.pack("<H", b))[0]


def bf16_bits(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def bf16_val(b):
    return struct.unpack("<f", struct.pack("<I", b << 16))[0]


def e4m3_val(c):
    e, m = (c >> 3) & 15, c & 7
    v = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if c & 0x80 else v


E4M3_POS = [(e4m3_val(c), c) for c in range(0x7F)]  # 0x7f is NaN


def nearest(table, x):
    """Code of the table value nearest |x| (ties to the even code), with x's sign bit `sign`."""
    a = abs(x)
    best = min(table, key=lambda vc: (abs(vc[0] - a), vc[1] & 1))
    return best


def e4m3_code(x):
    v, c = nearest(E4M3_POS, min(abs(x), 448.0))
    return c | (0x80 if x < 0 and c else 0)


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_code(x):
    v, c = nearest([(E2M1[i], i) for i in range(8)], min(abs(x), 6.0))
    return c | (8 if x < 0 and c else 0)


def e2m1_val(c):
    return -E2M1[c & 7] if c & 8 else E2M1[c & 7]


# ---- safetensors (u64 header length, JSON header, data) ----

SIZES = {"F32": 4, "I32": 4, "I64": 8, "BF16": 2, "F16": 2, "U8": 1, "F8_E4M3": 1}
FMT = {"F32": "f", "I32": "i", "I64": "q", "BF16": "H", "F16": "H", "U8": "B", "F8_E4M3": "B"}


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, flat list of values / bit patterns)."""
    names = sorted(tensors, key=lambda n: (-SIZES[tensors[n][0]], n))  # wide types first: aligned
    header, blobs, off = {}, [], 0
    for n in names:
        dt, shape, vals = tensors[n]
        assert len(vals) == math.prod(shape), n
        b = struct.pack("<%d%s" % (len(vals), FMT[dt]), *vals)
        header[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":"))
    h += " " * ((8 - (8 + len(h)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h.encode() + b"".join(blobs))


# ---- the model ----

def make_config(hidden):
    with open(BASE) as f:
        c = json.load(f)
    c.update(hidden_size=hidden, intermediate_size=128, head_dim=hidden // 2 if hidden == 128 else 32,
             num_attention_heads=2, num_key_value_heads=1, linear_num_key_heads=1, linear_key_head_dim=32,
             linear_num_value_heads=2, linear_value_head_dim=hidden // 2, mtp_num_hidden_layers=0,
             vocab_size=128, tie_word_embeddings=False)
    return c


def make_model(c, seed):
    """name -> (shape, bf16 bit list); linears listed separately (name without .weight -> shape)."""
    rng = random.Random(seed)
    H, I, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    nh, nkv = c["num_attention_heads"], c["num_key_value_heads"]
    kd, vd = c["linear_key_head_dim"] * c["linear_num_key_heads"], c["linear_value_head_dim"] * c["linear_num_value_heads"]
    hv = c["linear_num_value_heads"]
    t, lin = {}, {}

    def put(name, shape, std, mean=0.0):
        t[name] = (shape, [bf16_bits(rng.gauss(mean, std)) for _ in range(math.prod(shape))])

    def linear(name, n, k):
        put(name + ".weight", [n, k], 1.5 / math.sqrt(k))
        lin[name] = (n, k)

    put("model.embed_tokens.weight", [c["vocab_size"], H], 1.0)
    put("lm_head.weight", [c["vocab_size"], H], 1.0 / math.sqrt(H))
    put("model.norm.weight", [H], 0.1)
    for i, kind in enumerate(c["layer_types"]):
        p = "model.layers.%d." % i
        put(p + "input_layernorm.weight", [H], 0.1)
        put(p + "post_attention_layernorm.weight", [H], 0.1)
        if kind == "full_attention":
            linear(p + "self_attn.q_proj", nh * hd * 2, H)
            linear(p + "self_attn.k_proj", nkv * hd, H)
            linear(p + "self_attn.v_proj", nkv * hd, H)
            linear(p + "self_attn.o_proj", H, nh * hd)
            put(p + "self_attn.q_norm.weight", [hd], 0.1)
            put(p + "self_attn.k_norm.weight", [hd], 0.1)
        else:
            a = p + "linear_attn."
            linear(a + "in_proj_qkv", 2 * kd + vd, H)
            linear(a + "in_proj_z", vd, H)
            linear(a + "in_proj_a", hv, H)
            linear(a + "in_proj_b", hv, H)
            linear(a + "out_proj", H, vd)
            put(a + "conv1d.weight", [2 * kd + vd, 1, c["linear_conv_kernel_dim"]], 0.5)
            put(a + "dt_bias", [hv], 0.5)
            put(a + "A_log", [hv], 0.3)
            put(a + "norm.weight", [c["linear_value_head_dim"]], 0.1, 1.0)
        for m, (n, k) in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
            linear(p + "mlp." + m, n, k)
    return t, lin


def weights_f32(bits):
    return [bf16_val(b) for b in bits]


# ---- W4 quantizers (asymmetric min/max, or symmetric absmax) ----

def quant_group(vals, sym, scale_enc, scale_dec):
    """Returns (scale bits, effective zero, codes) for one group of floats."""
    if sym:
        s = max(abs(v) for v in vals) / 7 or 1e-3
        z = 8
    else:
        lo, hi = min(min(vals), 0.0), max(max(vals), 0.0)
        s = (hi - lo) / 15 or 1e-3
        z = min(15, max(0, round(-lo / s)))
    sb = scale_enc(s)
    sv = scale_dec(sb)
    q = [min(15, max(0, round(v / sv) + z)) for v in vals]
    return sb, z, q


def w4_quantize(w, n, k, groups_of_k, ngroups, sym, scale_enc, scale_dec):
    """w: row-major [n][k] floats. Returns scale[n][g] bits, zero[n][g], q[n][k]."""
    members = [[] for _ in range(ngroups)]
    for kk in range(k):
        members[groups_of_k[kk]].append(kk)
    S = [[0] * ngroups for _ in range(n)]
    Z = [[0] * ngroups for _ in range(n)]
    Q = [[0] * k for _ in range(n)]
    for r in range(n):
        row = w[r * k:(r + 1) * k]
        for g, cols in enumerate(members):
            sb, z, q = quant_group([row[c] for c in cols], sym, scale_enc, scale_dec)
            S[r][g], Z[r][g] = sb, z
            for c, qq in zip(cols, q):
                Q[r][c] = qq
    return S, Z, Q


def w4_twin(n, k, groups_of_k, S, Z, Q, scale_dec):
    return [f32(scale_dec(S[r][groups_of_k[c]]) * (Q[r][c] - Z[r][groups_of_k[c]])) for r in range(n) for c in range(k)]


def as_i32(u):
    return u - (1 << 32) if u >= 1 << 31 else u


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i holds logical column AWQ_ORDER[i]


def fmt_awq(name, n, k, w, opts, out):
    G = opts["group_size"]
    gk = [kk // G for kk in range(k)]
    S, Z, Q = w4_quantize(w, n, k, gk, k // G, False, f16_bits, f16_val)
    qweight = [0] * (k * n // 8)
    qzeros = [0] * (k // G * n // 8)
    for kk in range(k):
        for c8 in range(n // 8):
            word = 0
            for i in range(8):
                word |= Q[c8 * 8 + AWQ_ORDER[i]][kk] << (4 * i)
            qweight[kk * (n // 8) + c8] = as_i32(word)
    for g in range(k // G):
        for c8 in range(n // 8):
            word = 0
            for i in range(8):
                word |= Z[c8 * 8 + AWQ_ORDER[i]][g] << (4 * i)
            qzeros[g * (n // 8) + c8] = as_i32(word)
    out[name + ".qweight"] = ("I32", [k, n // 8], qweight)
    out[name + ".qzeros"] = ("I32", [k // G, n // 8], qzeros)
    out[name + ".scales"] = ("F16", [k // G, n], [S[r][g] for g in range(k // G) for r in range(n)])
    return w4_twin(n, k, gk, S, Z, Q, f16_val)


def fmt_gptq(name, n, k, w, opts, out, rng):
    G = k if opts["group_size"] == -1 else opts["group_size"]
    ng = k // G
    if opts["desc_act"]:
        perm = list(range(k))
        rng.shuffle(perm)
        gk = [0] * k
        for i, kk in enumerate(perm):
            gk[kk] = i // G
    else:
        gk = [kk // G for kk in range(k)]
    S, Z, Q = w4_quantize(w, n, k, gk, ng, opts["sym"], f16_bits, f16_val)
    v1 = opts["checkpoint_format"] == "gptq"
    if v1:  # v1 stores zero - 1 (4 bits); readers add 1 back. Keep effective zeros in 1..15.
        for r in range(n):
            for g in range(ng):
                if Z[r][g] == 0:
                    raise SystemExit("test bug: a v1 zero of 0 does not survive the minus-one storage")
    qweight = [0] * (k // 8 * n)
    for k8 in range(k // 8):
        for c in range(n):
            word = 0
            for i in range(8):
                word |= Q[c][k8 * 8 + i] << (4 * i)
            qweight[k8 * n + c] = as_i32(word)
    qzeros = [0] * (ng * n // 8)
    for g in range(ng):
        for c8 in range(n // 8):
            word = 0
            for i in range(8):
                word |= ((Z[c8 * 8 + i][g] - (1 if v1 else 0)) & 15) << (4 * i)
            qzeros[g * (n // 8) + c8] = as_i32(word)
    out[name + ".qweight"] = ("I32", [k // 8, n], qweight)
    out[name + ".qzeros"] = ("I32", [ng, n // 8], qzeros)
    out[name + ".scales"] = ("F16", [ng, n], [S[r][g] for g in range(ng) for r in range(n)])
    out[name + ".g_idx"] = ("I32", [k], gk)
    return w4_twin(n, k, gk, S, Z, Q, f16_val)


def fmt_ct(name, n, k, w, opts, out):
    G = opts["group_size"]
    ng = k // G
    gk = [kk // G for kk in range(k)]
    S, Z, Q = w4_quantize(w, n, k, gk, ng, opts["symmetric"], bf16_bits, bf16_val)
    # Codes and zero points are stored unsigned: signed int4 value + 8 (so q and z as computed).
    packed = [0] * (n * k // 8)
    for r in range(n):
        for k8 in range(k // 8):
            word = 0
            for i in range(8):
                word |= Q[r][k8 * 8 + i] << (4 * i)
            packed[r * (k // 8) + k8] = as_i32(word)
    out[name + ".weight_packed"] = ("I32", [n, k // 8], packed)
    out[name + ".weight_scale"] = ("BF16", [n, ng], [S[r][g] for r in range(n) for g in range(ng)])
    out[name + ".weight_shape"] = ("I64", [2], [n, k])
    if not opts["symmetric"]:
        zp = [0] * ((n + 7) // 8 * ng)
        for r8 in range((n + 7) // 8):
            for g in range(ng):
                word = 0
                for i in range(8):
                    if r8 * 8 + i < n:
                        word |= Z[r8 * 8 + i][g] << (4 * i)
                zp[r8 * ng + g] = as_i32(word)
        out[name + ".weight_zero_point"] = ("I32", [(n + 7) // 8, ng], zp)
    return w4_twin(n, k, gk, S, Z, Q, bf16_val)


def fmt_fp8(name, n, k, w, opts, out):
    bn, bk = opts["weight_block_size"]
    sn, sk = (n + bn - 1) // bn, (k + bk - 1) // bk
    scale = [0.0] * (sn * sk)
    for i in range(sn):
        for j in range(sk):
            amax = max(abs(w[r * k + c]) for r in range(i * bn, min(n, (i + 1) * bn)) for c in range(j * bk, min(k, (j + 1) * bk)))
            scale[i * sk + j] = f32(amax / 448 if amax else 1.0)
    codes, twin = [], []
    for r in range(n):
        for c in range(k):
            s = scale[(r // bn) * sk + c // bk]
            q = e4m3_code(w[r * k + c] / s)
            codes.append(q)
            twin.append(f32(e4m3_val(q) * s))
    out[name + ".weight"] = ("F8_E4M3", [n, k], codes)
    out[name + ".weight_scale_inv"] = ("F32", [sn, sk], scale)
    return twin


def fmt_nvfp4(name, n, k, w, opts, out):
    amax = max(abs(v) for v in w)
    g = f32(amax / (6 * 448))
    if opts.get("compressed"):
        # compressed-tensors stores gs with effective scale = e4m3 / gs; readers (vLLM, and
        # qwen36) take g = 1 / gs once in f32 and multiply: the twin uses that same g.
        gs = f32(1.0 / g)
        g = f32(1.0 / gs)
    scales, codes, twin = [], [], []
    for r in range(n):
        row_codes = []
        for b in range(k // 16):
            vals = w[r * k + 16 * b:r * k + 16 * b + 16]
            sc = e4m3_code(max(abs(v) for v in vals) / 6 / g)
            sv = e4m3_val(sc) or 1.0
            scales.append(sc)
            for v in vals:
                q = e2m1_code(v / (sv * g))
                row_codes.append(q)
                twin.append(f32(e2m1_val(q) * e4m3_val(sc) * g))  # e2m1 * e4m3 is exact
        codes += [row_codes[2 * i] | (row_codes[2 * i + 1] << 4) for i in range(k // 2)]
    if opts.get("compressed"):  # compressed-tensors: names differ, the global scale is divided
        out[name + ".weight_packed"] = ("U8", [n, k // 2], codes)
        out[name + ".weight_scale"] = ("F8_E4M3", [n, k // 16], scales)
        out[name + ".weight_global_scale"] = ("F32", [1], [gs])
        out[name + ".input_global_scale"] = ("F32", [1], [1.0])
    else:
        out[name + ".weight"] = ("U8", [n, k // 2], codes)
        out[name + ".weight_scale"] = ("F8_E4M3", [n, k // 16], scales)
        out[name + ".weight_scale_2"] = ("F32", [], [g])
        out[name + ".input_scale"] = ("F32", [], [1.0])
    return twin


# format -> (hidden size, in_features the layout needs divisible by, writer, config entries)
FORMATS = {
    "awq": (64, 64, "awq", {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True,
                           "version": "gemm"}),
    "gptq-actorder": (64, 32, "gptq", {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True,
                                       "sym": False, "checkpoint_format": "gptq"}),
    "gptq-sym": (64, 32, "gptq", {"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": False,
                                  "sym": True, "checkpoint_format": "gptq_v2"}),
    "ct-int4": (64, 32, "ct", {"quant_method": "compressed-tensors", "format": "pack-quantized",
                               "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                                             "weights": {"num_bits": 4, "type": "int",
                                                                         "symmetric": False, "strategy": "group",
                                                                         "group_size": 32}}}}),
    "ct-int4-sym-g128": (64, 128, "ct", {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                         "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                                                       "weights": {"num_bits": 4, "type": "int",
                                                                                   "symmetric": True, "strategy": "group",
                                                                                   "group_size": 128}}}}),
    "fp8": (128, 128, "fp8", {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                              "weight_block_size": [128, 128]}),
    "nvfp4": (64, 64, "nvfp4", None),  # modelopt: hf_quant_config.json
    "ct-nvfp4": (64, 64, "nvfp4", {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                                   "config_groups": {"group_0": {"targets": ["Linear"],
                                                                 "input_activations": None,
                                                                 "weights": {"num_bits": 4, "type": "float",
                                                                             "strategy": "tensor_group",
                                                                             "group_size": 16}}}}),
}


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "data", "quant")
    for fmt_name, (hidden, kdiv, writer, qcfg) in FORMATS.items():
        rng = random.Random(sum(map(ord, fmt_name)) + 1)
        cfg = make_config(hidden)
        base, lin = make_model(cfg, seed=sum(map(ord, fmt_name)))
        quant = {n: ("BF16", s, v) for n, (s, v) in base.items()}
        twin = dict(quant)
        ignore = ["lm_head"]
        for name, (n, k) in sorted(lin.items()):
            if n % 8 or k % kdiv:  # packing needs N % 8; the group / block needs K % kdiv
                ignore.append(name)
                continue
            w = weights_f32(base[name + ".weight"][1])
            del quant[name + ".weight"]
            opts = dict(qcfg or {})
            if writer == "ct":
                opts = dict(qcfg["config_groups"]["group_0"]["weights"])
            if writer == "nvfp4" and qcfg is not None:
                opts = {"compressed": True}
            if writer == "awq":
                tw = fmt_awq(name, n, k, w, opts, quant)
            elif writer == "gptq":
                tw = fmt_gptq(name, n, k, w, opts, quant, rng)
            elif writer == "ct":
                tw = fmt_ct(name, n, k, w, opts, quant)
            elif writer == "fp8":
                tw = fmt_fp8(name, n, k, w, opts, quant)
            else:
                tw = fmt_nvfp4(name, n, k, w, opts, quant)
            twin[name + ".weight"] = ("F32", [n, k], tw)
        d = os.path.join(out_dir, fmt_name)
        os.makedirs(os.path.join(d, "f32"), exist_ok=True)
        qc = dict(cfg)
        if qcfg is None:
            with open(os.path.join(d, "hf_quant_config.json"), "w") as f:
                json.dump({"producer": {"name": "modelopt", "version": "0.35.0"},
                           "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                                            "exclude_modules": ignore}}, f, indent=1)
        else:
            q = dict(qcfg)
            q["ignore" if q["quant_method"] == "compressed-tensors" else "modules_to_not_convert"] = ignore
            qc["quantization_config"] = q
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(qc, f, indent=1)
        with open(os.path.join(d, "f32", "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        write_safetensors(os.path.join(d, "model.safetensors"), quant)
        write_safetensors(os.path.join(d, "f32", "model.safetensors"), twin)
        print("%-18s quantized %d linears, left %d modules unquantized" % (fmt_name, len(lin) - len(ignore) + 1, len(ignore)))


if __name__ == "__main__":
    main()
