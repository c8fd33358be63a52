"""Session 45, call 6: the Triton paged core's int8 `p @ v` as two int8 dots (`_kernel.integer_weigh`) against float16
values (the switch `_kernel.SPLIT_VALUES`, the prototype's), on issue 45's decode shape (`exp/s44_kv8.py` run under it):

    python3 exp/s45_split_values.py <0/1>

The two dots were slower (1.28x -> 1.23x a bf16 cache) and did not land: the kernel no longer has `integer_weigh` or
the switch, and this script records call 6.
"""

import pathlib
import runpy
import sys

from ejkernel.kernels._triton.paged_attention import _kernel

if __name__ == "__main__":
    _kernel.SPLIT_VALUES = sys.argv[1] == "1"
    here = pathlib.Path(__file__).parent
    sys.path.insert(0, str(here))
    print(f"=== int8 values as two int8 dots: {_kernel.SPLIT_VALUES}")
    sys.argv = ["s44_kv8.py"]
    runpy.run_path(str(here / "s44_kv8.py"), run_name="__main__")
