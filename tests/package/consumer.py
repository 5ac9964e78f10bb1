"""A Python program run from / in a fresh venv that has only the platform wheel (and numpy)
installed (tests/package/run.sh). Usage: consumer.py STORE_NAME EXPECTED_VERSION"""

import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

import kalos

name, version = sys.argv[1], sys.argv[2]
site = Path(sysconfig.get_paths()["purelib"]).resolve()

assert kalos.__version__ == version, (kalos.__version__, version)
assert kalos.version() == version, (kalos.version(), version)
assert Path(kalos.library_path).resolve().parent == site / "kalos", kalos.library_path
# The wheel carries the recall fast path (kalos._fastcall, stable ABI) and this Python uses it.
assert kalos._FASTCALL is not None, kalos._fastpath.disabled_reason
from kalos import _fastcall  # noqa: E402

assert Path(_fastcall.__file__).resolve() == site / "kalos" / "_fastcall.abi3.so", _fastcall.__file__
assert "open" not in kalos.__all__ and "__version__" in kalos.__all__
ns: dict = {}
exec("from kalos import *", ns)
assert "open" not in ns and "Kalos" in ns and "NotFoundError" in ns

with kalos.open(name, dim=4, metric="ip", role="server", backend="cpu") as kv:
    kv.upsert([10, 20, 30], np.eye(4, dtype=np.float32)[:3], payloads=[b"a", b"b", b"c"])
    ids, scores, payloads = kv.recall(np.array([0, 0.2, 0.9, 0], np.float32), k=2, payloads=True)
    assert list(ids) == [30, 20] and payloads == [b"c", b"b"], (ids, payloads)

# The kalosd console command from the wheel serves a store; this process attaches as a client.
kalosd = Path(sys.prefix) / "bin" / "kalosd"
served = name + "-kalosd"
proc = subprocess.Popen([str(kalosd), "serve", "--name", served, "--dim", "4", "--metric", "ip",
                         "--backend", "cpu"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
try:
    deadline = time.monotonic() + 30
    while True:
        try:
            kv = kalos.open(served, role="client")
            break
        except kalos.NotFoundError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with kv:
        kv.upsert([1], np.array([[0, 0, 0, 1]], np.float32))
        assert list(kv.recall(np.array([0, 0, 0, 1], np.float32), k=1)[0]) == [1]
finally:
    proc.terminate()
    rc = proc.wait(30)
assert rc == 0, (rc, proc.stderr.read())
print(f"python: ok, kalos {kalos.__version__} from {kalos.library_path}, kalosd {kalosd}")
