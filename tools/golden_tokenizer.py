#!/usr/bin/env python3
"""Golden token ids from Hugging Face `tokenizers` for the qwen36 tokenizer tests.

Usage (on a machine with `pip install tokenizers`):
    python3 tools/golden_tokenizer.py .models/qwen3-tokenizer/tokenizer.json \
        tests/data/tokenizer/corpus OUTDIR

For every CORPUS/<name>.txt it writes to OUTDIR:
    <name>.ids.i32          ids from the tokenizer.json as given
    <name>.qwen35.ids.i32   ids from the same file with its Split regex replaced by the
                            Qwen3.5/3.6 pattern (keeps \\p{M} with letters), so both patterns
                            are checked against the reference
All files are int32 little-endian with no header. Text is read as raw UTF-8 bytes (no newline
translation) and encoded with add_special_tokens=False, special tokens in the text parsed.
"""
import json
import pathlib
import struct
import sys

from tokenizers import Tokenizer

QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def with_qwen35_pattern(tokenizer_json: str) -> Tokenizer:
    spec = json.loads(pathlib.Path(tokenizer_json).read_text(encoding="utf-8"))
    replaced = 0
    for step in spec["pre_tokenizer"].get("pretokenizers", [spec["pre_tokenizer"]]):
        if step.get("type") == "Split" and "Regex" in step.get("pattern", {}):
            step["pattern"]["Regex"] = QWEN35_PATTERN
            replaced += 1
    if replaced != 1:
        raise SystemExit(f"expected one Split regex in {tokenizer_json}, found {replaced}")
    return Tokenizer.from_str(json.dumps(spec))


def write_ids(path: pathlib.Path, ids: list[int]) -> None:
    path.write_bytes(struct.pack(f"<{len(ids)}i", *ids))


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    tokenizer_json, corpus_dir, out_dir = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    out_dir.mkdir(parents=True, exist_ok=True)
    variants = {
        "": Tokenizer.from_file(tokenizer_json),
        ".qwen35": with_qwen35_pattern(tokenizer_json),
    }
    files = sorted(corpus_dir.glob("*.txt"))
    if not files:
        raise SystemExit(f"no .txt files in {corpus_dir}")
    for f in files:
        text = f.read_bytes().decode("utf-8")
        for suffix, tok in variants.items():
            ids = tok.encode(text, add_special_tokens=False).ids
            write_ids(out_dir / f"{f.stem}{suffix}.ids.i32", ids)
            print(f"{f.stem}{suffix}: {len(text.encode('utf-8'))} bytes -> {len(ids)} ids")
    print(f"wrote {len(files) * len(variants)} files to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
