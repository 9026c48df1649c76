#!/usr/bin/env python3
"""Builds the training corpus: the Python sources installed on this machine, tokenized.

    python3 tools/train/build_corpus.py --tokenizer .models/qwen3-tokenizer/tokenizer.json --out DIR

Recipe (the corpus itself is never committed; this script is the recipe):
  1. Roots: the standard library (sysconfig "stdlib") and every site-packages / dist-packages
     folder (sysconfig purelib/platlib, site.getsitepackages(), the user site). A root nested in
     another is walked once, under its own label.
  2. Candidates: *.py files of MIN..MAX bytes, outside __pycache__ and *.dist-info / *.egg-info.
     Each is named "<label>/<path relative to its root>" (label: stdlib or site-packages), so
     names do not depend on where Python is installed.
  3. Order: candidates sorted by sha256 of that name (a fixed pseudo-random order), read in
     that order until --max-bytes of accepted text; so a byte cap is a deterministic sample.
  4. Filters: UTF-8 only; no NUL bytes; longest line <= --max-line; at least 25% letters
     (drops data tables); exact duplicates dropped by sha256 of the content.
  5. Split: a file is held out (val) when int(sha256(content)[:8], 16) % 1000 < --val-permille.
  6. Documents in each split are ordered by content hash, tokenized with the real Qwen3
     tokenizer (HF `tokenizers`, no special tokens added) and concatenated, each followed by
     <|endoftext|>. Written as little-endian uint32: train.bin, val.bin; manifest.json holds
     the recipe, the counts and sha256 of every output; train_files.txt / val_files.txt list
     "sha256  name  bytes".
Only the standard library is needed up to tokenization; `tokenizers` is imported lazily.
"""
import argparse
import array
import hashlib
import json
import os
import site
import sys
import sysconfig
import time

EOS_TOKEN = "<|endoftext|>"
_ASCII_LETTERS = bytes(range(ord("A"), ord("Z") + 1)) + bytes(range(ord("a"), ord("z") + 1))


def default_roots():
    """[(label, path)] of the folders whose *.py files make the corpus, deduplicated."""
    roots = []
    paths = sysconfig.get_paths()
    roots.append(("stdlib", paths.get("stdlib")))
    sp = [paths.get("purelib"), paths.get("platlib")]
    try:
        sp += list(site.getsitepackages())
    except AttributeError:  # some virtualenvs lack it
        pass
    try:
        sp.append(site.getusersitepackages())
    except AttributeError:
        pass
    sp += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    roots += [("site-packages", p) for p in sp]
    out, seen = [], set()
    for label, p in roots:
        if not p or not os.path.isdir(p):
            continue
        real = os.path.realpath(p)
        if real in seen:
            continue
        seen.add(real)
        out.append((label, real))
    return out


def list_candidates(roots, min_bytes, max_bytes, stats):
    """[(name, path, size)] of *.py files under roots; a nested root is skipped by its parent."""
    root_paths = {p for _, p in roots}
    cands = []
    for label, root in roots:
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            keep = []
            for d in sorted(dirnames):
                full = os.path.join(dirpath, d)
                if d == "__pycache__" or d.endswith((".dist-info", ".egg-info")) or full in root_paths:
                    continue
                keep.append(d)
            dirnames[:] = keep
            for f in filenames:
                if not f.endswith(".py"):
                    continue
                full = os.path.join(dirpath, f)
                try:
                    if os.path.islink(full):
                        continue
                    size = os.path.getsize(full)
                except OSError:
                    continue
                stats["candidates_seen"] += 1
                if size < min_bytes or size > max_bytes:
                    stats["skipped_size"] += 1
                    continue
                name = label + "/" + os.path.relpath(full, root).replace(os.sep, "/")
                cands.append((name, full, size))
    return cands


def name_order_key(name):
    return hashlib.sha256(name.encode("utf-8")).hexdigest()


def accept_text(raw, max_line, stats):
    """The file's text if it passes the filters, else None (the reason is counted in stats)."""
    if b"\0" in raw:
        stats["skipped_binary"] += 1
        return None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        stats["skipped_not_utf8"] += 1
        return None
    if text.startswith("\ufeff"):
        text = text[1:]
    text = text.replace("\r\n", "\n")
    lines = text.split("\n")
    if max(map(len, lines)) > max_line:
        stats["skipped_long_line"] += 1
        return None
    letters = len(raw) - len(raw.translate(None, _ASCII_LETTERS))  # C speed; non-ASCII letters not counted
    if letters < 0.25 * len(raw):
        stats["skipped_low_letters"] += 1
        return None
    if not text.strip():
        stats["skipped_empty"] += 1
        return None
    if not text.endswith("\n"):
        text += "\n"
    return text


def is_val(content_hash, val_permille):
    return int(content_hash[:8], 16) % 1000 < val_permille


def collect(roots, args, stats):
    """(train_docs, val_docs): lists of (content_sha256, name, text), each ordered by hash."""
    cands = list_candidates(roots, args.min_bytes, args.max_file_bytes, stats)
    cands.sort(key=lambda c: (name_order_key(c[0]), c[0]))
    seen, train, val = set(), [], []
    total = 0
    for name, path, _ in cands:
        if args.limit_files and len(train) + len(val) >= args.limit_files:
            break
        if total >= args.max_bytes:
            stats["stopped_at_max_bytes"] = True
            break
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError:
            stats["skipped_unreadable"] += 1
            continue
        text = accept_text(raw, args.max_line, stats)
        if text is None:
            continue
        h = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if h in seen:
            stats["skipped_duplicate"] += 1
            continue
        seen.add(h)
        total += len(text.encode("utf-8"))
        (val if is_val(h, args.val_permille) else train).append((h, name, text))
    train.sort()
    val.sort()
    return train, val


def load_tokenizer(path):
    """encode(list[str]) -> list[list[int]], eos id, vocab size (ids incl. added tokens)."""
    from tokenizers import Tokenizer  # only needed here; the rest runs without it

    tok = Tokenizer.from_file(path)
    eos = tok.token_to_id(EOS_TOKEN)
    if eos is None:
        raise SystemExit(f"{path}: no {EOS_TOKEN} token")

    def encode(texts):
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]

    return encode, eos, tok.get_vocab_size(with_added_tokens=True)


def write_tokens(docs, encode, eos, path, batch=512):
    """Tokenizes docs (in order) into path as uint32 LE, each doc followed by eos. Returns count."""
    n = 0
    h = hashlib.sha256()
    with open(path, "wb") as f:
        for i in range(0, len(docs), batch):
            texts = [d[2] for d in docs[i:i + batch]]
            buf = array.array("I")
            assert buf.itemsize == 4
            for ids in encode(texts):
                buf.extend(ids)
                buf.append(eos)
            if sys.byteorder != "little":
                buf.byteswap()
            data = buf.tobytes()
            f.write(data)
            h.update(data)
            n += len(buf)
    return n, h.hexdigest()


def write_list(docs, path):
    with open(path, "w", encoding="utf-8") as f:
        for h, name, text in docs:
            f.write(f"{h}  {name}  {len(text.encode('utf-8'))}\n")


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def package_versions():
    try:
        from importlib import metadata
        out = {}
        for d in metadata.distributions():
            name = d.metadata.get("Name")
            if name:
                out[name.lower()] = d.version
        return dict(sorted(out.items()))
    except Exception as e:  # never fail the corpus over provenance
        return {"error": repr(e)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--tokenizer", default=".models/qwen3-tokenizer/tokenizer.json")
    p.add_argument("--root", action="append", default=None,
                   help="LABEL=PATH to walk instead of the defaults (repeatable)")
    p.add_argument("--max-bytes", type=int, default=200 << 20, help="stop after this much accepted text")
    p.add_argument("--max-file-bytes", type=int, default=200_000)
    p.add_argument("--min-bytes", type=int, default=200)
    p.add_argument("--max-line", type=int, default=400, help="longest line allowed (characters)")
    p.add_argument("--val-permille", type=int, default=20, help="held-out share, per mille of files")
    p.add_argument("--limit-files", type=int, default=0, help="stop after N accepted files (tests)")
    p.add_argument("--no-tokenize", action="store_true", help="walk, filter, split and list only")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    t0 = time.time()
    if args.root:
        roots = []
        for r in args.root:
            label, _, path = r.partition("=")
            if not path:
                raise SystemExit(f"--root {r}: expected LABEL=PATH")
            roots.append((label, os.path.realpath(path)))
    else:
        roots = default_roots()
    stats = dict(candidates_seen=0, skipped_size=0, skipped_binary=0, skipped_not_utf8=0, skipped_long_line=0,
                 skipped_low_letters=0, skipped_empty=0, skipped_unreadable=0, skipped_duplicate=0,
                 stopped_at_max_bytes=False)
    os.makedirs(args.out, exist_ok=True)
    train, val = collect(roots, args, stats)
    t_walk = time.time() - t0
    print(f"build_corpus: {len(train)} train + {len(val)} val files "
          f"({sum(len(d[2]) for d in train + val) / 1e6:.1f} M chars) in {t_walk:.1f}s; {stats}", flush=True)
    write_list(train, os.path.join(args.out, "train_files.txt"))
    write_list(val, os.path.join(args.out, "val_files.txt"))

    manifest = dict(
        recipe=dict(script="tools/train/build_corpus.py", roots=[{"label": l, "path": p} for l, p in roots],
                    max_bytes=args.max_bytes, max_file_bytes=args.max_file_bytes, min_bytes=args.min_bytes,
                    max_line=args.max_line, val_permille=args.val_permille, limit_files=args.limit_files,
                    order="files by sha256(name); each split's docs by sha256(content); eos after each doc",
                    dtype="uint32 little-endian"),
        python=sys.version, platform=sys.platform, stats=stats,
        files=dict(train=len(train), val=len(val)),
        bytes=dict(train=sum(len(d[2].encode("utf-8")) for d in train),
                   val=sum(len(d[2].encode("utf-8")) for d in val)),
        packages=package_versions(),
    )
    if not args.no_tokenize:
        encode, eos, vocab = load_tokenizer(args.tokenizer)
        n_train, h_train = write_tokens(train, encode, eos, os.path.join(args.out, "train.bin"))
        n_val, h_val = write_tokens(val, encode, eos, os.path.join(args.out, "val.bin"))
        manifest.update(tokenizer=dict(path=args.tokenizer, sha256=file_sha256(args.tokenizer), eos_token=EOS_TOKEN,
                                       eos_id=eos, vocab_size=vocab),
                        tokens=dict(train=n_train, val=n_val), sha256=dict(train_bin=h_train, val_bin=h_val))
        print(f"build_corpus: {n_train} train tokens, {n_val} val tokens "
              f"({manifest['bytes']['train'] / max(n_train, 1):.2f} bytes/token), {time.time() - t0:.1f}s", flush=True)
    manifest["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


if __name__ == "__main__":
    main()
