"""Session 42: the 4-bit grouped matmul with step s + 1's wgmma queued behind step s's (`_four_bit.ISSUE_AHEAD`).

Call 2's profile showed both compute warpgroups issuing their wgmmas together, decoding the next step while the
tensor cores run both (about 1024 cycles), then waiting, handing the slot back, awaiting the next slot and issuing:
the tensor cores idle for that tail, some 200-350 cycles of a 1350-cycle step. Queued ahead, the next wgmma runs as
soon as the current one ends. A/B in one run at the MoE shape beside bf16 `auto` (`s39_mxfp4.patched_variants`):

    python exp/s42_issue_ahead.py --out $OUT [--format affine]
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from s39_mxfp4 import patched_variants

if __name__ == "__main__":
    patched_variants("ISSUE_AHEAD", {"wait, then issue": False, "issue ahead": True}, "gmm_issue_ahead_s42")
