#!/usr/bin/env bash
# Installs every Debian 12 package the project needs to build, test and benchmark.
# Idempotent: it asks apt only for what is missing, and says nothing when all is there.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libyaml-cpp-dev libvalijson-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev doctest-dev
  libopenmpi-dev openmpi-bin
  libhdf5-openmpi-dev hdf5-tools
  libopenblas-openmp-dev
  libdnnl-dev
  python3-torch python3-h5py python3-numpy
  slurm-wlm munge
  chromium
  clang libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: done"
