set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
pack() { tar czf $OUT/r.tgz -C /tmp r; }
B="--repeats 5 --min_time 0.3 --no-memory"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $R/gpu.txt 2>&1; git log -1 --format=%h >> $R/gpu.txt; pack
timeout 170 python3 -m benchmarks.run --workloads zaremba_small_stack,zaremba_medium_stack $B --parallel_builds --out $R/stack > $R/stack.log 2>&1; echo "stack rc $?" >> $R/gpu.txt; pack
timeout 110 python3 -m benchmarks.run --workloads zaremba_small_bf16,godin_dense_200x2_bf16 --impls "ours,flax nn.RNN" $B --parallel_builds --out $R/flax_bf16 > $R/flax_bf16.log 2>&1; echo "bf16 rc $?" >> $R/gpu.txt; pack
XLA_FLAGS=--xla_gpu_enable_triton_gemm=false XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 130 python3 .gpu/probe_triton.py xla_gpu_enable_triton_gemm zaremba_small zaremba_large > $R/probe.log 2>&1; echo "probe rc $?" >> $R/gpu.txt; pack
timeout 120 python3 -m benchmarks.run --workloads hm_densegru --impls ours --triton_peer $B --out $R/triton_hm > $R/triton_hm.log 2>&1; echo "hm rc $?" >> $R/gpu.txt; pack
cat $R/gpu.txt; tail -3 $R/*.log
