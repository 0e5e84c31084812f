#!/usr/bin/env bash
# Downloads (never installs) the Debian 12 packages that build and run the runner, for a
# machine that has none of them and no network: the H200 GPU machine (scripts/gpu-check.sh
# unpacks them with `dpkg -x` into a prefix there and builds against it).
#
#   scripts/gpu-deps.sh [DIR]        # default DIR: gpu-debs/
#
# DIR must travel with the working tree to the GPU machine: the device tool copies untracked
# files git does not ignore, so keep DIR un-ignored and uncommitted (gpu-debs/ is neither), or
# carry it explicitly. The list is what the build's binaries link (ldd of runner, the tests and
# Open MPI's plugins, mapped to packages with dpkg -S), the -dev packages whose headers and
# CMake files the build reads, and the link-time .so links HDF5's wrapper names. Left out on
# purpose, because the GPU machine's compiler brings its own and newer ones must win: libc6,
# libstdc++6, libgcc-s1, libgomp1 (and the CUDA toolkit, which that machine has); and oneDNN, the CPU's
# optional 16-bit GEMM (7 MB; gpu-check.sh builds with RUNNER_WITH_DNNL=OFF).
set -euo pipefail
DIR=${1:-gpu-debs}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)

DEV=(
  libyaml-cpp-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev libvalijson-dev doctest-dev
  libopenmpi-dev openmpi-bin openmpi-common libopenmpi3
  libhdf5-openmpi-dev libhdf5-openmpi-103-1 libhdf5-openmpi-hl-100 libhdf5-openmpi-cpp-103-1 libhdf5-openmpi-hl-cpp-100
  libhdf5-openmpi-fortran-102 libhdf5-openmpi-hl-fortran-100
  libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev
  libcurl4-openssl-dev libaec-dev zlib1g-dev libssl-dev
  cmake cmake-data ninja-build   # used there only when the machine lacks them (or cmake < 3.25)
)
RUNTIME=(
  ibverbs-providers libaec0 libatomic1 libbrotli1 libcurl4 libevent-core-2.1-7 libevent-pthreads-2.1-7
  libevent-2.1-7 libfabric1 libffi8 libfmt9 libgfortran5 libgmp10 libgnutls30 libgssapi-krb5-2 libhogweed6
  libhwloc15 libhwloc-plugins libibverbs1 libidn2-0 libk5crypto3 libkrb5-3 libkrb5support0 libkeyutils1 libcom-err2
  libldap-2.5-0 libmunge2 libnettle8 libnghttp2-14 libnl-3-200 libnl-route-3-200 libnuma1 libp11-kit0 libpmix2
  libpsl5 libpsm-infinipath1 libpsm2-2 libquadmath0 librdmacm1 librtmp1 libsasl2-2 libsasl2-modules-db libdb5.3
  libspdlog1.10 libssh2-1 libssl3 libsz2 libtasn1-6 libucx0 libudev1 libunistring2 libuuid1 libyaml-cpp0.7
  libzstd1 zlib1g ocl-icd-libopencl1 libltdl7 libxml2 libicu72 liblzma5 libpciaccess0 libxnvctrl0
  libjsoncpp25 librhash0 libuv1 libarchive13 libexpat1 libacl1 libbz2-1.0 liblz4-1 libb2-1   # cmake's
)
cd "$DIR"
# apt-get download fetches the candidate version of each (Debian archive only).
apt-get download "${DEV[@]}" "${RUNTIME[@]}" >/dev/null
n=$(ls -1 *.deb | wc -l)
echo "gpu-deps: $n packages, $(du -sh . | cut -f1) in $DIR"
