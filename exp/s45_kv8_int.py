"""Session 45: the Triton paged core's int8 cache with integer dots (`_kernel.INTEGER_DOTS`: 0 = float16 dots on
widened codes, 1 = the logits as an int8 x int8 dot of the row-quantised queries and the key codes, 2 = also the values'
dot, the scaled probabilities rounded to int8 per row), on issue 45's decode shape (`exp/s44_kv8.py`, which this runs
under the mode; a mode ending in `h`, as `1h`, also launches the grid with its kv heads fastest,
`_kernel.HEADS_FIRST`), or one decode step for Nsight Compute (`exp/s44_ncu_step.py`'s arguments after `step`):

    python3 exp/s45_kv8_int.py <mode> [s44_kv8.py's flags]

The switches were the prototype's (calls 1-3): mode 1 is now the kernel's only int8 path for 16-bit queries, and the
switches are gone, so this script records those calls and no longer changes what it times.
    python3 exp/s45_kv8_int.py <mode> step <dtype> [<keys a step> <stages> <warps> <splits>]
"""

import pathlib
import runpy
import sys

from ejkernel.kernels._triton.paged_attention import _kernel

if __name__ == "__main__":
    _kernel.INTEGER_DOTS = int(sys.argv[1][0])
    _kernel.HEADS_FIRST = sys.argv[1].endswith("h")
    here = pathlib.Path(__file__).parent
    sys.path.insert(0, str(here))
    if sys.argv[2:3] == ["step"]:
        sys.argv = ["s44_ncu_step.py", *sys.argv[3:]]
        runpy.run_path(str(here / "s44_ncu_step.py"), run_name="__main__")
    else:
        print(f"=== integer dots mode {_kernel.INTEGER_DOTS}, heads first {_kernel.HEADS_FIRST}")
        sys.argv = ["s44_kv8.py", *sys.argv[2:]]
        runpy.run_path(str(here / "s44_kv8.py"), run_name="__main__")
