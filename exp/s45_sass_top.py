"""Session 45: a short reading of Nsight Compute's per-instruction page (`ncu -i R --page source --csv --print-source
sass`): its columns, the instructions with the most warp-stall samples, and the live registers along the kernel.

    python3 exp/s45_sass_top.py sass.csv [rows]
"""

import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_source_page(path):
    """`(header, rows)` of the page's table: its column names, and one row per SASS instruction."""
    with open(path) as f:
        table = list(csv.reader(line for line in f if line.startswith('"')))
    at = next(i for i, row in enumerate(table) if row and row[0] == "Address")
    return table[at], table[at + 1 :]


if __name__ == "__main__":
    header, rows = read_source_page(sys.argv[1])
    print("columns:", " | ".join(header))
    stall = header.index("Warp Stall Sampling (All Samples)")
    live = next((i for i, name in enumerate(header) if "Live Registers" in name), None)
    total = sum(number(r[stall]) for r in rows) or 1.0
    print(f"{len(rows)} instructions, {total:.0f} stall samples")
    top = sorted(rows, key=lambda r: -number(r[stall]))[: int(sys.argv[2]) if len(sys.argv) > 2 else 30]
    for r in top:
        regs = r[live] if live is not None else "?"
        print(f"{100 * number(r[stall]) / total:5.1f}%  live {regs:>4}  {r[0]}  {r[1][:90]}")
    if live is not None:
        peak = max(rows, key=lambda r: number(r[live]))
        print(f"peak live registers {peak[live]} at {peak[0]} {peak[1][:90]}")
        step = max(1, len(rows) // 60)
        print("live registers along the kernel:", " ".join(f"{number(r[live]):.0f}" for r in rows[::step]))
