#!/usr/bin/env bash
# libFuzzer on the readers of untrusted input: the recipe loader (fuzz_recipe), the checkpoint
# readers behind `runner inspect` / `runner resume` (fuzz_checkpoint), the safetensors headers
# `runner import` reads (fuzz_safetensors), hardware profiles (fuzz_hardware_profile) and the
# tokenizer readers (fuzz_tokenizer_json, fuzz_sentencepiece).
# Usage: scripts/fuzz.sh [SECONDS, default 60]: the fuzzing time is 2 x SECONDS in all, shared
# evenly among the targets (adding a target does not lengthen CI).
# Builds build-fuzz with clang (-fsanitize=fuzzer,address,undefined; only the fuzz targets and
# the sources they read with), seeds fuzz_recipe with recipes/*.yaml and tests/bad_recipes,
# fuzz_checkpoint with one small checkpoint trained by build/runner (made here if missing).
# Fails on any crash, sanitizer report, non-UserError exception or timeout in our code. A crash
# or leak whose top frame is inside libhdf5 (not instrumented; a corrupt file can crash it: that is why
# `runner inspect` and resume verification run in a forked child) is listed, kept under
# build-fuzz/findings/, and does not fail the run.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=(fuzz_recipe fuzz_checkpoint fuzz_safetensors fuzz_hardware_profile fuzz_tokenizer_json fuzz_sentencepiece)
TOTAL=$((2 * ${1:-60}))
SECS=$((TOTAL / ${#TARGETS[@]}))
ROOT="$PWD"
B=build-fuzz
export OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1
t0=$SECONDS
mkdir -p "$B"
CC=clang CXX=clang++ cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRUNNER_FUZZ=ON \
  -DRUNNER_WITH_CUDA=OFF >"$B/configure.log" 2>&1 || { cat "$B/configure.log"; exit 1; }
ninja -C "$B" "${TARGETS[@]}"
echo "fuzz: build took $((SECONDS - t0)) s"

set +o pipefail   # below, `grep | head` pipelines: the status is the last command's
W="$ROOT/$B/work"
rm -rf "$W" && mkdir -p "$W"/recipe/corpus "$W"/recipe/seed "$W"/checkpoint/corpus "$W"/checkpoint/seed "$ROOT/$B/findings"
for t in safetensors hardware_profile; do mkdir -p "$W/$t/corpus" "$W/$t/seed"; done
cp recipes/*.yaml tests/bad_recipes/*.yaml "$W/recipe/seed/"

# The seed checkpoint: a one-layer d_model 8 quickstart, one step (about 44 KB).
if [ ! -x build/runner ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && ninja -C build runner
fi
build/runner train recipes/quickstart.yaml --quiet --run-dir "$W/seedrun" --set train.steps=1 \
  --set checkpoint.every_steps=1 --set train.eval_every=0 --set model.d_model=8 --set model.n_heads=1 \
  --set model.n_layers=1 --set model.seq_len=16 --set model.vocab_size=64 --set batch.micro=1 --set data.digits=1
cp "$W"/seedrun/checkpoints/step_*.h5 "$W/checkpoint/seed/"
# The safetensors seed: that model exported (about 20 KB); the hardware profile seed: the
# documented example's shape with every section filled.
build/runner export "$W/seedrun" --out "$W/seedexport" >/dev/null
cp "$W/seedexport/model.safetensors" "$W/safetensors/seed/"
cat >"$W/hardware_profile/seed/cpu.json" <<'JSON'
{"format": "runner-hardware-profile", "version": 1, "device": "cpu", "host": "h", "source": "s", "cores": 2,
 "devices_per_node": 1, "nodes": 1, "peak_flops": {"fp32": 1.6e11, "bf16": 8.1e11, "fp16": 1.6e11},
 "links": {"intra_node": {"latency_s": 2.0e-6, "bandwidth": 9.7e9}, "inter_node": {"latency_s": 3e-5, "bandwidth": 1.25e9}},
 "compute": [{"threads": 1, "memory_bandwidth": 1.0e10, "launch_s": 1e-7,
              "gemm": {"fp32": [[64, 64, 64, 3.1e10], [256, 256, 256, 5e10]], "bf16": [[64, 64, 64, 1e10]]},
              "attention": {"fp32": [[128, 64, 2e9, 1e9]]}, "op_bandwidth": {"layernorm": 2.2e10}}],
 "collectives": [{"op": "all_reduce", "ranks": 2, "inter_node": false, "latency_s": 9.2e-6, "bandwidth": 3.4e9}]}
JSON

status=0
# Top frame of a crash log outside the sanitizer runtime and libc: "hdf5" or "ours".
where() {
  grep -E '^ +#[0-9]+ ' "$1" | grep -vE '__asan|__sanitizer|__interceptor|__ubsan|libc\.so|libc_start|/libc-|asan_|sanitizer_common| in (free|malloc|calloc|realloc|abort|raise|operator delete)[ (]' \
    | head -1 | grep -q 'libhdf5' && echo hdf5 || echo ours
}

echo "== fuzz_recipe for ${SECS} s"
(cd "$W/recipe" && "$ROOT/$B/fuzz_recipe" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 corpus seed >log 2>&1) || true
grep -E '^(stat::|Done|#[0-9]+.*DONE)' "$W/recipe/log" | tail -4 || true
grep -E 'cov: [0-9]+' "$W/recipe/log" | tail -1 || true
for c in "$W"/recipe/crash-* "$W"/recipe/timeout-* "$W"/recipe/oom-* "$W"/recipe/leak-*; do
  [ -e "$c" ] || continue
  cp "$c" "$ROOT/$B/findings/"
  echo "fuzz_recipe: FINDING $(basename "$c") (ours):"; grep -E 'ERROR|SUMMARY|not a UserError|#[0-9] ' "$W/recipe/log" | head -12
  status=1
done

# The readers of JSON-framed input, run as fuzz_recipe is: every finding is in our code.
for t in safetensors hardware_profile; do
  echo "== fuzz_$t for ${SECS} s"
  (cd "$W/$t" && "$ROOT/$B/fuzz_$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 corpus seed >log 2>&1) || true
  grep -E 'cov: [0-9]+' "$W/$t/log" | tail -1 || true
  for c in "$W/$t"/crash-* "$W/$t"/timeout-* "$W/$t"/oom-* "$W/$t"/leak-*; do
    [ -e "$c" ] || continue
    cp "$c" "$ROOT/$B/findings/"
    echo "fuzz_$t: FINDING $(basename "$c") (ours):"; grep -E 'ERROR|SUMMARY|not a UserError|accepted|#[0-9] ' "$W/$t/log" | head -12
    status=1
  done
done

echo "== fuzz_checkpoint for ${SECS} s (fork mode: an HDF5 crash is kept and fuzzing goes on)"
max_len=$(( $(stat -c %s "$W"/checkpoint/seed/*.h5) + 4096 ))
(cd "$W/checkpoint" && "$ROOT/$B/fuzz_checkpoint" -fork=1 -ignore_crashes=1 -ignore_timeouts=0 \
  -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len="$max_len" -print_final_stats=1 \
  corpus seed >log 2>&1) || true
grep -E '#[0-9]+: cov: ' "$W/checkpoint/log" | tail -1 || true
grep -E 'INFO: fuzzed for|Done' "$W/checkpoint/log" | tail -2 || true
hdf5=0; ours=0; norepro=0
for c in "$W"/checkpoint/crash-* "$W"/checkpoint/timeout-* "$W"/checkpoint/oom-* "$W"/checkpoint/leak-*; do
  [ -e "$c" ] || continue
  cp "$c" "$ROOT/$B/findings/"
  rc=0; (cd "$W/checkpoint" && "$ROOT/$B/fuzz_checkpoint" "$c" >"$c.replay" 2>&1) || rc=$?
  case "$(basename "$c")" in crash-* | leak-*) w=$(where "$c.replay") ;; *) w=ours ;; esac
  if [ "$rc" = 0 ]; then
    norepro=$((norepro + 1))   # fork mode saves an empty unit when a job dies between inputs
  elif [ "$w" = hdf5 ]; then
    hdf5=$((hdf5 + 1))
  else
    ours=$((ours + 1)); status=1
    echo "fuzz_checkpoint: FINDING $(basename "$c") (ours):"; grep -E 'ERROR|SUMMARY|non-UserError|#[0-9]+ ' "$c.replay" | head -16
  fi
done
echo "fuzz_checkpoint: crashes and leaks inside libhdf5: $hdf5 (kept in $B/findings, not failing), in our code: $ours, not reproduced on replay: $norepro"
# The tokenizer readers, seeded with a small SentencePiece tokenizer trained here (its
# tokenizer.model and the equivalent tokenizer.json). libsentencepiece is not instrumented:
# a crash whose top frame is inside it is kept and counted, as libhdf5's are above.
build/runner data tokenizer train /usr/share/common-licenses/GPL-3 --vocab 400 --out "$W/seedtok" >/dev/null
for t in tokenizer_json sentencepiece; do
  mkdir -p "$W/$t/corpus" "$W/$t/seed"
  [ $t = tokenizer_json ] && cp "$W"/seedtok/tokenizer.json "$W/$t/seed/" 2>/dev/null
  [ $t = sentencepiece ] && cp "$W"/seedtok/tokenizer.model "$W/$t/seed/"
  echo "== fuzz_$t for ${SECS} s"
  (cd "$W/$t" && "$ROOT/$B/fuzz_$t" -fork=1 -ignore_crashes=1 -ignore_timeouts=0 -max_total_time="$SECS" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 corpus seed >log 2>&1) || true
  grep -E '#[0-9]+: cov: ' "$W/$t/log" | tail -1 || true
  lib=0; n=0
  for c in "$W/$t"/crash-* "$W/$t"/timeout-* "$W/$t"/oom-* "$W/$t"/leak-*; do
    [ -e "$c" ] || continue
    cp "$c" "$ROOT/$B/findings/"
    rc=0; (cd "$W/$t" && "$ROOT/$B/fuzz_$t" "$c" >"$c.replay" 2>&1) || rc=$?
    [ "$rc" = 0 ] && continue
    if grep -E '^ +#[0-9]+ ' "$c.replay" | grep -vE '__asan|__sanitizer|__interceptor|__ubsan|libc\.so|asan_|sanitizer_common|libstdc\+\+| in (free|malloc|abort|raise|operator)' \
        | head -1 | grep -q 'libsentencepiece'; then lib=$((lib + 1)); continue; fi
    n=$((n + 1)); status=1
    echo "fuzz_$t: FINDING $(basename "$c") (ours):"; grep -E 'ERROR|SUMMARY|not a UserError|outside|#[0-9]+ ' "$c.replay" | head -16
  done
  echo "fuzz_$t: findings in our code: $n, inside libsentencepiece: $lib (kept in $B/findings)"
done
echo "fuzz: total $((SECONDS - t0)) s, $([ $status = 0 ] && echo PASS || echo FAIL)"
exit $status
