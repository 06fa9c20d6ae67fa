# Deployment tests (label integration): deploy/slurm's batch scripts on a one-node Slurm
# cluster on loopback and on two nodes emulated on this host (skips without root or
# slurm-wlm/munge), and deploy/k8s validated
# offline (kubectl kustomize + Kubernetes schemas from npm kubernetes-models, fetched by setup.sh),
# and the chaos soak of a 4-worker run under that cluster (slurm_chaos_test.cc, ~3 min).
add_executable(forge_deploy_tests tests/deploy/slurm_job_test.cc tests/deploy/slurm_chaos_test.cc
               tests/deploy/slurm_multinode_test.cc
               tests/deploy/k8s_run_config_test.cc)
target_include_directories(forge_deploy_tests PRIVATE ${CMAKE_SOURCE_DIR}/tests/integration)
target_link_libraries(forge_deploy_tests PRIVATE forge_all GTest::gtest_main)
target_compile_definitions(forge_deploy_tests PRIVATE
  FORGE_SOURCE_DIR="${CMAKE_SOURCE_DIR}" FORGE_BINARY_DIR="${CMAKE_BINARY_DIR}"
  FORGE_MPIEXEC="${MPIEXEC_EXECUTABLE}")
target_compile_options(forge_deploy_tests PRIVATE ${FORGE_WARNINGS})
add_dependencies(forge_deploy_tests forge forge-coordinator forge-worker forgectl)
# Each Slurm test brings up its own cluster on the same ports: one at a time.
gtest_discover_tests(forge_deploy_tests DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60
                     PROPERTIES LABELS integration TIMEOUT 300 RESOURCE_LOCK forge_slurm_cluster)

add_test(NAME K8sManifests.KustomizeBuildsAndValidates
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/deploy/k8s_validate.sh)
set_tests_properties(K8sManifests.KustomizeBuildsAndValidates PROPERTIES
  LABELS integration TIMEOUT 120 SKIP_RETURN_CODE 77)
