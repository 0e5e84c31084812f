# Finds the CUDA toolkit and the libraries the GPU backend uses, enables the CUDA language,
# and says what it found. Sets RUNNER_HAVE_CUDA, RUNNER_HAVE_CUDNN, RUNNER_HAVE_NCCL.
find_package(CUDAToolkit QUIET)
if(NOT CUDAToolkit_FOUND)
  message(STATUS "CUDA not found: CPU backend only")
  return()
endif()
if(NOT TARGET CUDA::cublasLt)
  message(STATUS "CUDA ${CUDAToolkit_VERSION} found but not cuBLASLt: CPU backend only")
  return()
endif()
# sm_90 (H100/H200) machine code plus compute_90 PTX (any newer GPU JIT-compiles it): one
# architecture keeps nvcc's cost small. Override with -DCMAKE_CUDA_ARCHITECTURES=...
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual")
endif()
if(NOT CMAKE_CUDA_COMPILER)
  set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
endif()
if(NOT CMAKE_CUDA_HOST_COMPILER)
  set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
endif()
if(CMAKE_CXX_COMPILER_LAUNCHER AND NOT CMAKE_CUDA_COMPILER_LAUNCHER)
  set(CMAKE_CUDA_COMPILER_LAUNCHER ${CMAKE_CXX_COMPILER_LAUNCHER})
endif()
# One CUDA runtime in the process: the shared one, as CUDA::cudart (not nvcc's default static one).
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 17)  # CMake 3.25 knows no CUDA20 for nvcc; ops/ headers are C++17-clean
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(RUNNER_HAVE_CUDA ON)

# cuDNN (version from cudnn_version.h; the attention kernel is our own, cuDNN is reported only).
set(RUNNER_HAVE_CUDNN OFF)
find_path(CUDNN_INCLUDE_DIR cudnn_version.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
find_library(CUDNN_LIB cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
set(RUNNER_CUDNN_VERSION "")
if(CUDNN_INCLUDE_DIR AND CUDNN_LIB)
  file(STRINGS ${CUDNN_INCLUDE_DIR}/cudnn_version.h _v REGEX "^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
  string(REGEX REPLACE ".*CUDNN_MAJOR ([0-9]+).*CUDNN_MINOR ([0-9]+).*CUDNN_PATCHLEVEL ([0-9]+).*" "\\1.\\2.\\3"
    RUNNER_CUDNN_VERSION "${_v}")
  set(RUNNER_HAVE_CUDNN ON)
endif()

# NCCL (version from nccl.h): the multi-GPU communicator.
set(RUNNER_HAVE_NCCL OFF)
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
find_library(NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
set(RUNNER_NCCL_VERSION "")
if(NCCL_INCLUDE_DIR AND NCCL_LIB)
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _v REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*" "\\1.\\2.\\3"
    RUNNER_NCCL_VERSION "${_v}")
  set(RUNNER_HAVE_NCCL ON)
endif()

set(_cudnn "cuDNN not found")
if(RUNNER_HAVE_CUDNN)
  set(_cudnn "cuDNN ${RUNNER_CUDNN_VERSION} (found, not used by a kernel yet)")
endif()
set(_nccl "NCCL not found (no NCCL communicator)")
if(RUNNER_HAVE_NCCL)
  set(_nccl "NCCL ${RUNNER_NCCL_VERSION} (NCCL communicator built)")
endif()
message(STATUS "CUDA ${CUDAToolkit_VERSION} found at ${CUDAToolkit_BIN_DIR}: cuBLASLt yes, ${_cudnn}, ${_nccl}")
message(STATUS "Building the CUDA backend (runner_cuda, ops/cuda/) for ${CMAKE_CUDA_ARCHITECTURES}, "
  "and the GPU kernel tests (tests/cuda/, skipped without a GPU)")
