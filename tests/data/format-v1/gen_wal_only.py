import numpy as np, sys
sys.path.insert(0, "/work/wt-filt/bindings/python")
import os
os.environ["KALOS_LIBRARY"] = "/work/target-filt/release/libkalos.so"
import kalos
rng = np.random.default_rng(7)
# phase 1: rows 0..39 (then a snapshot via close? the import makes the snapshot)
kv = kalos.open("v1gen-fixture", dim=4, metric="ip", role="server", data_dir="/tmp/v1gen/d", backend="cpu")
v = np.arange(40*4, dtype=np.float32).reshape(40,4) / 10.0
kv.upsert(list(range(40)), v, namespaces=[i % 3 for i in range(40)], payloads=[f"row {i}" if i % 5 else None for i in range(40)])
kv.upsert([100], np.array([[1,2,3,4]], np.float32), namespace=9, payloads=[b"\x00\xff"], expires_at=4102444800.0)  # 2100-01-01
kv.delete([3, 4])
kv.delete_namespace(2)
kv.close()
