# The strict device (ops/strict/strict_backend.h): these tests run a second time as
# NAME_strict with RUNNER_STRICT=1, so every recipe on the CPU runs on `cpu-strict` (tensor
# memory host code cannot touch, kernels queued asynchronously). Label `strict`.
set(RUNNER_STRICT_TESTS
  # the step path through the executor
  test_executor test_precision16 test_model_golden test_step_observers
  test_train_precision test_recompute_auto test_quickstart
  # parallel layouts
  test_parallel test_parallel_grid test_layout test_pipeline test_parallel_precision test_ops_tp
  # training and checkpoints
  test_checkpoint test_resume test_hardening test_work_kept
  test_parallel_ckpt
  # generation and export
  test_generate test_generate_kv test_generate_tp test_export test_import
  # fused kernels
  test_ops_fused
  # the 16-bit-native kernels and attention
  test_ops_native16 test_ops_attention16
)
foreach(name ${RUNNER_STRICT_TESTS})
  add_test(NAME ${name}_strict COMMAND ${name})
  set_tests_properties(${name}_strict PROPERTIES
    ENVIRONMENT "RUNNER_STRICT=1;OMP_NUM_THREADS=2;OMP_WAIT_POLICY=PASSIVE;${RUNNER_MPI_TEST_ENV}"
    LABELS strict TIMEOUT 900)
endforeach()
