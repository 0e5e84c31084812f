#!/usr/bin/env bash
# Installs what is missing, builds, and trains the quickstart recipe (README's first command).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build runner
exec ./build/runner train recipes/quickstart.yaml "$@"
