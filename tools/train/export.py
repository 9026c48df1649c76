#!/usr/bin/env python3
"""Exports a train.py checkpoint as a Hugging Face checkpoint the engine loads, and a model card.

    python3 tools/train/export.py --ckpt TRAIN_DIR/checkpoint.pt --out HF_DIR \
        [--tokenizer-dir .models/qwen3-tokenizer] [--corpus CORPUS_DIR] [--metrics TRAIN_DIR/metrics.json] \
        [--card MODEL_CARD.md] [--check CHECK_DIR]

HF_DIR gets config.json (qwen3_5_text, Qwen3_5ForCausalLM, mtp_num_hidden_layers 1),
model.safetensors (bf16; main weights as transformers saves them plus mtp.* under the names
src/format/hf_loader.cpp loads), generation_config.json (eos ids), tokenizer.json and
tokenizer_config.json. The export is then reloaded with transformers and compared with the
trained weights. With --check, CHECK_DIR gets a reference case for the engine, computed in
float32 on the CPU from the exported bf16 weights (as tests/data/golden): tokens.i32, logits.f32
[n x vocab], mtp_logits.f32 [(n-1) x vocab] and case.json (a greedy generation from a code prompt).
"""
import argparse
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import MTPHead, make_config  # noqa: E402

EOS_IDS_EXTRA = ["<|im_end|>"]  # the chat turn end also stops generation


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer-dir", default=".models/qwen3-tokenizer")
    p.add_argument("--corpus", default=None, help="corpus folder (manifest.json) for the model card")
    p.add_argument("--metrics", default=None, help="train metrics.json for the model card")
    p.add_argument("--card", default=None, help="where to write the model card (markdown)")
    p.add_argument("--check", default=None, help="folder for the engine reference case")
    p.add_argument("--check-tokens", type=int, default=8, help="held-out tokens in the logits reference")
    p.add_argument("--prompt", default="def fibonacci(n):")
    p.add_argument("--greedy-tokens", type=int, default=48)
    return p.parse_args(argv)


def token_id(tok, s):
    i = tok.token_to_id(s)
    if i is None:
        raise SystemExit(f"tokenizer has no {s}")
    return i


def export(args):
    ckpt = torch.load(args.ckpt, map_location="cpu", weights_only=False)
    cd = ckpt["config"]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    eos = token_id(tok, "<|endoftext|>")
    cfg = make_config(cd["vocab_size"], ckpt["args"]["preset"], eos_token_id=eos, pad_token_id=eos)
    lm = AutoModelForCausalLM.from_config(cfg)
    lm.load_state_dict(ckpt["lm"], strict=True)
    lm = lm.to(torch.bfloat16).eval()
    os.makedirs(args.out, exist_ok=True)
    lm.save_pretrained(args.out, safe_serialization=True)

    path = os.path.join(args.out, "model.safetensors")
    if not os.path.exists(path):
        raise SystemExit(f"{args.out}: save_pretrained wrote no single model.safetensors (sharded?)")
    tensors = load_file(path)
    for k, v in ckpt["mtp"].items():
        tensors[k] = v.to(torch.bfloat16).contiguous()
    save_file(tensors, path, metadata={"format": "pt"})

    cpath = os.path.join(args.out, "config.json")
    with open(cpath) as f:
        cj = json.load(f)
    cj["mtp_num_hidden_layers"] = 1
    cj["eos_token_id"] = eos
    cj["pad_token_id"] = eos
    cj["bos_token_id"] = None
    with open(cpath, "w") as f:
        json.dump(cj, f, indent=2)
    eos_ids = [eos] + [token_id(tok, s) for s in EOS_IDS_EXTRA]
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump(dict(eos_token_id=eos_ids, pad_token_id=eos, do_sample=False,
                       transformers_version=transformers.__version__), f, indent=2)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(args.tokenizer_dir, name), os.path.join(args.out, name))

    # Reload and compare: the HF loader must see exactly the trained (bf16-rounded) weights.
    ref = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32).eval()
    sd = ref.state_dict()
    worst = 0.0
    for k, v in lm.state_dict().items():
        if k not in sd:
            raise SystemExit(f"reloaded model lacks {k}")
        worst = max(worst, float((sd[k] - v.float()).abs().max()))
    if worst != 0.0:
        raise SystemExit(f"reloaded weights differ from the trained ones by {worst}")
    saved = load_file(path)
    mtp_names = sorted(k for k in saved if k.startswith("mtp."))
    print(f"export: {args.out}: {len(saved)} tensors ({len(mtp_names)} mtp.*), reload identical", flush=True)
    return ckpt, cfg, ref, tok, eos_ids, saved


@torch.no_grad()
def write_check(args, cfg, ref, tok, eos_ids, saved):
    """Reference case in float32 on the CPU, from the exported weights (like tools/make_golden.py)."""
    os.makedirs(args.check, exist_ok=True)
    mtp = MTPHead(cfg).float().eval()
    mtp.load_hf_tensors({k: v.float() for k, v in saved.items() if k.startswith("mtp.")})
    text = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.py")).read()
    ids = tok.encode(text, add_special_tokens=False).ids[: args.check_tokens]
    tokens = torch.tensor([ids], dtype=torch.long)
    hidden = ref.model(input_ids=tokens, use_cache=False).last_hidden_state[0]
    logits = ref.lm_head(hidden).float().contiguous()
    hm = mtp(hidden[None, :-1], ref.model.embed_tokens(tokens[:, 1:]))[0]
    mtp_logits = ref.lm_head(hm).float().contiguous()
    tokens.to(torch.int32).numpy().astype("<i4").tofile(os.path.join(args.check, "tokens.i32"))
    logits.numpy().astype("<f4").tofile(os.path.join(args.check, "logits.f32"))
    mtp_logits.numpy().astype("<f4").tofile(os.path.join(args.check, "mtp_logits.f32"))

    prompt = tok.encode(args.prompt, add_special_tokens=False).ids
    out = ref.generate(torch.tensor([prompt]), max_new_tokens=args.greedy_tokens, do_sample=False,
                       eos_token_id=eos_ids, pad_token_id=eos_ids[0])
    greedy = out[0, len(prompt):].tolist()
    case = dict(prompt=args.prompt, prompt_ids=prompt, greedy_ids=greedy, greedy_text=tok.decode(greedy),
                tokens=ids, vocab=cfg.vocab_size, logits_dtype="float32 (bf16 weights run in float32 on the CPU)",
                transformers=transformers.__version__, torch=torch.__version__)
    with open(os.path.join(args.check, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
    print(f"export: check case in {args.check}; greedy: {args.prompt!r} -> {case['greedy_text']!r}", flush=True)
    return case


def fmt(x, nd=4):
    return "n/a" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def write_card(args, ckpt, cfg, case):
    metrics = json.load(open(args.metrics)) if args.metrics and os.path.exists(args.metrics) else {}
    man = json.load(open(os.path.join(args.corpus, "manifest.json"))) if args.corpus else {}
    ev = metrics.get("final_eval", {})
    tr = metrics.get("final_train_loss") or {}
    pc = metrics.get("params", {})
    a = ckpt.get("args", {})
    pk = man.get("packages", {})
    lines = [
        "# qwen36-small-code: a small Qwen3.5-architecture model trained by qwen36",
        "",
        "A tiny member of the Qwen3.5/3.6 family (Gated DeltaNet + gated attention 3:1, MTP head), trained",
        "from scratch on Python source code so the engine has a real default model and honest MTP acceptance",
        "and quantization figures. **It is a toy**: it writes Python-looking code, nothing more.",
        "",
        "## Architecture",
        "",
        f"- `qwen3_5_text` (`Qwen3_5ForCausalLM`), {cfg.num_hidden_layers} layers "
        f"({cfg.layer_types.count('linear_attention')} Gated DeltaNet, {cfg.layer_types.count('full_attention')} gated "
        f"attention), hidden {cfg.hidden_size}, MLP {cfg.intermediate_size}, tied embeddings, vocab {cfg.vocab_size} "
        "(the Qwen3 tokenizer's ids padded to a multiple of 128)",
        f"- attention: {cfg.num_attention_heads} heads / {cfg.num_key_value_heads} KV heads of {cfg.head_dim}, "
        "partial RoPE 0.25, theta 1e7; DeltaNet: "
        f"{cfg.linear_num_key_heads} key heads x {cfg.linear_key_head_dim}, {cfg.linear_num_value_heads} value heads x "
        f"{cfg.linear_value_head_dim}, conv {cfg.linear_conv_kernel_dim}",
        "- MTP head (`mtp.*`, one full-attention layer, shared embedding / lm_head), trained jointly",
        f"- parameters: {fmt(pc.get('total'))} total, {fmt(pc.get('embedding'))} in the embedding, "
        f"{fmt(pc.get('main_non_embedding'))} in the main layers, {fmt(pc.get('mtp'))} in the MTP head",
        "",
        "## Data",
        "",
        "The `.py` files of the training machine's Python standard library and installed packages, built by",
        "`tools/train/build_corpus.py` (recipe in its docstring): hash-ordered sample, exact duplicates removed,",
        "files with long lines or few letters dropped, held-out split by content hash "
        f"({man.get('recipe', {}).get('val_permille', 'n/a')} per mille of files).",
        "",
        f"- files: {man.get('files')}; bytes: {man.get('bytes')}; tokens: {man.get('tokens')}",
        f"- Python {man.get('python', 'n/a').split()[0] if man.get('python') else 'n/a'}; e.g. torch "
        f"{pk.get('torch', 'n/a')}, transformers {pk.get('transformers', 'n/a')}, numpy {pk.get('numpy', 'n/a')}, "
        f"jax {pk.get('jax', 'n/a')} ({len(pk)} distributions installed)",
        "- the sources keep their own licences (PSF, BSD, MIT, Apache-2.0, ...); the corpus is not shipped.",
        "",
        "## Training",
        "",
        f"- {fmt(metrics.get('steps'))} steps of {a.get('batch')} x {a.get('seq_len')} tokens "
        f"({fmt(metrics.get('tokens'))} tokens, {fmt(metrics.get('epochs'), 2)} epochs) in "
        f"{fmt(metrics.get('train_seconds'))} s on {metrics.get('device', 'n/a')} "
        f"({fmt(metrics.get('tokens_per_s'))} tokens/s; GDN kernel: {metrics.get('gdn_kernel', 'n/a')})",
        f"- AdamW lr {a.get('lr')} (warmup {a.get('warmup')}, cosine to x{a.get('min_lr_ratio')}), weight decay "
        f"{a.get('weight_decay')}, bf16 autocast, seed {a.get('seed')}; loss = CE(next) + {a.get('mtp_weight')} x "
        "CE(MTP, next-next)",
        f"- torch {metrics.get('torch', 'n/a')}, transformers {metrics.get('transformers', 'n/a')}",
        "",
        "## Results (held-out code)",
        "",
        "| figure | value |",
        "| --- | --- |",
        f"| final training loss (main / MTP), mean of the last logged steps | {fmt(tr.get('loss_main'))} / "
        f"{fmt(tr.get('loss_mtp'))} |",
        f"| held-out cross-entropy (nats/token) | {fmt(ev.get('val_loss'))} |",
        f"| held-out perplexity | {fmt(ev.get('val_ppl'), 2)} |",
        f"| held-out next-token top-1 accuracy | {fmt(ev.get('val_top1'))} |",
        f"| MTP head cross-entropy (token t+2) | {fmt(ev.get('val_loss_mtp'))} |",
        f"| MTP first-position top-1 acceptance (argmax = true token t+2) | {fmt(ev.get('mtp_acc'))} |",
        f"| MTP agreement with the model's own argmax at t+1 (teacher-forced greedy verify) | "
        f"{fmt(ev.get('mtp_agree'))} |",
        f"| held-out tokens evaluated | {fmt(ev.get('val_tokens'))} |",
        "",
        "Figures from `tools/train/train.py`'s final evaluation (transformers, bf16 autocast).",
    ]
    if case:
        lines += ["", "## Sample (greedy, transformers, float32)", "", "```python",
                  case["prompt"] + case["greedy_text"], "```"]
    lines += ["", "## Reproduce", "", "```sh", "tools/train/run_all.sh OUTDIR   # on the GPU machine; see tools/train/README.md",
              "```", ""]
    with open(args.card, "w") as f:
        f.write("\n".join(lines))
    print(f"export: model card {args.card}", flush=True)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(0)
    ckpt, cfg, ref, tok, eos_ids, saved = export(args)
    case = write_check(args, cfg, ref, tok, eos_ids, saved) if args.check else None
    if args.card:
        write_card(args, ckpt, cfg, case)


if __name__ == "__main__":
    main()
