#!/usr/bin/env bash
# The one prepared GPU check, for the H200 machine (nvcc 13, cuDNN, NCCL, PyTorch; none of our
# Debian libraries; no network). Run from the repository root:
#
#   scripts/gpu-deps.sh gpu-debs          # HERE, before: downloads the Debian packages
#   scripts/gpu-check.sh [gpu-debs]       # THERE: unpack, build, GPU tests, benchmark -> $OUT
#
# 1. Unpacks every gpu-debs/*.deb with `dpkg-deb -x` (or ar + tar) into a prefix under /tmp
#    (never into /), points Open MPI (OPAL_PREFIX) and HDF5's h5pcc at it, and uses the
#    prefix's cmake/ninja only where the machine has none (or too old a cmake).
# 2. Configures and builds the runner and the GPU tests against the prefix (-j all cores).
# 3. Runs the GPU tests: test_cuda_kernels and test_cuda_comm must PASS here (exit 77, the
#    no-GPU skip, counts as a failure on this machine), test_cuda_comm under mpirun -np 2
#    (host-staged, two ranks on one GPU), and test_device_select.
# 4. Benchmarks GPT-2 124M at sequence 1024 in PyTorch eager and torch.compile, fp32, bf16,
#    bf16 + activation checkpointing (bench/torch_gpt_gpu.py), with MFU against the bf16
#    matmul peak measured in the same run. `runner train` cannot run on the GPU yet (the
#    executor's tensors are host memory), so the runner's own rows record exactly that.
#
# Results (at most 8 files, as the device tool returns): $OUT/summary.txt, $OUT/build.log,
# $OUT/tests.log, $OUT/bench.jsonl, $OUT/env.txt. Budget: 10 minutes in all (build ~3-4 min
# on 16 cores; each phase has its own timeout so the later ones still run and report).
# Exit status: 0 only when every GPU test passed. RUNNER_GPU_CHECK_CONFIGURE_ONLY=1 stops after
# configuring (how the unpack-and-configure part is tested on a machine without a GPU).
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
built=1
if [ $rc -eq 0 ]; then say "built ($(elapsed))"; else say "FAIL build rc=$rc ($(elapsed), see build.log): no GPU tests, the benchmark still runs"; built=0; fails=1; fi

# ---- 3. GPU tests ----
run_test() {  # name, timeout, command...: exit 0 required (77 = skipped = a failure here)
  local name=$1 t=$2; shift 2
  echo "==== $name: $*" >>"$OUT/tests.log"
  timeout "$t" "$@" >>"$OUT/tests.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then say "PASS $name"; else say "FAIL $name rc=$rc"; fails=$((fails + 1)); fi
}
export OMP_NUM_THREADS=8 OMP_WAIT_POLICY=PASSIVE RUNNER_EXPECT_GPU=1
if [ $built -eq 1 ]; then
run_test test_cuda_kernels 120 "$BUILD/test_cuda_kernels"
run_test test_cuda_comm 60 "$BUILD/test_cuda_comm"
run_test test_cuda_comm_mpi2 60 "$P/usr/bin/mpiexec" -n 2 --oversubscribe "$BUILD/test_cuda_comm"
run_test test_device_select 60 "$BUILD/test_device_select"
# The runner on a GPU recipe: with a GPU present it must say why it does not train there yet.
( cd "$(mktemp -d)" && timeout 60 "$BUILD/runner" train "$ROOT/recipes/quickstart.yaml" --set hardware.device=cuda --set train.steps=2 ) >>"$OUT/tests.log" 2>&1
say "runner train on hardware.device=cuda: rc=$? (2 expected until the executor runs on the GPU; message in tests.log)"
fi
say "tests done ($(elapsed)), $fails failed"

# ---- 4. benchmark: GPT-2 124M, seq 1024, PyTorch eager and torch.compile ----
PY=$(command -v python3)
BENCH=$OUT/bench.jsonl
: >"$BENCH"
PEAK=$(timeout 60 env -u LD_LIBRARY_PATH "$PY" -c '
import sys; sys.path.insert(0, "'"$ROOT"'/bench")
import torch_gpt_gpu as t; print(round(t.matmul_peak_tflops("cuda"), 1))' 2>>"$OUT/tests.log")
say "bf16 matmul peak (8192^3, measured): ${PEAK:-?} TFLOP/s"
echo "{\"impl\": \"runner\", \"error\": \"runner train does not run on the GPU yet (host-memory executor); its CUDA kernels are tested by test_cuda_kernels\"}" >>"$BENCH"
for cfg in "fp32 0 0" "bf16 0 0" "bf16 1 0" "bf16 0 1" "bf16 1 1" "fp32 0 1"; do
  set -- $cfg
  left=$(( 570 - ($(date +%s) - t_start) ))
  [ $left -gt 30 ] || { say "SKIP bench dtype=$1 recompute=$2 compile=$3: out of time"; continue; }
  t=$(( left < 150 ? left : 150 ))
  line=$(timeout "$t" env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1 "$PY" "$ROOT/bench/torch_gpt_gpu.py" --dtype "$1" --recompute "$2" \
         --compile "$3" --batch 8 --seq 1024 --steps 10 --warmup 3 --peak-tflops "${PEAK:-0}" --json 2>>"$OUT/tests.log" | tail -1)
  [ -n "$line" ] || line="{\"impl\": \"pytorch\", \"dtype\": \"$1\", \"recompute\": $2, \"compile\": $3, \"error\": \"failed or timed out (${t}s), see tests.log\"}"
  echo "$line" >>"$BENCH"
  say "bench $line"
done
say "done ($(elapsed)); GPU tests failed: $fails"
[ $fails -eq 0 ]
