"""Session 45: the Triton paged core with its 8-bit tiles as the first operand of their dots (Triton widens a first
operand after loading it from shared memory, in registers; a second operand, before storing it there): the logits as
`(k @ q^T)^T` (`_kernel.KEYS_AS_A`) and/or `p @ v` as `(v^T @ p^T)^T` (`_kernel.VALUES_AS_A`), on issue 45's decode
shape (`exp/s44_kv8.py`, run under the switches), or one decode step for Nsight Compute (`exp/s44_ncu_step.py`'s
arguments after `step`):

    python3 exp/s45_operand_a.py <keys as A: 0/1> <values as A: 0/1> [step <dtype> ...]

Both were slower (call 5, BENCHMARKS.md) and the switches are gone: this script records that call.
"""

import pathlib
import runpy
import sys

from ejkernel.kernels._triton.paged_attention import _kernel

if __name__ == "__main__":
    _kernel.KEYS_AS_A, _kernel.VALUES_AS_A = sys.argv[1] == "1", sys.argv[2] == "1"
    here = pathlib.Path(__file__).parent
    sys.path.insert(0, str(here))
    if sys.argv[3:4] == ["step"]:
        sys.argv = ["s44_ncu_step.py", *sys.argv[4:]]
        runpy.run_path(str(here / "s44_ncu_step.py"), run_name="__main__")
    else:
        print(f"=== keys as A {_kernel.KEYS_AS_A}, values as A {_kernel.VALUES_AS_A}")
        sys.argv = ["s44_kv8.py"]
        runpy.run_path(str(here / "s44_kv8.py"), run_name="__main__")
