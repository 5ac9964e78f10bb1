"""Summarises `kalos client trace` lines (KALOS_CLIENT_TRACE=1) from a log: p50 / p99 of each
phase of a batch call, per request size. A tuning aid, not a test.

  KALOS_CLIENT_TRACE=1 bash .gpu/run.sh bench; python3 .gpu/trace_summary.py $OUT/bench.log
"""
import re
import sys

import numpy as np

PAT = re.compile(r"kalos client trace: (\d+) B batch request: claim \+ checked copy ([\d.]+) us, "
                 r"submit -> answer ([\d.]+) us, response read ([\d.]+) us, parsed ([\d.]+) us")


def main():
    by_size = {}
    for line in open(sys.argv[1], errors="replace"):
        m = PAT.search(line)
        if m:
            by_size.setdefault(int(m.group(1)), []).append([float(x) for x in m.groups()[1:]])
    if not by_size:
        print("no 'kalos client trace' lines in %s (was KALOS_CLIENT_TRACE=1 set?)" % sys.argv[1])
        return 1
    for size, rows in sorted(by_size.items()):
        a = np.array(rows)
        cols = ["copy", "submit->answer", "read", "parse"]
        print("%d B requests, %d calls: " % (size, len(rows)) + ", ".join(
            "%s p50 %.1f p99 %.1f us" % (c, np.percentile(a[:, i], 50), np.percentile(a[:, i], 99)) for i, c in enumerate(cols)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
