# Prepared in session 51, not run (its device time was spent): the fused Mosaic GPU backward at head dim 128 with dQ
# shared between the warpgroups, A/B against the split kernels. The prototype (`exp/s51_shared_dq.patch`, from
# `a3b6244`: the `shared_dq` static, `key_gradients`' skip/start/finish hooks, the switches `FUSED_D128` and
# `SHARED_DQ`, off by default) is applied to the device's copy only. In Mosaic GPU interpret mode it matched the
# reference (block-sparse at 70% density, and causal, at 2 and 3 stages). Run `OUT=$OUT bash
# exp/s51_next_fused_bwd.sh` (carry `.whl`), about 3 minutes; a hang is reported by the script's watchdog.
. exp/s28_env.sh
git apply exp/s51_shared_dq.patch || exit 1
cd exp && PYTHONPATH=../src:/tmp/site timeout 240 python3 s51_fused_bwd.py 2>&1 | tee "$OUT/fused_bwd.txt" | grep -v Warn | tail -16
