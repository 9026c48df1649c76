#!/usr/bin/env python3
"""Trains the small Qwen3.5-architecture model and its MTP head on the corpus of build_corpus.py.

    python3 tools/train/train.py --data CORPUS_DIR --out TRAIN_DIR [--budget-minutes 13]

Joint loss: CE(next token) + --mtp-weight * CE(MTP head, token t+2). AdamW, linear warmup then
cosine decay to --min-lr-ratio * lr. The schedule's length: --max-steps when given (fully
reproducible run), else measured: after --calib-steps the step time fixes the step count that
fits the wall-clock budget. The budget is a hard stop either way: the loop ends cleanly, then a
final held-out evaluation runs and checkpoint.pt is written.

Outputs in TRAIN_DIR: train_log.csv, eval_log.csv, metrics.json (final figures), checkpoint.pt
(lm state dict, mtp.* tensors under the engine's names, config, args), saved at every eval too.
"""
import argparse
import csv
import json
import math
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="folder with train.bin, val.bin, manifest.json")
    p.add_argument("--out", required=True)
    p.add_argument("--preset", default="small", help="model size preset in model.py (small, tiny)")
    p.add_argument("--budget-minutes", type=float, default=13.0, help="wall-clock budget of the training loop")
    p.add_argument("--max-steps", type=int, default=0, help="fixed schedule length (0: fit the budget)")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=64, help="sequences per step")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=150)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--mtp-weight", type=float, default=0.3)
    p.add_argument("--ce-chunk", type=int, default=8192, help="tokens per chunk of the vocab projection")
    p.add_argument("--calib-steps", type=int, default=30)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--eval-windows", type=int, default=128, help="held-out sequences per periodic eval")
    p.add_argument("--final-eval-windows", type=int, default=2048, help="held-out sequences of the final eval")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default="cuda", help="cuda (falls back to cpu when absent) or cpu")
    p.add_argument("--no-deterministic", action="store_true", help="skip torch.use_deterministic_algorithms")
    return p.parse_args(argv)


def lr_at(step, args, total_steps):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    if not total_steps:
        return args.lr
    lo = args.lr * args.min_lr_ratio
    p = min(1.0, (step - args.warmup) / max(1, total_steps - args.warmup))
    return lo + 0.5 * (args.lr - lo) * (1.0 + math.cos(math.pi * p))


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic cuBLAS
    import numpy as np
    import torch
    import transformers

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from model import Qwen36Trainable, make_config, padded_vocab, param_counts

    t_start = time.time()
    os.makedirs(args.out, exist_ok=True)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("train: CUDA not available, using the CPU", flush=True)
        args.device = "cpu"
    dev = torch.device(args.device)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    if not args.no_deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = True  # the torch GDN fallback computes in fp32
    torch.backends.cudnn.allow_tf32 = True

    with open(os.path.join(args.data, "manifest.json")) as f:
        manifest = json.load(f)
    tok = manifest["tokenizer"]
    vocab = padded_vocab(tok["vocab_size"], 128)
    train_np = np.fromfile(os.path.join(args.data, "train.bin"), dtype="<u4")
    val_np = np.fromfile(os.path.join(args.data, "val.bin"), dtype="<u4")
    W = args.seq_len + 1
    n_train_win, n_val_win = (len(train_np)) // W, (len(val_np)) // W
    if n_train_win < args.batch or n_val_win < 1:
        raise SystemExit(f"train: corpus too small ({len(train_np)} train / {len(val_np)} val tokens)")
    if int(train_np.max()) >= tok["vocab_size"] or int(val_np.max()) >= tok["vocab_size"]:
        raise SystemExit("train: token id beyond the tokenizer's vocabulary")
    train_t = torch.from_numpy(train_np[: n_train_win * W].astype(np.int32)).to(dev)
    val_t = torch.from_numpy(val_np[: n_val_win * W].astype(np.int32)).to(dev)
    offs = torch.arange(W, device=dev)

    def windows(data, idx):  # [len(idx), W] int64
        return data[(idx[:, None] * W + offs[None, :])].long()

    cfg = make_config(vocab, args.preset, eos_token_id=tok["eos_id"], pad_token_id=None)  # no padding_idx: eos is a real target
    model = Qwen36Trainable(cfg).to(dev)
    counts = param_counts(model)
    fla = bool(getattr(transformers.utils, "is_flash_linear_attention_available", lambda: False)())
    print(f"train: vocab {tok['vocab_size']} -> {vocab}, params {counts}, GDN kernel: "
          f"{'flash-linear-attention' if fla else 'torch fallback (chunked, fp32)'}; "
          f"{n_train_win} train / {n_val_win} val windows of {W}", flush=True)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([dict(params=decay, weight_decay=args.weight_decay),
                             dict(params=no_decay, weight_decay=0.0)],
                            lr=args.lr, betas=(0.9, args.beta2), eps=1e-8, fused=(dev.type == "cuda"))
    amp = dict(device_type=dev.type, dtype=torch.bfloat16)

    def evaluate(n_windows, batch):
        model.eval()
        n = min(n_windows, n_val_win)
        tot = dict(ce_main=0.0, ce_mtp=0.0, top1_main=0, top1_mtp=0, agree_mtp=0)
        nm = nt = 0
        with torch.no_grad(), torch.autocast(**amp):
            for i in range(0, n, batch):
                idx = torch.arange(i, min(i + batch, n), device=dev)
                s, a, b = model.evaluate_batch(windows(val_t, idx), args.ce_chunk)
                for k in tot:
                    tot[k] += s[k]
                nm += a
                nt += b
        model.train()
        ce = tot["ce_main"] / nm
        return dict(val_loss=ce, val_ppl=math.exp(min(ce, 50.0)), val_loss_mtp=tot["ce_mtp"] / nt,
                    val_top1=tot["top1_main"] / nm, mtp_acc=tot["top1_mtp"] / nt, mtp_agree=tot["agree_mtp"] / nt,
                    val_tokens=nm)

    def save(step, tokens_seen, final=False):
        ckpt = dict(config=cfg.to_dict(), lm=model.lm.state_dict(),
                    mtp={k: v.detach().cpu() for k, v in model.mtp.hf_tensors().items()},
                    step=step, tokens=tokens_seen, args=vars(args), final=final)
        tmp = os.path.join(args.out, "checkpoint.pt.tmp")
        torch.save(ckpt, tmp)
        os.replace(tmp, os.path.join(args.out, "checkpoint.pt"))

    train_log = open(os.path.join(args.out, "train_log.csv"), "w", newline="")
    tw = csv.writer(train_log)
    tw.writerow(["step", "tokens", "seconds", "lr", "loss", "loss_main", "loss_mtp", "grad_norm", "tokens_per_s"])
    eval_log = open(os.path.join(args.out, "eval_log.csv"), "w", newline="")
    ew = csv.writer(eval_log)
    ew.writerow(["step", "tokens", "seconds", "val_loss", "val_ppl", "val_loss_mtp", "val_top1", "mtp_acc", "mtp_agree"])

    rng = np.random.default_rng(args.seed)
    perm, pos, epoch = rng.permutation(n_train_win), 0, 0
    budget_s = args.budget_minutes * 60.0
    t_loop = time.time()
    total_steps = args.max_steps or 0
    step, tokens_seen, t_calib0 = 0, 0, None
    tok_per_step = args.batch * args.seq_len
    acc = dict(loss=0.0, loss_main=0.0, loss_mtp=0.0, n=0)
    last_log_t, last_log_tokens, last_eval, stop_reason = time.time(), 0, None, "max_steps"
    model.train()
    while not total_steps or step < total_steps:
        if time.time() - t_loop > budget_s:
            stop_reason = "budget"
            break
        if pos + args.batch > n_train_win:
            epoch += 1
            perm, pos = np.random.default_rng(args.seed + epoch).permutation(n_train_win), 0
        idx = torch.from_numpy(perm[pos:pos + args.batch].astype(np.int64)).to(dev)
        pos += args.batch
        batch = windows(train_t, idx)
        lr = lr_at(step, args, total_steps)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(**amp):
            out = model(batch, mtp_weight=args.mtp_weight, ce_chunk=args.ce_chunk)
        out["loss"].backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens_seen += tok_per_step
        for k in ("loss", "loss_main", "loss_mtp"):
            acc[k] += out[k].detach()
        acc["n"] += 1

        if dev.type == "cuda" and step in (10, args.calib_steps):
            torch.cuda.synchronize()
        if step == 10:
            t_calib0 = time.time()
        if step == args.calib_steps and not args.max_steps and t_calib0 is not None:
            dt = (time.time() - t_calib0) / (args.calib_steps - 10)
            left = budget_s - (time.time() - t_loop)
            total_steps = max(step + 1, step + int(left * 0.96 / dt))
            print(f"train: {dt * 1000:.0f} ms/step, {tok_per_step / dt:.0f} tokens/s -> schedule of {total_steps} "
                  f"steps ({total_steps * tok_per_step / 1e6:.1f} M tokens)", flush=True)
        if step % args.log_every == 0 or step == total_steps:
            now = time.time()
            vals = {k: float(acc[k]) / acc["n"] for k in ("loss", "loss_main", "loss_mtp")}
            if not math.isfinite(vals["loss"]):
                raise SystemExit(f"train: loss is {vals['loss']} at step {step}")
            tps = (tokens_seen - last_log_tokens) / max(now - last_log_t, 1e-9)
            tw.writerow([step, tokens_seen, round(now - t_start, 2), f"{lr:.6g}", f"{vals['loss']:.5f}",
                         f"{vals['loss_main']:.5f}", f"{vals['loss_mtp']:.5f}", f"{float(gn):.4f}", round(tps)])
            train_log.flush()
            if step % (args.log_every * 10) == 0:
                print(f"step {step} tok {tokens_seen / 1e6:.1f}M lr {lr:.2e} loss {vals['loss']:.4f} "
                      f"main {vals['loss_main']:.4f} mtp {vals['loss_mtp']:.4f} gn {float(gn):.2f} "
                      f"{tps:.0f} tok/s {now - t_start:.0f}s", flush=True)
            acc = dict(loss=0.0, loss_main=0.0, loss_mtp=0.0, n=0)
            last_log_t, last_log_tokens = now, tokens_seen
        if step % args.eval_every == 0:
            last_eval = evaluate(args.eval_windows, args.batch)
            ew.writerow([step, tokens_seen, round(time.time() - t_start, 2)] +
                        [f"{last_eval[k]:.5f}" for k in ("val_loss", "val_ppl", "val_loss_mtp", "val_top1",
                                                         "mtp_acc", "mtp_agree")])
            eval_log.flush()
            print(f"eval step {step}: {json.dumps({k: round(v, 4) for k, v in last_eval.items()})}", flush=True)
            save(step, tokens_seen)

    if dev.type == "cuda":
        torch.cuda.synchronize()
    train_seconds = time.time() - t_loop
    final = evaluate(args.final_eval_windows, args.batch)
    ew.writerow([step, tokens_seen, round(time.time() - t_start, 2)] +
                [f"{final[k]:.5f}" for k in ("val_loss", "val_ppl", "val_loss_mtp", "val_top1", "mtp_acc", "mtp_agree")])
    eval_log.close()
    train_log.close()
    save(step, tokens_seen, final=True)
    last_train = None
    try:
        with open(os.path.join(args.out, "train_log.csv")) as f:
            rows = list(csv.DictReader(f))
        if rows:
            tail = rows[-max(1, min(10, len(rows))):]
            last_train = {k: sum(float(r[k]) for r in tail) / len(tail) for k in ("loss", "loss_main", "loss_mtp")}
    except (OSError, ValueError, KeyError):
        pass
    metrics = dict(
        steps=step, scheduled_steps=total_steps, stop_reason=stop_reason, tokens=tokens_seen,
        epochs=tokens_seen / max(1, n_train_win * args.seq_len), train_seconds=round(train_seconds, 1),
        tokens_per_s=round(tokens_seen / max(train_seconds, 1e-9)), final_train_loss=last_train, final_eval=final,
        params=counts, gdn_kernel="flash-linear-attention" if fla else "torch fallback",
        device=torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
        torch=torch.__version__, transformers=transformers.__version__, args=vars(args),
        corpus=dict(tokens=manifest.get("tokens"), files=manifest.get("files"), bytes=manifest.get("bytes")),
        total_seconds=round(time.time() - t_start, 1))
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    print(f"train: done, {step} steps, {tokens_seen / 1e6:.1f} M tokens in {train_seconds:.0f}s; "
          f"final eval {json.dumps({k: round(v, 4) for k, v in final.items()})}", flush=True)


if __name__ == "__main__":
    main()
