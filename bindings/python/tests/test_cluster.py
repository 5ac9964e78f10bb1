"""Cluster mode across languages (docs/CLUSTER.md): 3 nats-server (one JetStream cluster) and
3 kalosd on this machine, as tests/cluster.rs starts them, each kalosd holding 2 of 3 shards.
A writer in one language writes through one host; a reader in another language reads through
another host with the writer's write token as ``min_seqs`` and must get the write at once.
The peers are Python (this process), Go (bindings/go/testdata/clusterpeer, built by conftest's
``go_peer`` with ``go build``) and Java (bindings/java's ClusterPeer, compiled here with ``javac``).

Needs nats-server v2.15.3 (``go install github.com/nats-io/nats-server/v2@v2.15.3``: on PATH,
in ``$(go env GOPATH)/bin``, or named by ``KALOS_NATS_SERVER``), Go and a JDK. Without them the
test is skipped with the reason, except under CI (``CI`` set), where it fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import kalos
from conftest import REPO, kalosd_path, require

DIM = 8
SHARDS = 3
#: Shards held by hosts a, b and c: every shard on two hosts, every host missing one.
HOLD = {"a": "0,1", "b": "1,2", "c": "2,0"}
M64 = (1 << 64) - 1


def shard_of(ns: int, shards: int) -> int:
    """``wire::cluster::shard_of``: SplitMix64's finaliser of the namespace, modulo the shards."""
    z = (ns + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    z ^= z >> 31
    return z % shards


def ns_in(shard: int, nth: int) -> int:
    """The nth namespace whose shard is ``shard``."""
    found = [n for n in range(10_000) if shard_of(n, SHARDS) == shard]
    return found[nth]


def vector(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


def csv(v) -> str:
    return ",".join(str(float(x)) if isinstance(x, (float, np.floating)) else str(int(x)) for x in v)


def _require(what: str, path) -> str:
    return require(what, path, "cross-language cluster test", "CI runs it: scripts/test.sh installs nats-server")


def _nats_server():
    if os.environ.get("KALOS_NATS_SERVER"):
        return os.environ["KALOS_NATS_SERVER"]
    found = shutil.which("nats-server")
    if found or not shutil.which("go"):
        return found
    gopath = subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True).stdout.strip()
    p = Path(gopath) / "bin" / "nats-server"
    return str(p) if gopath and p.is_file() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def peers(request, tmp_path_factory):
    """Builds the Go and Java peers (in parallel); yields {"go": argv, "java": argv}."""
    nats = _require("nats-server v2.15.3 (go install github.com/nats-io/nats-server/v2@v2.15.3)", _nats_server())
    _require("go", shutil.which("go"))
    javac = _require("javac (a JDK)", shutil.which("javac"))
    java = _require("java", shutil.which("java"))
    out = tmp_path_factory.mktemp("peers")
    lib = Path(kalos.library_path).resolve()
    jsrc = REPO / "bindings/java/src"
    sources = sorted(str(p) for p in (jsrc / "main/java/io/kalos").glob("*.java"))
    javac_p = subprocess.Popen([javac, "-d", str(out / "classes"), *sources, str(jsrc / "test/java/io/kalos/ClusterPeer.java")],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    go = request.getfixturevalue("go_peer")
    log = javac_p.communicate(timeout=300)[0]
    assert javac_p.returncode == 0, f"javac of the cluster peer failed:\n{log}"
    yield {
        "nats": nats,
        "go": go,
        "java": [java, f"-Dkalos.library={lib}", "-cp", str(out / "classes"), "io.kalos.ClusterPeer"],
    }


@pytest.fixture(scope="module")
def cluster(peers, tmp_path_factory):
    """3 nats-server + 3 kalosd; yields {node: local store name}."""
    work = tmp_path_factory.mktemp("cluster")
    ports = [_free_port() for _ in range(3)]
    cports = [_free_port() for _ in range(3)]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in cports)
    urls = ",".join(f"nats://127.0.0.1:{p}" for p in ports)
    procs = []
    try:
        for i in range(3):
            with open(work / f"nats{i}.log", "w") as log:
                procs.append(subprocess.Popen(
                    [peers["nats"], "-n", f"n{i}", "-a", "127.0.0.1", "-p", str(ports[i]), "-js", "-sd", str(work / f"js{i}"),
                     "--cluster_name", "kalos-pytest", "--cluster", f"nats://127.0.0.1:{cports[i]}", "--routes", routes],
                    stdout=subprocess.DEVNULL, stderr=log))
        for p in ports:
            deadline = time.monotonic() + 20
            while True:
                try:
                    socket.create_connection(("127.0.0.1", p), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"nats-server on port {p} did not start"
                    time.sleep(0.05)
        names = {}
        for node, hold in HOLD.items():
            data = work / f"data-{node}"
            data.mkdir(mode=0o700)
            name = f"pyclu-{node}-{os.getpid()}"
            out, log = work / f"kalosd-{node}.out", work / f"kalosd-{node}.log"
            with open(out, "w") as o, open(log, "w") as e:
                p = subprocess.Popen(
                    [str(kalosd_path()), "serve", "--name", name, "--dim", str(DIM), "--metric", "cosine", "--backend", "cpu",
                     "--data-dir", str(data), "--cluster", urls, "--cluster-store", f"pyclu{os.getpid()}",
                     "--shard-count", str(SHARDS), "--shards", hold, "--node", node, "--slots", "16"],
                    stdout=o, stderr=e)
            procs.append(p)
            deadline = time.monotonic() + 30
            while not out.read_text().startswith("kalosd: serving"):
                assert p.poll() is None and time.monotonic() < deadline, f"kalosd {node} did not serve:\n{log.read_text()}"
                time.sleep(0.05)
            names[node] = name
        yield names
    finally:
        _stop(procs[3:])  # the kalosd first: a clean stop removes their segments
        _stop(procs[:3])
        shutil.rmtree(work, ignore_errors=True)


def run_peer(argv, *args) -> str:
    r = subprocess.run([*argv, *map(str, args)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{argv[-1]} {args[0]} failed ({r.returncode}): {r.stderr}"
    return r.stdout.strip()


def token_of(line: str):
    return [int(x) for x in line.split(",")] if line else []


def test_write_token_crosses_hosts_and_languages(cluster, peers):
    a = kalos.open(cluster["a"], role="client", timeout=10)
    try:
        # The first write waits until the hosts have created the shards' streams.
        deadline = time.monotonic() + 30
        while True:
            try:
                a.upsert([1], vector(1), namespace=ns_in(0, 0))
                break
            except kalos.KalosError:
                assert time.monotonic() < deadline, "the cluster did not take a write within 30 s"
                time.sleep(0.2)

        # Python writes through A: shard 1 (held by A and B) and shard 2 (held by B and C).
        n1, n2 = ns_in(1, 1), ns_in(2, 1)
        a.upsert([101], vector(101), namespace=n1)
        a.upsert([102], vector(102), namespace=n2)
        tok = a.write_seqs()
        assert len(tok) == SHARDS and tok[1] > 0 and tok[2] > 0, tok
        # The writer's own handle reads its writes, held here (1) or forwarded (2).
        assert a.recall(vector(101), 1, namespace=n1, read_your_writes=True)[0].tolist() == [101]
        assert a.recall(vector(102), 1, namespace=n2, read_your_writes=True)[0].tolist() == [102]
        # A stale-allowed read of a connected host reports its lag (not cut off: 0 ms). It
        # reads A's own replica, which applies the write a few milliseconds after its
        # acknowledgement (the read-your-writes recall above may have been answered by B).
        deadline = time.monotonic() + 10
        while (got := a.recall(vector(101), 1, namespace=n1, allow_stale=True)[0].tolist()) != [101]:
            assert time.monotonic() < deadline, f"A's replica did not apply the write within 10 s: {got}"
            time.sleep(0.01)
        lag = a.last_lag
        assert isinstance(lag, kalos.Lag) and lag.ms == 0, lag
        # A token naming a shard this store does not have is refused.
        with pytest.raises(kalos.InvalidArgumentError, match="shard 3"):
            a.recall(vector(101), 1, min_seqs=[0, 0, 0, 5])

        # Python -> Go through B, Python -> Java through C: each reads its host's own replica
        # (B holds 1, C holds 2), which waits until it has applied the token's sequence.
        assert run_peer(peers["go"], "read", cluster["b"], n1, csv(tok), csv(vector(101))) == "101"
        assert run_peer(peers["java"], "read", cluster["c"], n2, csv(tok), csv(vector(102))) == "102"

        # Go writes through B into shard 0 (not held by B); Python reads it through A.
        n0 = ns_in(0, 2)
        gtok = token_of(run_peer(peers["go"], "write", cluster["b"], 201, n0, csv(vector(201))))
        # A token runs to the highest shard the handle wrote to.
        assert gtok == [gtok[0]] and gtok[0] > 0, gtok
        assert a.recall(vector(201), 1, namespace=n0, min_seqs=gtok)[0].tolist() == [201]

        # Java writes through C into shard 1 (not held by C); Go reads it through B, Python
        # through A.
        n1b = ns_in(1, 2)
        jtok = token_of(run_peer(peers["java"], "write", cluster["c"], 301, n1b, csv(vector(301))))
        assert len(jtok) == 2 and jtok[1] > 0, jtok
        assert run_peer(peers["go"], "read", cluster["b"], n1b, csv(jtok), csv(vector(301))) == "301"
        assert a.recall(vector(301), 1, namespace=n1b, min_seqs=np.array(jtok, np.uint64))[0].tolist() == [301]
    finally:
        a.close()
