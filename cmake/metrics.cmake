# Metrics: the forge_metrics library (prometheus-cpp exporters, NVML GPU health loaded at run
# time) linked by the CLI and the tests. The engine (forge_engine) does not link it.
find_package(prometheus-cpp CONFIG REQUIRED)

file(GLOB FORGE_METRICS_SRC CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/metrics/*.cc)
add_library(forge_metrics STATIC ${FORGE_METRICS_SRC})
target_include_directories(forge_metrics PUBLIC ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(forge_metrics PUBLIC forge_engine prometheus-cpp::core
                      ${CMAKE_DL_LIBS})
target_compile_options(forge_metrics PRIVATE ${FORGE_WARNINGS})
# nvml.h (types only: the library is dlopen'ed) from the CUDA toolkit where it is installed;
# nvml_loader.cc declares the same subset itself where it is not.
find_path(FORGE_NVML_INCLUDE_DIR nvml.h
          HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include
                /usr/local/cuda/targets/x86_64-linux/include)
if(FORGE_NVML_INCLUDE_DIR)
  set_source_files_properties(${CMAKE_SOURCE_DIR}/src/metrics/nvml_loader.cc PROPERTIES
                              INCLUDE_DIRECTORIES ${FORGE_NVML_INCLUDE_DIR})
endif()
message(STATUS "Forge metrics: nvml.h ${FORGE_NVML_INCLUDE_DIR}")

target_link_libraries(forge PRIVATE forge_metrics)
target_link_libraries(forge_unit_tests PRIVATE forge_metrics)
if(TARGET forge_integration_tests)
  target_link_libraries(forge_integration_tests PRIVATE forge_metrics)
endif()

# A stand-in libnvidia-ml (tests/fake_nvml) for the GPU health tests where no driver is
# installed: the unit tests dlopen it by path, never the real library's name.
add_library(forge_fake_nvml SHARED tests/fake_nvml/fake_nvml.cc)
add_dependencies(forge_unit_tests forge_fake_nvml)
target_compile_definitions(forge_unit_tests PRIVATE
                           FORGE_FAKE_NVML="$<TARGET_FILE:forge_fake_nvml>")
if(TARGET forge_integration_tests)
  add_dependencies(forge_integration_tests forge_fake_nvml)
  target_compile_definitions(forge_integration_tests PRIVATE
                             FORGE_FAKE_NVML="$<TARGET_FILE:forge_fake_nvml>")
endif()
