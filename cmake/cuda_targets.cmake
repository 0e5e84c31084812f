# The GPU backend: runner_cuda (ops/cuda/, ops layer: it includes ops/ headers only), the
# NCCL and host-staged communicators (parallel/cuda/, parallel layer), and the GPU tests.
# Included after runner_core is defined, only when cmake/cuda_detect.cmake found the toolkit.
# runner_core links runner_cuda (the kernels): `runner train` with a GPU device kind runs on it
# (runner/device/device.cpp). cuBLASLt is loaded (dlopen) only when the CUDA backend starts:
# linking it cost every process ~0.2 s of start-up here (mapping 540 MB), CPU runs included. runner_parallel_cuda (NCCL, host-staged) is linked by tests/cuda/.
add_library(runner_cuda_probe STATIC ${CMAKE_SOURCE_DIR}/ops/cuda/device_probe.cpp)
target_link_libraries(runner_cuda_probe PUBLIC runner_ops PRIVATE CUDA::cudart)
file(GLOB RUNNER_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/ops/cuda/*.cu ${CMAKE_SOURCE_DIR}/ops/cuda/*.cpp)
list(FILTER RUNNER_CUDA_SOURCES EXCLUDE REGEX ".*/device_probe\\.cpp$")
add_library(runner_cuda STATIC ${RUNNER_CUDA_SOURCES})
# The project's -march=native / -Wall are for the host compiler; nvcc gets them through -Xcompiler.
set_property(TARGET runner_cuda PROPERTY COMPILE_OPTIONS "")
target_compile_options(runner_cuda PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
  $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall,-Wno-unused-parameter>)
set_target_properties(runner_cuda PROPERTIES CUDA_SEPARABLE_COMPILATION OFF POSITION_INDEPENDENT_CODE ON)
# CUDA's headers and RUNNER_HAVE_CUDA stay private: ops/cuda/cuda_backend.h includes no CUDA
# header, and code above it compiles exactly as in a CPU-only build (same flags, same ccache
# entries); only runner/device/device.cpp asks whether the backend is there.
# cuBLASLt is dlopen'ed when the backend starts (ops/cuda/cuda_backend.cu): its headers only here.
target_include_directories(runner_cuda PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
target_compile_definitions(runner_cuda PRIVATE RUNNER_CUDA_LIBDIR="${CUDAToolkit_LIBRARY_DIR}")
target_link_libraries(runner_cuda PUBLIC runner_ops runner_cuda_probe PRIVATE CUDA::cudart ${CMAKE_DL_LIBS})
set_source_files_properties(${CMAKE_SOURCE_DIR}/runner/device/device.cpp PROPERTIES COMPILE_DEFINITIONS RUNNER_HAVE_CUDA=1)

file(GLOB RUNNER_PARALLEL_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/parallel/cuda/*.cpp)
if(RUNNER_HAVE_NCCL AND RUNNER_PARALLEL_CUDA_SOURCES)
  add_library(runner_parallel_cuda STATIC ${RUNNER_PARALLEL_CUDA_SOURCES})
  target_include_directories(runner_parallel_cuda PRIVATE ${NCCL_INCLUDE_DIR})
  target_link_libraries(runner_parallel_cuda PUBLIC runner_parallel runner_cuda PRIVATE CUDA::cudart ${NCCL_LIB} MPI::MPI_C)
endif()
target_link_libraries(runner_core PUBLIC runner_cuda)
# The run's communicator on a GPU device (runner/train/mpi_job.cpp): NCCL, or the
# host-staged MPI path (parallel/cuda/gpu_comm.h).
if(TARGET runner_parallel_cuda)
  target_link_libraries(runner_core PUBLIC runner_parallel_cuda)
  set_source_files_properties(${CMAKE_SOURCE_DIR}/runner/train/mpi_job.cpp PROPERTIES COMPILE_DEFINITIONS RUNNER_HAVE_NCCL=1)
endif()
