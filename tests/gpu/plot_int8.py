#!/usr/bin/env python3
"""Plots docs/benchmarks/int8.json (tests/gpu/int8_bench.py and tests/quality/int8_recall.py on
the H200): single-query p50 of the int8 scan against its re-rank count R, the exact scan and
torch beside it, and the share of answers the error bound proves exact on real embeddings.

  python3 tests/gpu/plot_int8.py docs/benchmarks/int8.json docs/benchmarks/int8.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    d = json.load(open(src))
    lat = d["latency_1M_768_f16"]
    rows = lat["rows"]
    pts = sorted((80 if k.endswith("default") else int(k.split("-R")[1]), v) for k, v in rows.items() if k.startswith("int8"))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot([r for r, _ in pts], [v["p50_us"] for _, v in pts], "o-", label="Kalos int8 (p50, client)")
    a.axhline(rows["exact"]["p50_us"], color="gray", ls="--", label="Kalos exact f16 (p50)")
    a.axhline(lat["torch_single"]["p50_us"], color="tab:red", ls=":", label="torch f16 in-process (p50)")
    a.set_xlabel("re-rank count R")
    a.set_ylabel("µs")
    a.set_title("1M × 768 f16, k = 10, single queries (H200)")
    a.legend(fontsize=8)
    rec = d["recall_minilm"]["binding"]
    rs = sorted((80 if k == "default" else int(k), v) for k, v in rec.items())
    rs = [(r, v) for i, (r, v) in enumerate(rs) if i == 0 or r != rs[i - 1][0]]
    n = d["recall_minilm"]["queries"]
    b.plot([r for r, _ in rs], [v["mean"] for _, v in rs], "o-", label="recall@10 (mean)")
    b.plot([r for r, _ in rs], [1 - v["rerank_uncertain"] / n for _, v in rs], "s--", label="answers proved exact")
    b.set_xlabel("re-rank count R")
    b.set_ylim(0, 1.02)
    b.set_title("all-MiniLM-L6-v2, %d × %d, %d queries" % (d["recall_minilm"]["table"][0], d["recall_minilm"]["table"][1], n))
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
