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
