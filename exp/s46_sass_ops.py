"""Session 46: Nsight Compute's per-instruction page (`--page source --csv --print-source sass`) summed by opcode:
warp instructions executed and stall samples per opcode, the most first.

    python3 exp/s46_sass_ops.py sass.csv [rows]
"""

import collections
import sys

from s45_sass_top import number, read_source_page

if __name__ == "__main__":
    header, rows = read_source_page(sys.argv[1])
    executed = next(i for i, name in enumerate(header) if name.startswith("Instructions Executed"))
    stall = header.index("Warp Stall Sampling (All Samples)")
    count, stalls = collections.Counter(), collections.Counter()
    for r in rows:
        words = r[1].split()
        op = words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "?")
        count[op] += number(r[executed])
        stalls[op] += number(r[stall])
    total, total_stall = sum(count.values()) or 1, sum(stalls.values()) or 1
    print(f"{len(rows)} instructions in the kernel, {total:.0f} warp instructions executed")
    for op, n in count.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 25):
        print(f"{op:28s} {100 * n / total:5.1f}% executed  {100 * stalls[op] / total_stall:5.1f}% of stalls")
