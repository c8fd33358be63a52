# Session 39, call 1 (nvidia-h200-x2): issue 46's 16-KV-head ring, forward+backward. The ring and multi-GPU tests with
# visibility decided when tracing (blocks hidden or visible on every device leave their `lax.cond`), then that driver
# beside session 38's (carried as .trial/head_ring.py: `git show 6d3076b:src/ejkernel/kernels/_common/ring.py`) and
# beside the trial with each step's transfers and blocks in one XLA scheduling group (exp/s39_ring_groups.patch,
# against ring.py as of 1db5d62: both directions, the backward only, the forward only).
. exp/s28_env.sh
gpu_tests 170 tests/test_ring_attention.py tests/test_multi_gpu.py
G=/tmp/s39_ring_groups.py
patch -s -o "$G" src/ejkernel/kernels/_common/ring.py exp/s39_ring_groups.patch
timeout 380 python3 exp/s39_ring.py --out "$OUT" --modes fwd+bwd,fwd \
  --versions head=.trial/head_ring.py,static=src/ejkernel/kernels/_common/ring.py,groups=$G:fwd+bwd,groups_bwd=$G:bwd,groups_fwd=$G:fwd 2>&1 | quiet
