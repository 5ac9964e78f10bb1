#!/usr/bin/env python3
"""all-MiniLM-L6-v2 sentence embeddings from a bundle of tests/quality/make_bundle.py, with torch and
numpy only: the BERT encoder (embeddings, 6 layers), mean pooling over the attention mask and L2
normalisation, as sentence-transformers computes them.

  python3 tests/quality/embed_torch.py BUNDLE OUTDIR [--dtype float32|float16] [--f16-parts]

Runs on CUDA when torch sees a GPU, else on the CPU (--device to choose). Sentences are batched
by length (about --tokens padded tokens a batch). Writes to OUTDIR:
  minilm_manpages.npy     float32 [n, 384], L2-normalised, row i = sentence i of the bundle
  minilm_manpages.txt     the n sentences, one a line (when the bundle carries them)
  minilm_manpages_f16.NN.npy  with --f16-parts: the same rows as float16 in parts of at most
                          16 MiB each, in order (`--join DIR` concatenates them into a float32
                          minilm_manpages.npy in DIR)

The compute dtype is float32 by default (the weights are the bundle's float16 values, widened);
--dtype float16 runs the encoder in half precision and pools in float32.

Check against sentence-transformers (run where it is installed, e.g. .venv-quality; CPU):
  HF_HUB_OFFLINE=1 .venv-quality/bin/python tests/quality/embed_torch.py --check .gpu/embed
embeds --n random sentences of the bundle (and its longest ones) both ways, verifies that the
bundle's token ids are the model tokenizer's, and fails unless the minimum cosine similarity is
at least 0.9999 in float32 (and at least 0.999 in float16, where the CPU's torch runs it).
"""

import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

NAME = "minilm_manpages"
PART_BYTES = 16 * 2**20


class Bundle:
    def __init__(self, path):
        self.path = path
        with open(os.path.join(path, "config.json")) as f:
            self.cfg = json.load(f)
        tok = np.load(os.path.join(path, "tokens.npz"))
        self.ids = tok["ids"].astype(np.int64)
        self.offsets = tok["offsets"].astype(np.int64)
        self.vocab = tok["vocab"].astype(np.int64)
        self.lengths = np.diff(self.offsets)
        w = np.load(os.path.join(path, "weights.npz"))
        self.weights = {k: w[k] for k in w.files}

    def __len__(self):
        return len(self.lengths)

    def texts(self):
        """The sentences, or None when the bundle was built without them."""
        p = os.path.join(self.path, NAME + ".txt.gz")
        if not os.path.exists(p):
            return None
        with gzip.open(p, "rt", encoding="utf-8") as f:
            return f.read().splitlines()


class MiniLM:
    """The BERT encoder of the bundle in plain torch, on one device and dtype."""

    def __init__(self, bundle, device, dtype):
        c = bundle.cfg
        self.device, self.dtype = torch.device(device), dtype
        self.heads = c["num_attention_heads"]
        self.hidden = c["hidden_size"]
        self.eps = c["layer_norm_eps"]
        self.layers = c["num_hidden_layers"]
        self.max_len = c["max_seq_length"]
        self.p = {k: torch.from_numpy(v).to(self.device, dtype) for k, v in bundle.weights.items()}
        # Token type 0 for every token: a constant row added to every position.
        self.type0 = self.p["embeddings.token_type_embeddings.weight"][0]

    def _ln(self, x, name):
        return F.layer_norm(x, (self.hidden,), self.p[name + ".weight"], self.p[name + ".bias"], self.eps)

    def _lin(self, x, name):
        return F.linear(x, self.p[name + ".weight"], self.p[name + ".bias"])

    @torch.inference_mode()
    def forward(self, ids, mask):
        """ids: long [B, L] rows of the bundle's word table; mask: bool [B, L], True on tokens.
        Returns float32 [B, hidden], mean-pooled over the mask and L2-normalised."""
        b, n = ids.shape
        p = self.p
        x = p["embeddings.word_embeddings.weight"][ids] + p["embeddings.position_embeddings.weight"][:n] + self.type0
        x = self._ln(x, "embeddings.LayerNorm")
        attn = mask[:, None, None, :]
        d = self.hidden // self.heads
        for i in range(self.layers):
            pre = f"encoder.layer.{i}."
            q, k, v = (
                self._lin(x, pre + "attention.self." + t).view(b, n, self.heads, d).transpose(1, 2) for t in ("query", "key", "value")
            )
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attn).transpose(1, 2).reshape(b, n, self.hidden)
            x = self._ln(self._lin(ctx, pre + "attention.output.dense") + x, pre + "attention.output.LayerNorm")
            h = F.gelu(self._lin(x, pre + "intermediate.dense"))
            x = self._ln(self._lin(h, pre + "output.dense") + x, pre + "output.LayerNorm")
        m = mask.unsqueeze(-1).to(torch.float32)
        pooled = (x.to(torch.float32) * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)


def batches(lengths, tokens, max_batch=4096):
    """Index arrays of sentences, longest first, each batch at most `tokens` padded tokens."""
    order = np.argsort(-lengths, kind="stable")
    out, lo = [], 0
    while lo < len(order):
        longest = max(int(lengths[order[lo]]), 1)
        hi = min(lo + max(tokens // longest, 1), lo + max_batch, len(order))
        out.append(order[lo:hi])
        lo = hi
    return out


def embed(bundle, model, rows=None, tokens=65536, progress=False):
    """Embeddings of the bundle's sentences `rows` (all by default), float32 numpy [len(rows), hidden]."""
    rows = np.arange(len(bundle)) if rows is None else np.asarray(rows)
    dev = model.device
    ids_all = torch.from_numpy(bundle.ids).to(dev)
    starts = torch.from_numpy(bundle.offsets[rows]).to(dev)
    lens = torch.from_numpy(bundle.lengths[rows]).to(dev)
    out = torch.empty((len(rows), model.hidden), dtype=torch.float32, device=dev)
    t0, done = time.time(), 0
    for bi, sel in enumerate(batches(bundle.lengths[rows], tokens)):
        s = torch.from_numpy(sel).to(dev)
        n = int(bundle.lengths[rows[sel[0]]])
        pos = torch.arange(n, device=dev)
        mask = pos[None, :] < lens[s][:, None]
        idx = torch.where(mask, starts[s][:, None] + pos[None, :], 0)
        out[s] = model.forward(ids_all[idx], mask)
        done += len(sel)
        if progress and bi % 50 == 0:
            print(f"  {done}/{len(rows)} sentences, {time.time() - t0:.1f} s", flush=True)
    return out.cpu().numpy()


def pick_device(name):
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def run(args):
    bundle = Bundle(args.bundle)
    device = pick_device(args.device)
    dtype = getattr(torch, args.dtype)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tokens = args.tokens or (65536 if device == "cuda" else 8192)
    desc = torch.cuda.get_device_name(0) if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{len(bundle)} sentences, {len(bundle.ids)} tokens; {desc}, {args.dtype}, torch {torch.__version__}", flush=True)
    model = MiniLM(bundle, device, dtype)
    if device == "cuda":
        embed(bundle, model, rows=np.arange(min(len(bundle), 2048)), tokens=tokens)  # warm-up
        torch.cuda.synchronize()
    t0 = time.time()
    emb = embed(bundle, model, tokens=tokens, progress=True)
    secs = time.time() - t0
    print(f"embedded {len(emb)} sentences in {secs:.2f} s ({len(emb) / secs:.0f}/s)", flush=True)
    norms = np.linalg.norm(emb, axis=1)
    if not np.isfinite(emb).all() or np.abs(norms - 1).max() > 1e-3:
        sys.exit(f"bad embeddings: finite={np.isfinite(emb).all()}, norms {norms.min()}..{norms.max()}")
    os.makedirs(args.out, exist_ok=True)
    np.save(os.path.join(args.out, NAME + ".npy"), emb)
    wrote = [f"{NAME}.npy ({emb.shape[0]}x{emb.shape[1]} float32)"]
    texts = bundle.texts()
    if texts is not None:
        if len(texts) != len(emb):
            sys.exit(f"the bundle has {len(texts)} sentences of text but {len(emb)} token rows")
        with open(os.path.join(args.out, NAME + ".txt"), "w", encoding="utf-8") as f:
            f.write("".join(t + "\n" for t in texts))
        wrote.append(f"{NAME}.txt")
    if args.f16_parts:
        per = (PART_BYTES - 128) // (emb.shape[1] * 2)
        for i, lo in enumerate(range(0, len(emb), per)):
            np.save(os.path.join(args.out, f"{NAME}_f16.{i:02d}.npy"), emb[lo : lo + per].astype(np.float16))
        wrote.append(f"{NAME}_f16.00..{i:02d}.npy ({per} rows a part)")
    print(f"wrote to {args.out}: " + ", ".join(wrote))


def join(folder):
    import glob

    parts = sorted(glob.glob(os.path.join(folder, NAME + "_f16.[0-9][0-9].npy")))
    if not parts:
        sys.exit(f"no {NAME}_f16.NN.npy in {folder}")
    if [os.path.basename(p) for p in parts] != [f"{NAME}_f16.{i:02d}.npy" for i in range(len(parts))]:
        sys.exit(f"parts are not numbered 00..{len(parts) - 1:02d} without gaps: {parts}")
    emb = np.concatenate([np.load(p) for p in parts]).astype(np.float32)
    np.save(os.path.join(folder, NAME + ".npy"), emb)
    print(f"wrote {os.path.join(folder, NAME + '.npy')} ({emb.shape[0]}x{emb.shape[1]} float32 from {len(parts)} parts)")


def check(args):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import make_bundle

    bundle = Bundle(args.bundle)
    texts = bundle.texts()
    if texts is None:
        import make_embeddings

        texts = make_embeddings.sentences(bundle.cfg["source"]["limit"])[1]
    if len(texts) != len(bundle):
        sys.exit(f"{len(texts)} sentences against {len(bundle)} token rows")
    rng = np.random.default_rng(args.seed)
    longest = np.argsort(-bundle.lengths, kind="stable")[:8]
    rows = np.unique(np.concatenate([rng.choice(len(bundle), size=min(args.n, len(bundle)), replace=False), longest]))
    sel = [texts[i] for i in rows]
    st, _ = make_bundle.load_model()
    expect_ids = make_bundle.tokenize(st, sel)
    for r, want in zip(rows, expect_ids, strict=True):
        got = bundle.vocab[bundle.ids[bundle.offsets[r] : bundle.offsets[r + 1]]]
        if not np.array_equal(got, want):
            sys.exit(f"sentence {r}: bundle tokens differ from the tokenizer's")
    ref = st.encode(sel, batch_size=64, normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)
    print(f"{len(rows)} sentences (tokens {bundle.lengths[rows].min()}..{bundle.lengths[rows].max()}), tokens match the tokenizer")
    ok = True
    for dtype, floor in (("float32", 0.9999), ("float16", 0.999)):
        model = MiniLM(bundle, "cpu", getattr(torch, dtype))
        try:
            got = embed(bundle, model, rows=rows, tokens=4096)
        except RuntimeError as e:
            print(f"{dtype}: not run on this CPU ({e})")
            continue
        cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
        passed = cos.min() >= floor
        ok &= bool(passed)
        print(
            f"{dtype}: cosine to sentence-transformers min {cos.min():.7f} mean {cos.mean():.7f} "
            f"(floor {floor}); max abs diff {np.abs(got - ref).max():.2e}: {'ok' if passed else 'FAIL'}"
        )
    if not ok:
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", nargs="?", help="the folder of make_bundle.py")
    ap.add_argument("out", nargs="?", help="output folder")
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cuda or cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16"])
    ap.add_argument("--tokens", type=int, default=0, help="padded tokens a batch (default 65536 on CUDA, 8192 on CPU)")
    ap.add_argument("--f16-parts", action="store_true", help="also write float16 parts of at most 16 MiB")
    ap.add_argument("--join", metavar="DIR", help="concatenate the float16 parts in DIR into a float32 .npy and exit")
    ap.add_argument("--check", action="store_true", help="compare with sentence-transformers on the CPU (needs it installed)")
    ap.add_argument("--n", type=int, default=500, help="sentences for --check")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if args.join:
        return join(args.join)
    if not args.bundle:
        ap.error("the bundle folder is required")
    if args.check:
        return check(args)
    if not args.out:
        ap.error("the output folder is required")
    run(args)


if __name__ == "__main__":
    main()
