"""Session 42: the 4-bit grouped matmul with steps in pairs, each step's wgmma queued behind the previous one's
(`_four_bit.ISSUE_AHEAD`), and the output staged in row pieces (`_four_bit.OUT_PIECES`), which frees shared memory
for a fifth ring stage. A/B in one run at the MoE shape, each variant checked against XLA and timed beside bf16
`auto`:

    python exp/s42_pairs.py --out $OUT [--format affine]
"""

import argparse
import functools
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from s39_mxfp4 import kernel_call, moe_run, report

from ejkernel.kernels._common.device import num_sms
from ejkernel.kernels._pallas.gpu.grouped_matmul import _four_bit
from ejkernel.kernels._pallas.gpu.grouped_matmul._four_bit import MosaicGpuFourBitGroupedMatmulTiling

VARIANTS = {  # label: (ISSUE_AHEAD, OUT_PIECES, stages)
    "single steps, whole tile, 4 stages": (False, 1, 4),
    "single steps, halves, 5 stages": (False, 2, 5),
    "pairs, halves, 5 stages": (True, 2, 5),
    "pairs, halves, 4 stages": (True, 2, 4),
}


def main():
    args, lhs, sizes, q, codes, check, calls = moe_run(argparse.ArgumentParser())
    today = (_four_bit.ISSUE_AHEAD, _four_bit.OUT_PIECES)
    for label, (ahead, pieces, stages) in VARIANTS.items():
        _four_bit.ISSUE_AHEAD, _four_bit.OUT_PIECES = ahead, pieces
        fn = kernel_call(q, codes, sizes, MosaicGpuFourBitGroupedMatmulTiling(256, stages, num_sms()))
        try:
            check(label, fn(lhs))  # (traced and compiled with this variant)
        except Exception as err:  # (the others still run)
            print(f"{label}: {type(err).__name__}: {str(err)[:300]}", flush=True)
            continue
        calls[label] = fn
    _four_bit.ISSUE_AHEAD, _four_bit.OUT_PIECES = today
    report({key: functools.partial(fn, lhs) for key, fn in calls.items()}, args.repeats, args.out, "gmm_pairs_s42")


if __name__ == "__main__":
    main()
