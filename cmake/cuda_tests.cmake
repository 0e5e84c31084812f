# The GPU tests (tests/cuda/test_*.cpp, each with its own main): built whenever the toolkit is
# found (CI builds them), run by ctest, and reported as skipped (exit 77) without a GPU.
file(GLOB CUDA_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cuda/test_*.cpp)
foreach(src ${CUDA_TEST_SOURCES})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE runner_test_deps runner_cuda)
  if(TARGET runner_parallel_cuda)
    target_link_libraries(${name} PRIVATE runner_parallel_cuda)
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=PASSIVE")
endforeach()
# The host-staged communicator with two ranks on the one GPU (the NCCL case checks world 1).
if(TARGET test_cuda_comm)
  add_test(NAME test_cuda_comm_mpi2 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe
    ${MPIEXEC_PREFLAGS} $<TARGET_FILE:test_cuda_comm> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(test_cuda_comm_mpi2 PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
    ENVIRONMENT "OMP_NUM_THREADS=1;${RUNNER_MPI_TEST_ENV}")
endif()
