# Paths of the cuda backend only the CUDA/NCCL test doubles can show without a GPU (label
# cuda_double; tests/unit/test_cuda_paths.cc runs with the other unit tests there):
# more ranks on a node than GPUs is refused by sp_world_init on every rank.
if(NOT SYMPOOL_CUDA_DOUBLE OR NOT SP_HAVE_MPI)
  return()
endif()
add_executable(sp_world_crowded ${CMAKE_CURRENT_SOURCE_DIR}/cuda_paths/world_crowded.c)
target_compile_options(sp_world_crowded PRIVATE ${SP_WARN})
target_link_libraries(sp_world_crowded PRIVATE sympool MPI::MPI_C)
add_dependencies(sp_world_crowded sp_cuda_double)
add_test(NAME cuda_double.world_crowded.np2_on_1_gpu
  COMMAND sh -c "'${MPIEXEC_EXECUTABLE}' ${MPIEXEC_NUMPROC_FLAG} 2 --oversubscribe '$<TARGET_FILE:sp_world_crowded>' | grep -c 'crowded ok'")
set_tests_properties(cuda_double.world_crowded.np2_on_1_gpu PROPERTIES LABELS cuda_double
  TIMEOUT 120 PASS_REGULAR_EXPRESSION "(^|\n)2\n"
  ENVIRONMENT "SYMPOOL_DEVICE=cuda;LD_LIBRARY_PATH=${PROJECT_BINARY_DIR}/cuda-double;CUDA_DOUBLE_GPUS=1;CUDA_DOUBLE_NCCL_TIMEOUT=60;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_btl_vader_single_copy_mechanism=none;OMPI_MCA_mpi_yield_when_idle=1")
# Ranks on one GPU are told apart by its PCI bus id: one GPU each, all seen as device 0
# (CUDA_VISIBLE_DEVICES per rank), is a world; two ordinals naming one GPU are refused.
add_executable(sp_world_gpu_ids ${CMAKE_CURRENT_SOURCE_DIR}/cuda_paths/world_gpu_ids.c)
target_compile_options(sp_world_gpu_ids PRIVATE ${SP_WARN})
target_link_libraries(sp_world_gpu_ids PRIVATE sympool MPI::MPI_C)
add_dependencies(sp_world_gpu_ids sp_cuda_double)
set(sp_visible ${CMAKE_CURRENT_SOURCE_DIR}/cuda_paths/visible.sh)
add_test(NAME cuda_double.world_gpu_ids.np2_one_gpu_each
  COMMAND sh -c "'${MPIEXEC_EXECUTABLE}' ${MPIEXEC_NUMPROC_FLAG} 2 '${sp_visible}' 0 1 -- '$<TARGET_FILE:sp_world_gpu_ids>' apart | grep -c 'apart ok'")
add_test(NAME cuda_double.world_gpu_ids.np2_two_ordinals_one_gpu
  COMMAND sh -c "'${MPIEXEC_EXECUTABLE}' ${MPIEXEC_NUMPROC_FLAG} 2 '${sp_visible}' 0,1 1,0 -- '$<TARGET_FILE:sp_world_gpu_ids>' shared | grep -c 'shared ok'")
set_tests_properties(cuda_double.world_gpu_ids.np2_one_gpu_each
  cuda_double.world_gpu_ids.np2_two_ordinals_one_gpu PROPERTIES LABELS cuda_double
  TIMEOUT 120 PASS_REGULAR_EXPRESSION "(^|\n)2\n"
  ENVIRONMENT "SYMPOOL_DEVICE=cuda;LD_LIBRARY_PATH=${PROJECT_BINARY_DIR}/cuda-double;CUDA_DOUBLE_GPUS=2;CUDA_DOUBLE_NCCL_TIMEOUT=60;OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_btl_vader_single_copy_mechanism=none;OMPI_MCA_mpi_yield_when_idle=1")
