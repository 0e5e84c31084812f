#!/usr/bin/env bash
# The one prepared GPU check, for the H200 machine (nvcc 13, cuDNN, NCCL, PyTorch; none of our
# Debian libraries; no network): the whole proof of the GPU path in one command of at most 10
# minutes. Run from the repository root:
#
#   scripts/gpu-deps.sh gpu-debs          # HERE, before: downloads the Debian packages
#   scripts/gpu-check.sh [gpu-debs]       # THERE: unpack, build, prove, benchmark -> $OUT
#
# 1. Unpacks every gpu-debs/*.deb with `dpkg-deb -x` (or ar + tar) into a prefix under /tmp
#    (never into /), points Open MPI (OPAL_PREFIX) and HDF5's h5pcc at it, and uses the
#    prefix's cmake/ninja only where the machine has none (or too old a cmake).
# 2. Configures and builds the runner and the GPU tests against the prefix (-j all cores).
# 3. The GPU-versus-CPU kernel tests: test_cuda_kernels, test_cuda_comm (+ two ranks on one GPU,
#    host-staged) and test_device_select must PASS here (exit 77, the no-GPU skip, fails).
# 4. The quickstart trained on the GPU (hardware.device=cuda) in fp32 and bf16: at least 90%
#    held-out accuracy, and its first 50 losses within the precision tolerance of the CPU
#    run's (scripts/compare_metrics.py; the CPU reference stops after 50 steps).
# 5. The benchmark: GPT-2 124M at T=1024, bf16 with fp32 masters: the runner's tokens/s and MFU
#    against the bf16 matmul peak measured in the same run, next to PyTorch eager and
#    torch.compile (bench/torch_gpt_gpu.py).
# 6. A SIGKILL and bit-exact resume on the GPU: a run killed after its step-200 checkpoint and
#    resumed must give an uninterrupted run's losses for steps 201..300 bit for bit (whether the
#    GPU's atomics make two uninterrupted runs differ is recorded beside it).
# 7. dp2 and tp2 on the one GPU through the host-staged communicator (RUNNER_HOST_STAGED_COMM=1),
#    matching one rank's losses (same global batch) within fp32 tolerance.
# 8. The GPU's hardware profile for the layout search: `runner calibrate --device cuda` writes
#    $OUT/gpu-profile.json (GEMM rates per shape and dtype through cuBLASLt, attention, memory-bound
#    ops, launch cost; one process, so no collectives), for `runner plan --search --profile`.
# Each phase has its own timeout and is skipped, saying so, when too little of the 10 minutes is
# left (the order is their importance).
#
# Results under $OUT (at most 8 files, as the device tool returns): summary.json (every phase:
# name, ok, seconds, figures), summary.txt (the same in words), build.log, tests.log, runs.log
# (every runner command and its output), bench.jsonl, env.txt, gpu-profile.json. Exit status: 0 only when every
# phase that ran passed. RUNNER_GPU_CHECK_CONFIGURE_ONLY=1 stops after configuring (how the
# unpack-and-configure part is tested on a machine without a GPU).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEBS=$(cd "${1:-$ROOT/gpu-debs}" 2>/dev/null && pwd) || { echo "gpu-check: no package folder ${1:-gpu-debs} (run scripts/gpu-deps.sh first)"; exit 2; }
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
P=${RUNNER_GPU_PREFIX:-/tmp/runner-gpu-prefix}
BUILD=${RUNNER_GPU_BUILD:-$ROOT/build-gpu}
JOBS=$(nproc)
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
t_start=$(date +%s)
elapsed() { echo $(( $(date +%s) - t_start ))s; }

# ---- 1. the prefix ----
unpack() {
  rm -rf "$P" && mkdir -p "$P"
  local n=0
  for d in "$DEBS"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$d" "$P" || return 1
    else  # a .deb is an ar archive holding data.tar.{xz,zst,gz}
      local tmp; tmp=$(mktemp -d)
      (cd "$tmp" && ar x "$d" && tar -xf data.tar.* -C "$P") || return 1
      rm -rf "$tmp"
    fi
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || { echo "no .deb files in $DEBS"; return 1; }
  local U=$P/usr
  # Debian's alternatives are not run by dpkg -x: link the names the build calls.
  ln -sf mpicc.openmpi "$U/bin/mpicc"
  ln -sf mpirun.openmpi "$U/bin/mpirun" 2>/dev/null || ln -sf orterun "$U/bin/mpirun"
  [ -e "$U/bin/mpirun.openmpi" ] || ln -sf orterun "$U/bin/mpirun"
  ln -sf mpiexec.openmpi "$U/bin/mpiexec" 2>/dev/null || ln -sf orterun "$U/bin/mpiexec"
  [ -e "$U/bin/mpiexec.openmpi" ] || ln -sf orterun "$U/bin/mpiexec"
  # h5pcc names its install prefix literally; point it at ours.
  sed -i "s|^prefix=\"/usr\"|prefix=\"$U\"|" "$U/bin/h5pcc.openmpi"
  ln -sf h5pcc.openmpi "$U/bin/h5pcc"
  echo "unpacked $n packages into $P"
}
prefix_env() {
  local U=$P/usr L=$P/usr/lib/x86_64-linux-gnu
  export OPAL_PREFIX=$U                                   # Open MPI is relocatable through it
  export PMIX_INSTALL_PREFIX=$L/pmix2 PMIX_PREFIX=$L/pmix2
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export LD_LIBRARY_PATH=$L:$L/openmpi/lib:$L/hdf5/openmpi:$L/openblas-openmp:$L/pmix2/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export PATH=$PATH:$U/bin                                # the machine's own tools first
}
cmake_ok() { command -v cmake >/dev/null && cmake --version | awk 'NR==1{split($3,v,"."); exit !(v[1]>3 || (v[1]==3 && v[2]>=25))}'; }

say "gpu-check $(date -u +%FT%TZ) on $(hostname)"
{ nvidia-smi 2>&1 | head -15; nvcc --version 2>&1 | tail -2; g++ --version | head -1; cmake --version 2>&1 | head -1;
  /usr/bin/env python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1; } >"$OUT/env.txt"
if ! unpack >"$OUT/build.log" 2>&1; then say "FAIL unpack (see build.log)"; exit 1; fi
prefix_env
CMAKE=cmake; cmake_ok || CMAKE=$P/usr/bin/cmake
GEN=(-G Ninja); command -v ninja >/dev/null || { [ -x "$P/usr/bin/ninja" ] && GEN=(-G Ninja -DCMAKE_MAKE_PROGRAM=$P/usr/bin/ninja) || GEN=(-G "Unix Makefiles"); }
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
say "prefix ready ($(elapsed)); cmake: $($CMAKE --version | head -1); nvcc: $NVCC"

# ---- 2. configure and build ----
export CCACHE_DISABLE=1
L=$P/usr/lib/x86_64-linux-gnu
timeout 120 "$CMAKE" -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$P/usr" -DCUDAToolkit_ROOT="$(dirname "$(dirname "$NVCC")")" -DCMAKE_CUDA_COMPILER="$NVCC" \
  -DCMAKE_CUDA_FLAGS="-allow-unsupported-compiler" \
  -DMPI_C_COMPILER="$P/usr/bin/mpicc" -DMPIEXEC_EXECUTABLE="$P/usr/bin/mpiexec" \
  -DHDF5_C_COMPILER_EXECUTABLE="$P/usr/bin/h5pcc" \
  -DOPENBLAS_LIB="$L/openblas-openmp/libopenblas.so" -DOPENBLAS_INCLUDE_DIR="$P/usr/include/x86_64-linux-gnu/openblas-openmp" \
  -DVALIJSON_INCLUDE_DIR="$P/usr/include" -DCLI11_INCLUDE_DIR="$P/usr/include" \
  -DMPI_mpi_LIBRARY="$L/openmpi/lib/libmpi.so" -DMPI_open-rte_LIBRARY="$L/openmpi/lib/libopen-rte.so" \
  -DMPI_open-pal_LIBRARY="$L/openmpi/lib/libopen-pal.so" -DMPI_hwloc_LIBRARY="$L/libhwloc.so.15" \
  -DMPI_event_core_LIBRARY="$L/libevent_core-2.1.so.7" -DMPI_event_pthreads_LIBRARY="$L/libevent_pthreads-2.1.so.7" \
  -DMPI_z_LIBRARY="$L/libz.so" -DRUNNER_WITH_DNNL=OFF >>"$OUT/build.log" 2>&1
rc=$?
# Every library the configure resolved must come from the prefix, the C library, or CUDA: a
# path into the machine's own /usr/lib (which the GPU machine does not have) is a bug here.
stray=$(grep -E '^[A-Za-z0-9_.+-]+:FILEPATH=/usr/lib/' "$BUILD/CMakeCache.txt" 2>/dev/null |
        grep -vE '/lib(m|dl|pthread|rt|c)\.(so|a)$|=/usr/lib/gcc/' || true)
if [ -n "$stray" ]; then say "FAIL configure: libraries outside the prefix:"; say "$stray"; exit 1; fi
grep -E "^-- (CUDA|Building the CUDA|NCCL|HDF5|OpenBLAS|oneDNN)" "$OUT/build.log" | tee -a "$SUMMARY"
[ $rc -eq 0 ] || { say "FAIL configure rc=$rc ($(elapsed), see build.log)"; exit 1; }
if [ -n "${RUNNER_GPU_CHECK_CONFIGURE_ONLY:-}" ]; then say "configured ($(elapsed)); stopping (RUNNER_GPU_CHECK_CONFIGURE_ONLY)"; exit 0; fi
timeout 300 "$CMAKE" --build "$BUILD" -j "$JOBS" --target runner test_cuda_kernels test_cuda_comm test_device_select >>"$OUT/build.log" 2>&1
rc=$?
fails=0
PHASES=$(mktemp)  # one JSON object per phase; summary.json at the end
phase() {  # name ok(0/1) seconds detail-json: record a phase's result
  local ok=false; [ "$2" = 1 ] && ok=true
  echo "{\"phase\": \"$1\", \"ok\": $ok, \"seconds\": $3, \"detail\": ${4:-null}}" >>"$PHASES"
  if [ "$2" = 1 ]; then say "PASS $1 ($3 s)"; else say "FAIL $1 ($3 s): ${4:-}"; fails=$((fails + 1)); fi
}
skip() { echo "{\"phase\": \"$1\", \"ok\": null, \"skipped\": \"$2\"}" >>"$PHASES"; say "SKIP $1: $2"; }
left() { echo $(( 590 - ($(date +%s) - t_start) )); }
finish() {
  python3 - "$PHASES" "$OUT/summary.json" "$fails" <<'PY'
import json, sys, datetime, subprocess
phases = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20).stdout.strip()
except Exception as e:
    gpu = f"nvidia-smi: {e}"
json.dump({"date": datetime.datetime.utcnow().isoformat() + "Z", "gpu": gpu, "failed": int(sys.argv[3]),
           "phases": phases}, open(sys.argv[2], "w"), indent=1)
PY
  rm -f "$PHASES"
  say "done ($(elapsed)); failed phases: $fails"
  [ "$fails" -eq 0 ]
  exit $?
}
if [ $rc -eq 0 ]; then phase build 1 "$(( $(date +%s) - t_start ))"; else phase build 0 "$(( $(date +%s) - t_start ))" "\"rc=$rc, see build.log\""; finish; fi

# ---- 3. GPU tests ----
run_test() {  # name, timeout, command...: exit 0 required (77 = skipped = a failure here)
  local name=$1 t=$2; shift 2
  echo "==== $name: $*" >>"$OUT/tests.log"
  local t0; t0=$(date +%s)
  timeout "$t" "$@" >>"$OUT/tests.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then phase "$name" 1 $(( $(date +%s) - t0 )); else phase "$name" 0 $(( $(date +%s) - t0 )) "\"rc=$rc, see tests.log\""; fi
}
export OMP_NUM_THREADS=8 OMP_WAIT_POLICY=PASSIVE RUNNER_EXPECT_GPU=1
run_test test_cuda_kernels 120 "$BUILD/test_cuda_kernels"
run_test test_cuda_comm 60 "$BUILD/test_cuda_comm"
run_test test_cuda_comm_mpi2 60 "$P/usr/bin/mpiexec" -n 2 --oversubscribe "$BUILD/test_cuda_comm"
run_test test_device_select 90 "$BUILD/test_device_select"

# ---- the runs: quickstart on the GPU against the CPU, resume, dp2/tp2, the runner's benchmark ----
W=$(mktemp -d /tmp/gpu-check-runs.XXXX)
QUICK="$ROOT/recipes/quickstart.yaml"
CMP=(python3 "$ROOT/scripts/compare_metrics.py")
runner_run() {  # timeout dir args...: one runner command, logged to runs.log
  local t=$1 dir=$2; shift 2
  echo "==== runner $* (run dir $dir)" >>"$OUT/runs.log"
  timeout "$t" "$BUILD/runner" "$@" --quiet --run-dir "$dir" >>"$OUT/runs.log" 2>&1
}
check() {  # name, seconds-since, compare_metrics args...: a phase from a comparison's JSON line
  local name=$1 t0=$2; shift 2
  local out rc
  out=$("${CMP[@]}" "$@" 2>>"$OUT/runs.log" | tail -1); rc=$?
  [ -n "$out" ] || out='{"error": "compare_metrics printed nothing"}'
  if [ $rc -eq 0 ] && echo "$out" | grep -q '"ok": true'; then phase "$name" 1 $(( $(date +%s) - t0 )) "$out"
  else phase "$name" 0 $(( $(date +%s) - t0 )) "$out"; fi
}
# Tolerances for the first 50 losses, GPU against CPU: fp32 differs by summation order and
# expf against the CPU's polynomial (a few ulp per op, grown over 50 Adam steps); bf16 rounds
# every activation to 8 bits of mantissa (2^-8 relative) on paths that round in other places.
declare -A RTOL=([fp32]=2e-3 [bf16]=5e-2)
for prec in fp32 bf16; do
  [ "$(left)" -gt 120 ] || { skip "quickstart_gpu_$prec" "out of time"; continue; }
  t0=$(date +%s)
  # The CPU reference: the same recipe, stopped by the fault hook at step 51 (its first 50 losses are written).
  RUNNER_FAULT_FAIL_RANK=0 RUNNER_FAULT_FAIL_STEP=51 runner_run 120 "$W/cpu-$prec" train "$QUICK" \
    --set hardware.device=cpu --set precision.compute=$prec --set train.log_every=1
  runner_run 180 "$W/gpu-$prec" train "$QUICK" --set hardware.device=cuda --set precision.compute=$prec --set train.log_every=1
  rc=$?
  if [ $rc -ne 0 ]; then phase "quickstart_gpu_$prec" 0 $(( $(date +%s) - t0 )) "\"runner train on the GPU: rc=$rc, see runs.log\""; continue; fi
  check "quickstart_gpu_${prec}_accuracy" "$t0" accuracy "$W/gpu-$prec/metrics.jsonl" --min 0.9
  check "quickstart_gpu_${prec}_first50_vs_cpu" "$t0" losses "$W/gpu-$prec/metrics.jsonl" "$W/cpu-$prec/metrics.jsonl" \
    --steps 50 --rtol "${RTOL[$prec]}" --atol 1e-4
done

# ---- the benchmark: GPT-2 124M at T=1024, bf16 compute with fp32 masters ----
PY=$(command -v python3)
BENCH=$OUT/bench.jsonl
: >"$BENCH"
PEAK=$(timeout 60 env -u LD_LIBRARY_PATH "$PY" -c '
import sys; sys.path.insert(0, "'"$ROOT"'/bench")
import torch_gpt_gpu as t; print(round(t.matmul_peak_tflops("cuda"), 1))' 2>>"$OUT/tests.log")
say "bf16 matmul peak (8192^3, measured): ${PEAK:-?} TFLOP/s"
"$PY" -c "
import random; random.seed(0); w='the of and to in is that for it as with was on be at by'.split()
open('$W/bench.txt', 'w').write(' '.join(random.choice(w) for _ in range(400000)))"
if [ "$(left)" -gt 60 ]; then
  t0=$(date +%s)
  runner_run 120 "$W/bench" train "$ROOT/recipes/gpt2-124m.yaml" --set hardware.device=h200 --set parallel.dp=1 \
    --set parallel.zero=0 --set precision.compute=bf16 --set precision.master_weights=fp32 --set data.path="$W/bench.txt" \
    --set batch.global=8 --set batch.micro=8 --set train.steps=15 --set train.eval_every=0 --set train.log_every=1 \
    --set checkpoint.every_steps=1000 --set recompute.mode=none
  rc=$?
  FPT=$("$PY" -c "import json; print(json.load(open('$W/bench/plan.json'))['flops_per_token'])" 2>/dev/null || echo 0)
  line=$("${CMP[@]}" throughput "$W/bench/metrics.jsonl" --skip 5 --flops-per-token "$FPT" --peak-tflops "${PEAK:-0}" 2>>"$OUT/runs.log" | tail -1)
  [ -n "$line" ] || line='{"error": "no step records"}'
  line="{\"impl\": \"runner\", \"dtype\": \"bf16\", \"master\": \"fp32\", \"batch\": 8, \"seq\": 1024, \"rc\": $rc, \"result\": $line}"
  echo "$line" >>"$BENCH"
  if [ $rc -eq 0 ]; then phase bench_runner 1 $(( $(date +%s) - t0 )) "$line"; else phase bench_runner 0 $(( $(date +%s) - t0 )) "$line"; fi
else
  skip bench_runner "out of time"
fi
torch_bench() {  # dtype recompute compile
  [ "$(left)" -gt 40 ] || { skip "bench_torch_$1_r$2_c$3" "out of time"; return; }
  local t=$(( $(left) < 150 ? $(left) : 150 )) line
  line=$(timeout "$t" env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 "$PY" "$ROOT/bench/torch_gpt_gpu.py" --dtype "$1" --recompute "$2" \
         --compile "$3" --batch 8 --seq 1024 --steps 10 --warmup 3 --peak-tflops "${PEAK:-0}" --json 2>>"$OUT/tests.log" | tail -1)
  [ -n "$line" ] || line="{\"impl\": \"pytorch\", \"dtype\": \"$1\", \"recompute\": $2, \"compile\": $3, \"error\": \"failed or timed out (${t}s), see tests.log\"}"
  echo "$line" >>"$BENCH"
  say "bench $line"
}
torch_bench bf16 0 0   # PyTorch eager, the same model, batch and sequence
torch_bench bf16 0 1   # torch.compile

# ---- SIGKILL and bit-exact resume on the GPU ----
if [ "$(left)" -gt 90 ]; then
  t0=$(date +%s)
  RES=(--set hardware.device=cuda --set train.steps=300 --set train.eval_every=0 --set train.log_every=1 --set checkpoint.every_steps=100)
  runner_run 90 "$W/res-a" train "$QUICK" "${RES[@]}"
  echo "==== runner train (to be killed) $W/res-b" >>"$OUT/runs.log"
  RUNNER_FAULT_STEP_SLEEP_MS=20 "$BUILD/runner" train "$QUICK" "${RES[@]}" --quiet --run-dir "$W/res-b" >>"$OUT/runs.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do [ -e "$W/res-b/checkpoints/step_00000200.h5" ] && break; sleep 0.1; done
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
  echo "==== runner resume $W/res-b" >>"$OUT/runs.log"
  timeout 90 "$BUILD/runner" resume "$W/res-b" --quiet >>"$OUT/runs.log" 2>&1
  check resume_gpu_bit_exact "$t0" losses "$W/res-b/metrics.jsonl" "$W/res-a/metrics.jsonl" --from 200 --steps 100 --exact
  # Beside it: whether two uninterrupted GPU runs agree bit for bit before the kill (atomics may not).
  "${CMP[@]}" losses "$W/res-b/metrics.jsonl" "$W/res-a/metrics.jsonl" --steps 200 --exact >>"$OUT/runs.log" 2>&1 &&
    say "note: the killed run's steps 1..200 equal the uninterrupted run's bit for bit" ||
    say "note: two GPU runs differ before the kill (atomics' order): see runs.log"
else
  skip resume_gpu_bit_exact "out of time"
fi

# ---- dp2 and tp2 on one GPU (host-staged communicator) against one rank, the same global batch ----
if [ "$(left)" -gt 90 ]; then
  PAR=(--set hardware.device=cuda --set train.steps=50 --set train.eval_every=0 --set train.log_every=1
       --set checkpoint.every_steps=50 --set batch.global=64 --set batch.micro=32)
  t0=$(date +%s)
  runner_run 60 "$W/one" train "$QUICK" "${PAR[@]}"
  for layout in dp tp; do
    t1=$(date +%s)
    echo "==== mpiexec -n 2 runner train ($layout 2, host-staged)" >>"$OUT/runs.log"
    RUNNER_HOST_STAGED_COMM=1 timeout 90 "$P/usr/bin/mpiexec" -n 2 --oversubscribe -x RUNNER_HOST_STAGED_COMM -x OMP_NUM_THREADS \
      "$BUILD/runner" train "$QUICK" "${PAR[@]}" --set parallel.$layout=2 --quiet --run-dir "$W/${layout}2" >>"$OUT/runs.log" 2>&1
    check "${layout}2_host_staged_vs_one_rank" "$t1" losses "$W/${layout}2/metrics.jsonl" "$W/one/metrics.jsonl" --steps 50 --rtol 1e-3 --atol 1e-5
  done
else
  skip dp2_tp2_host_staged "out of time"
fi

# ---- the GPU's hardware profile for the layout search ----
if [ "$(left)" -gt 60 ]; then
  t0=$(date +%s)
  echo "==== runner calibrate --device cuda" >>"$OUT/runs.log"
  timeout $(( $(left) < 150 ? $(left) - 10 : 140 )) "$BUILD/runner" calibrate --device cuda --out "$OUT/gpu-profile.json" \
    >>"$OUT/runs.log" 2>&1
  rc=$?
  best=$("$PY" -c "import json; p = json.load(open('$OUT/gpu-profile.json')); r = [g[3] for g in p['compute'][0]['gemm'].get('bf16', [])]
print(round(max(r) / 1e12, 1) if r else 0)" 2>/dev/null || echo 0)
  if [ $rc -eq 0 ]; then phase calibrate_gpu 1 $(( $(date +%s) - t0 )) "{\"best_bf16_gemm_tflops\": ${best:-0}}"
  else phase calibrate_gpu 0 $(( $(date +%s) - t0 )) "\"runner calibrate --device cuda: rc=$rc, see runs.log\""; fi
else
  skip calibrate_gpu "out of time"
fi

# Further PyTorch rows while time remains (fp32; bf16 with activation checkpointing).
torch_bench fp32 0 0
torch_bench bf16 1 1
finish
