#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (README's second command).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build
export OMP_WAIT_POLICY=PASSIVE
# The soaks and the Slurm cluster are .ci/run's own steps (SOAKS below: the quickstarts trained
# to accuracy, GPT and Llama, ~3-4 min each, and in bf16 and fp16; the quickstart completing
# additions through `runner generate`; real Slurm clusters (one node, two nodes);
# soak_hardening: kills, corrupt checkpoints, fuzzed recipes; soak_outputs: interrupted outputs).
SOAKS='^(test_quickstart|test_quickstart_llama|test_quickstart16|test_generate_quickstart|test_slurm|test_slurm_nodes|soak_hardening|soak_outputs)$'
# The strict-device variants (label strict, cmake/strict_tests.cmake: the device tests again on
# hardware.device cpu-strict) are .ci/run's own step too: `ctest --test-dir build -L strict`.
ctest --test-dir build --output-on-failure --timeout 900 -j2 -E "$SOAKS" -LE strict
