#!/usr/bin/env python3
"""A speculative server against a plain one on the same model: greedy completions must be equal
token for token (verification is lossless), and the speculative server must have sampled its
greedy verify rows on the backend (/metrics: qwen36_logit_rows_to_host_total stays 0).

  scripts/spec-serve-check.py SPEC_URL PLAIN_URL
"""
import json
import sys
import urllib.request

PROMPTS = ["def add(a, b):", "for (int i = 0; i < n; ++i) {", "# Read a file line by line in Python\n"]


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def rows_to_host(url):
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("qwen36_logit_rows_to_host_total"):
                return float(line.split()[-1])
    return None


def main():
    spec, plain = sys.argv[1], sys.argv[2]
    failed = 0
    for p in PROMPTS:
        body = {"prompt": p, "max_tokens": 48, "temperature": 0}
        a = post(spec + "/v1/completions", body)["choices"][0]["text"]
        b = post(plain + "/v1/completions", body)["choices"][0]["text"]
        ok = a == b
        failed += not ok
        print(f"{'ok  ' if ok else 'FAIL'} greedy completion equal with --spec mtp: {p!r}" + ("" if ok else f"\n  spec:  {a!r}\n  plain: {b!r}"))
    n = rows_to_host(spec)
    ok = n == 0
    failed += not ok
    print(f"{'ok  ' if ok else 'FAIL'} speculative server's logit rows to the host: {n} (greedy: want 0)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
