"""Session 44: what the Triton paged core compiles to on a bf16, an int8 and an e4m3 cache (issue 45's decode shape,
`exp/s29_kvscales.step`): run with XLA's dumps on, one cache dtype a process,

    XLA_FLAGS=--xla_dump_to=/tmp/x python3 exp/s44_ptx.py int8 /tmp/x

and it prints, for the kernel `ejkernel_paged_attention` in the dumped PTX, how many of each kind of instruction it
holds (asynchronous copies, global and shared loads and stores, matrix loads, mma / wgmma, conversions, barriers)
the registers declared and what `ptxas -v` says of it (registers, spills), so that the 8-bit kernels' structure can
be set beside bf16's.
"""

import collections
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from s29_kvscales import args, quantized, step

KINDS = {
    "cp.async": r"cp\.async\.(ca|cg)",
    "cp.async.bulk (TMA)": r"cp\.async\.bulk",
    "ld.global": r"ld\.global",
    "ld.shared": r"ld\.shared",
    "st.shared": r"st\.shared",
    "st.global": r"st\.global",
    "ldmatrix": r"ldmatrix",
    "mma.sync": r"\bmma\.sync",
    "wgmma": r"wgmma\.mma_async",
    "cvt": r"\bcvt\.",
    "cvt e4m3": r"cvt\.rn\.f16x2\.e4m3x2",
    "bar.sync": r"bar\.sync|barrier\.sync",
    "ex2": r"ex2\.approx",
    "prmt": r"\bprmt\b",
}


def kernel_text(ptx: str) -> str:
    start = ptx.index(".entry ejkernel_paged_attention")
    end = ptx.find(".entry", start + 10)
    return ptx[start : end if end > 0 else len(ptx)]


def main():
    dtype, dump = sys.argv[1], pathlib.Path(sys.argv[2])
    cache, scales = (
        (args[3], None)
        if dtype == "bf16"
        else quantized(args[3], getattr(jnp, {"int8": "int8", "e4m3": "float8_e4m3fn"}[dtype]))
    )
    jax.block_until_ready(jax.jit(lambda c, s: step(c, s, *args[:3], *args[4:], platform="triton"))(cache, scales))
    files = sorted(p for p in dump.rglob("*") if p.is_file())
    print(f"{dtype}: {len(files)} files dumped, suffixes {sorted({p.suffix for p in files})}")
    for ptx_file in files:
        ptx = ptx_file.read_text(errors="replace")
        if ".entry ejkernel_paged_attention" not in ptx:
            continue
        text = kernel_text(ptx)
        counts = {name: len(re.findall(pattern, text)) for name, pattern in KINDS.items()}
        regs = collections.Counter()
        for kind, count in re.findall(r"\.reg \.(\w+)\s+%\w+<(\d+)>", text):
            regs[kind] += int(count)
        print(f"{dtype}: {ptx_file.name}: lines {text.count(chr(10))}")
        print("  " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        print("  registers declared: " + ", ".join(f"{k} {v}" for k, v in regs.items()))
        ptxas = shutil.which("ptxas") or next(
            iter(sorted(pathlib.Path(jax.__file__).parents[1].glob("nvidia/*/bin/ptxas"))), None
        )
        if ptxas:
            done = subprocess.run(
                [str(ptxas), "-arch=sm_90a", "-v", str(ptx_file), "-o", "/dev/null"], capture_output=True, text=True
            )
            lines = (done.stdout + done.stderr).splitlines()
            for i, line in enumerate(lines):
                if "ejkernel_paged_attention" in line:
                    print("  ptxas: " + " | ".join(x.strip() for x in lines[i : i + 4]))


if __name__ == "__main__":
    main()
