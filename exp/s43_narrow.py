"""Issue 45, session 43: the 4-bit grouped matmul with a span's short last tile in `NARROW_ROWS`-wide products
(wgmma's N 128 where the span's rows fit; 256-row tiles compute 1.27 rows a row at the MoE shape's random groups, 1.13
so) against the kernel without them, at the default tiles, checked against XLA and timed beside bf16 `auto`.

    python exp/s43_narrow.py --out $OUT [--format affine]
"""

import argparse
import functools

from s39_mxfp4 import kernel_call, moe_run, report

from ejkernel.kernels._common.device import num_sms
from ejkernel.kernels._pallas.gpu.grouped_matmul import _four_bit
from ejkernel.kernels._pallas.gpu.grouped_matmul._four_bit import MosaicGpuFourBitGroupedMatmulTiling
from ejkernel.kernels._pallas.gpu.grouped_matmul._interface import DEFAULT_FOUR_BIT


def main():
    args, lhs, sizes, q, codes, check, calls = moe_run(argparse.ArgumentParser())
    tiling = MosaicGpuFourBitGroupedMatmulTiling(*DEFAULT_FOUR_BIT, num_sms())
    landed = _four_bit.NARROW_ROWS
    for label, narrow in {"no narrow tails": tiling.block_m, f"narrow {landed}": landed}.items():
        _four_bit.NARROW_ROWS = narrow
        fn = kernel_call(q, codes, sizes, tiling)
        check(label, fn(lhs))  # (traced and compiled with this width)
        calls[label] = fn
    _four_bit.NARROW_ROWS = landed
    report(
        {key: functools.partial(fn, lhs) for key, fn in calls.items()}, args.repeats, args.out, f"narrow_{args.format}"
    )


if __name__ == "__main__":
    main()
