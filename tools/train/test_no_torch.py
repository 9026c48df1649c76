#!/usr/bin/env python3
"""Checks of tools/train that need no torch (run here: python3 tools/train/test_no_torch.py).

build_corpus: filters, exact-duplicate removal, the deterministic held-out split, the byte cap,
uint32 token output with a stand-in tokenizer (HF `tokenizers` is only on the GPU machine);
pack.sh / unpack.sh: a split round trip.
"""
import array
import hashlib
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import build_corpus as bc  # noqa: E402


def fake_encode(texts):
    return [list(t.encode("utf-8")) for t in texts]


class BuildCorpus(unittest.TestCase):
    def make_tree(self, d):
        files = {
            "pkg/a.py": "def a():\n    return 1\n" * 20,
            "pkg/b.py": "def a():\n    return 1\n" * 20,           # duplicate of a.py
            "pkg/c.py": "x = '" + "y" * 900 + "'\n",               # long line
            "pkg/d.py": "1, 2, 3, 4, 5, 6, 7, 8\n" * 40,           # a number table
            "pkg/e.py": "print('hi')\n",                            # too small
            "pkg/__pycache__/f.py": "def f():\n    pass\n" * 30,    # skipped folder
            "pkg/g.txt": "def g():\n    pass\n" * 30,               # not .py
        }
        for i in range(40):
            files[f"pkg/mod{i}.py"] = f"class C{i}:\n    def method(self, value):\n        return value + {i}\n" * 5
        for name, text in files.items():
            p = os.path.join(d, name)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w") as f:
                f.write(text)
        with open(os.path.join(d, "pkg/bad.py"), "wb") as f:
            f.write(b"\xff\xfe def broken\n" * 20)

    def test_collect_filters_dedupe_split(self):
        with tempfile.TemporaryDirectory() as d:
            self.make_tree(d)
            args = bc.parse_args(["--out", os.path.join(d, "out"), "--min-bytes", "50", "--val-permille", "200"])
            stats = dict(candidates_seen=0, skipped_size=0, skipped_binary=0, skipped_not_utf8=0,
                         skipped_long_line=0, skipped_low_letters=0, skipped_empty=0, skipped_unreadable=0,
                         skipped_duplicate=0, stopped_at_max_bytes=False)
            train, val = bc.collect([("site-packages", d)], args, stats)
            names = {n for _, n, _ in train + val}
            self.assertEqual(len(train) + len(val), 41)  # 40 modules + one of a.py / b.py
            self.assertEqual(stats["skipped_duplicate"], 1)
            self.assertEqual(stats["skipped_long_line"], 1)
            self.assertEqual(stats["skipped_low_letters"], 1)
            self.assertEqual(stats["skipped_not_utf8"], 1)
            self.assertEqual(stats["skipped_size"], 1)
            self.assertFalse(any("__pycache__" in n or n.endswith(".txt") for n in names))
            self.assertTrue(all(n.startswith("site-packages/pkg/") for n in names))
            self.assertTrue(val, "a 20% split of 41 files should hold some out")
            for h, _, text in train + val:
                self.assertEqual(h, hashlib.sha256(text.encode()).hexdigest())
                self.assertEqual(bc.is_val(h, 200), (h, _, text) in val)
            self.assertEqual([x[0] for x in train], sorted(x[0] for x in train))
            # Same tree, same result; a byte cap takes a prefix of the fixed name order.
            again = bc.collect([("site-packages", d)], args, dict(stats))
            self.assertEqual((train, val), again)
            capped = bc.parse_args(["--out", "x", "--min-bytes", "50", "--max-bytes", "2000"])
            t2, v2 = bc.collect([("site-packages", d)], capped, dict(stats))
            self.assertLess(len(t2) + len(v2), 41)

    def test_tokens_and_manifest(self):
        with tempfile.TemporaryDirectory() as d:
            docs = [("00", "x", "ab\n"), ("01", "y", "c\n")]
            n, h = bc.write_tokens(docs, fake_encode, 7, os.path.join(d, "t.bin"), batch=1)
            data = open(os.path.join(d, "t.bin"), "rb").read()
            a = array.array("I")
            a.frombytes(data)
            if sys.byteorder != "little":
                a.byteswap()
            self.assertEqual(list(a), [97, 98, 10, 7, 99, 10, 7])
            self.assertEqual(n, 7)
            self.assertEqual(h, hashlib.sha256(data).hexdigest())

    def test_this_machines_stdlib(self):
        with tempfile.TemporaryDirectory() as d:
            m = bc.main(["--out", d, "--no-tokenize", "--limit-files", "50"])
            self.assertEqual(m["files"]["train"] + m["files"]["val"], 50)
            self.assertTrue(os.path.exists(os.path.join(d, "train_files.txt")))


class PackRoundTrip(unittest.TestCase):
    def test_pack_unpack(self):
        with tempfile.TemporaryDirectory() as d:
            run = os.path.join(d, "run")
            os.makedirs(os.path.join(run, "hf"))
            blob = os.urandom(40 << 20)
            with open(os.path.join(run, "hf", "model.safetensors"), "wb") as f:
                f.write(blob)
            with open(os.path.join(run, "MODEL_CARD.md"), "w") as f:
                f.write("card\n")
            out1, out2 = os.path.join(d, "o1"), os.path.join(d, "o2")
            r = subprocess.run(["bash", os.path.join(HERE, "pack.sh"), run, out1, "0", "2"], capture_output=True,
                               text=True, check=True)
            self.assertIn("next FIRST_PART=2", r.stdout)
            r = subprocess.run(["bash", os.path.join(HERE, "pack.sh"), run, out2, "2", "2"], capture_output=True,
                               text=True, check=True)
            self.assertIn("last part", r.stdout)
            for o in (out1, out2):
                self.assertLessEqual(len(os.listdir(o)), 8)
                for f in os.listdir(o):
                    self.assertLessEqual(os.path.getsize(os.path.join(o, f)), 16 << 20)
            dest = os.path.join(d, "back")
            tok = os.path.join(HERE, "..", "..", ".models", "qwen3-tokenizer", "tokenizer.json")
            if not os.path.exists(tok):
                self.skipTest("no .models/qwen3-tokenizer (scripts/fetch-tokenizer.sh)")
            subprocess.run(["bash", os.path.join(HERE, "unpack.sh"), dest, out1, out2], capture_output=True,
                           check=True)
            self.assertEqual(open(os.path.join(dest, "hf", "model.safetensors"), "rb").read(), blob)
            self.assertTrue(os.path.exists(os.path.join(dest, "hf", "tokenizer.json")))


if __name__ == "__main__":
    unittest.main()
