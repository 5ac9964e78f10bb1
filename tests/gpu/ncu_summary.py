#!/usr/bin/env python3
"""Summarises Nsight Compute reports exported by ncu.sh: for every kernel of each
`<name>.details.csv` (`ncu -i R --page details --csv`), its duration, DRAM and SM throughput,
clocks, registers, shared memory and occupancy; for every kernel of each `<name>.sass.csv`
(`ncu -i R --page source --csv --print-source sass`), its warp-stall samples by reason and the
instructions with the most samples. Usage: ncu_summary.py DIR (prints the summary)."""
import csv
import glob
import os
import sys

METRICS = [
    ("GPU Speed Of Light Throughput", "Duration"),
    ("GPU Speed Of Light Throughput", "DRAM Throughput"),
    ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    ("GPU Speed Of Light Throughput", "SM Frequency"),
    ("Launch Statistics", "Grid Size"),
    ("Launch Statistics", "Registers Per Thread"),
    ("Launch Statistics", "Dynamic Shared Memory Per Block"),
    ("Occupancy", "Block Limit Registers"),
    ("Occupancy", "Block Limit Shared Mem"),
    ("Occupancy", "Achieved Active Warps Per SM"),
    ("Scheduler Statistics", "Eligible Warps Per Scheduler"),
    ("Warp State Statistics", "Warp Cycles Per Issued Instruction"),
]


def details(path):
    rows = list(csv.DictReader(open(path, newline="")))
    for kid in sorted({r["ID"] for r in rows}, key=int):
        rr = [r for r in rows if r["ID"] == kid]
        print("  kernel %s %s grid %s block %s" % (kid, rr[0]["Kernel Name"], rr[0]["Grid Size"], rr[0]["Block Size"]))
        got = {(r["Section Name"], r["Metric Name"]): (r["Metric Value"], r["Metric Unit"]) for r in rr if r["Metric Name"]}
        for key in METRICS:
            if key in got:
                print("    %-40s %s %s" % (key[1], *got[key]))


def sass(path, top=8):
    kernels, cur = [], None
    for r in csv.reader(open(path, newline="")):
        if r and r[0] == "Kernel Name":
            cur = [r[1]]
            kernels.append(cur)
        elif cur is not None:
            cur.append(r)
    for k in kernels:
        name, hdr, data = k[0], k[1], k[2:]
        idx = {h: i for i, h in enumerate(hdr)}
        if "Warp Stall Sampling (All Samples)" not in idx:
            continue
        samples = idx["Warp Stall Sampling (All Samples)"]
        stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]

        def num(r, h):
            try:
                return int(r[idx[h]] or 0)
            except (ValueError, IndexError):
                return 0

        total = sum(num(r, hdr[samples]) for r in data) or 1
        by = sorted(((sum(num(r, s) for r in data), s[6:]) for s in stalls), reverse=True)
        print("  %s: %d stall samples; by reason: %s" % (
            name, total, ", ".join("%s %.1f%%" % (s, 100.0 * v / total) for v, s in by[:6] if v)))
        for r in sorted(data, key=lambda r: -num(r, hdr[samples]))[:top]:
            why = sorted(((num(r, s), s[6:]) for s in stalls), reverse=True)[:2]
            print("    %5.1f%%  %-58s %s" % (100.0 * num(r, hdr[samples]) / total, r[1][:58],
                                          ", ".join("%s %d" % (s, v) for v, s in why if v)))


def main():
    d = sys.argv[1]
    for path in sorted(glob.glob(os.path.join(d, "*.details.csv"))):
        print("== %s" % os.path.basename(path))
        details(path)
    for path in sorted(glob.glob(os.path.join(d, "*.sass.csv"))):
        print("== %s" % os.path.basename(path))
        sass(path)


if __name__ == "__main__":
    main()
