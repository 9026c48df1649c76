#!/usr/bin/env python3
"""Smoke checks of a running `qwen36 serve` (the built-in small model), optionally against a
reference server (e.g. the CPU backend while the first one runs on CUDA): the request fields
whose handling goes through the engine's row paths — echo with prompt logprobs, min_tokens with
stop_token_ids, the reasoning budget, prompt_logprobs, structured output with compact whitespace,
assistant prefill, a list of prompts. Standard library
only. Exit status 1 when a check fails.

  scripts/server-smoke.py http://127.0.0.1:8080 [http://127.0.0.1:8081]
"""
import json
import sys
import urllib.request


def post(base, path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def tokens(base, text):
    return post(base, "/tokenize", {"content": text})["tokens"]


def echo_scores(base, prompt):
    r = post(base, "/v1/completions", {"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1})
    return r["choices"][0]["logprobs"]["token_logprobs"]


def main():
    base = sys.argv[1]
    ref = sys.argv[2] if len(sys.argv) > 2 else None
    failures = []

    def check(name, ok, detail=""):
        print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
        if not ok:
            failures.append(name)

    prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n" * 6  # past one 32-row step
    scores = echo_scores(base, prompt)
    n = len(tokens(base, prompt))
    check("echo: a score per prompt token", len(scores) == n and scores[0] is None, f"({len(scores)} of {n})")
    check("echo: scores are log-probabilities", all(s <= 1e-6 for s in scores[1:]))
    if ref:
        other = echo_scores(ref, prompt)
        diff = max(abs(a - b) for a, b in zip(scores[1:], other[1:]))
        mean = sum(abs(a - b) for a, b in zip(scores[1:], other[1:])) / (n - 1)
        check("echo: scores match the reference server", diff < 0.5 and mean < 0.05,
              f"(max |diff| {diff:.4f}, mean {mean:.5f})")

    x = tokens(base, "Hello")[0]
    r = post(base, "/v1/completions", {"prompt": "Say:", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                                       "logit_bias": {str(x): 100}, "stop_token_ids": [x], "min_tokens": 3})
    check("min_tokens holds the stop token", r["usage"]["completion_tokens"] == 3 and
          r["choices"][0]["finish_reason"] == "stop", json.dumps(r["usage"]))

    think = tokens(base, "<think>")
    if len(think) == 1:
        r = post(base, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 10, "temperature": 0, "logprobs": True,
            "logit_bias": {str(think[0]): 100}, "thinking_token_budget": 3,
            "chat_template_kwargs": {"enable_thinking": True}})
        toks = [t["token"] for t in r["choices"][0]["logprobs"]["content"]]
        check("thinking_token_budget forces </think>", len(toks) > 4 and toks[4] == "</think>", repr(toks[:6]))

    r = post(base, "/v1/completions", {"prompt": prompt, "max_tokens": 0, "prompt_logprobs": 1})
    plp = r["choices"][0]["prompt_logprobs"]
    ids = tokens(base, prompt)
    ok = len(plp) == n and all(abs(plp[i][str(ids[i])]["logprob"] - scores[i]) < 1e-4 for i in range(1, n))
    check("prompt_logprobs equal the echo scores", ok)

    r = post(base, "/v1/completions", {"prompt": ["def f():", "import"], "n": 2, "max_tokens": 4,
                                       "temperature": 0})
    check("a list of prompts: n choices each", [c["index"] for c in r["choices"]] == [0, 1, 2, 3])

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "n"]}
    r = post(base, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "A record, please"}], "max_tokens": 60, "temperature": 0.7,
        "seed": 5, "chat_template_kwargs": {"enable_thinking": False},
        "structured_outputs": {"json": schema, "disable_any_whitespace": True}})
    text = r["choices"][0]["message"]["content"]
    try:
        doc = json.loads(text)
        ok = isinstance(doc, dict) and 0 <= doc["n"] <= 99 and "\n" not in text
    except (ValueError, KeyError, TypeError):
        ok = False
    check("structured output, compact whitespace", ok, repr(text))

    msgs = [{"role": "user", "content": "Add two numbers"}, {"role": "assistant", "content": "def add(a, b):"}]
    r = post(base, "/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0})
    check("assistant prefill continues", r["choices"][0]["finish_reason"] in ("stop", "length"),
          repr(r["choices"][0]["message"].get("content")))

    # llama-server's own /completion: its sampler chain with the temperature last (the filters on
    # the untempered distribution, on CUDA through the device's candidate rows) and n_probs.
    r = post(base, "/completion", {"prompt": "def add(a, b):", "n_predict": 6, "temperature": 0.8, "top_k": 5,
                                   "min_p": 0.05, "seed": 3, "n_probs": 3, "samplers": ["top_k", "min_p",
                                                                                     "temperature"]})
    probs = r.get("completion_probabilities", [])
    ok = (r.get("tokens_predicted") == 6 and len(probs) == 6 and
          all(len(p["top_logprobs"]) == 3 and p["top_logprobs"][0]["logprob"] <= 1e-6 for p in probs))
    check("/completion: temperature last, n_probs", ok, repr(r.get("content")))
    if ref:
        greedy = {"prompt": "def add(a, b):", "n_predict": 8, "temperature": 0, "n_probs": 2}
        a, b = post(base, "/completion", greedy), post(ref, "/completion", greedy)
        check("/completion greedy: the reference server's first token",
              a["completion_probabilities"][0]["id"] == b["completion_probabilities"][0]["id"],
              f"({a['content']!r} vs {b['content']!r})")

    print(f"{len(failures)} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
