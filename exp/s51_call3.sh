# Session 51, call 3: the 2-CTA-cluster probe (exp/s51_cluster_probe.py: cuBLAS, our grouped matmul on 64 groups and
# on one, JAX's Hopper matmul with and without multicast clusters, M 32768 K 4096 N 1536), then dense flash attention
# at the block-sparse bench's shape (1 x 16384 x 16 x 128, both causal modes) on every implementation beside cuDNN, so
# that the block-sparse ratio can be read against our own Mosaic GPU dense kernels.
. exp/s28_env.sh
cd exp && PYTHONPATH=../src:/tmp/site timeout 240 python3 s51_cluster_probe.py 2>&1 | tee "$OUT/cluster_probe.txt" | tail -20
cd .. && OUT=$OUT SKIP_TESTS=1 BENCH_TIMEOUT=200 bash tools/gpu-suite "flash_attention --shape 1,16384,16,128 \
    --only ejkernel-auto,ejkernel-pallas,jax-cudnn --repeats 10" > "$OUT/dense16k.txt" 2>&1
tail -6 "$OUT/dense16k.txt"
