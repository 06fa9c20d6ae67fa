# One static library per component of src/ (a folder; worker/ and kernels/ by sub-folder),
# named forge_<folder> (forge_worker_model for src/worker/model). The layering is
# scripts/check_layering.py's LAYERS (lowest first; docs/ARCHITECTURE.md, "Layers"), read from
# there so that the order is written once. The build holds every component to it:
#  - a component may link only components below it: forge_component refuses any other at
#    configure time;
#  - a component's headers are visible only to code that links it: each library's include
#    directory is a tree of its own (build/include/forge_worker_model/worker/model, a link to
#    src/worker/model), published to what links it and to nothing else. An include of a
#    component not linked, so of one above, fails to compile ("No such file or directory");
#  - a call into a component not linked fails to link (static libraries, no link groups).

file(STRINGS ${CMAKE_SOURCE_DIR}/scripts/check_layering.py FORGE_LAYER_LINES
     REGEX "^    \"[a-z/]+\",")
set(FORGE_LAYERS "")
foreach(line ${FORGE_LAYER_LINES})
  string(REGEX REPLACE "^    \"([a-z/]+)\",.*" "\\1" name "${line}")
  list(APPEND FORGE_LAYERS ${name})
endforeach()
list(LENGTH FORGE_LAYERS FORGE_LAYER_COUNT)
if(FORGE_LAYER_COUNT LESS 2)
  message(FATAL_ERROR "could not read LAYERS from scripts/check_layering.py")
endif()

# forge_<folder> for src/<folder>.
function(forge_component_target dir out)
  string(REPLACE "/" "_" name "${dir}")
  set(${out} forge_${name} PARENT_SCOPE)
endfunction()

# The rank of a component library in LAYERS, or -1 for anything else (a third-party target).
function(forge_component_rank target out)
  set(rank -1)
  set(i 0)
  foreach(dir ${FORGE_LAYERS})
    forge_component_target(${dir} t)
    if(t STREQUAL target)
      set(rank ${i})
    endif()
    math(EXPR i "${i} + 1")
  endforeach()
  set(${out} ${rank} PARENT_SCOPE)
endfunction()

# Refuses (at configure time) a link from src/DIR to anything but components below it.
function(forge_check_links dir what)
  forge_component_target(${dir} target)
  forge_component_rank(${target} rank)
  if(rank LESS 0)
    message(FATAL_ERROR "src/${dir} is not in scripts/check_layering.py's LAYERS")
  endif()
  foreach(dep ${ARGN})
    forge_component_rank(${dep} dep_rank)
    if(dep_rank GREATER_EQUAL rank)
      message(FATAL_ERROR "${what} may not link ${dep}: src/${dir} does not sit above it in "
                          "scripts/check_layering.py's LAYERS")
    endif()
  endforeach()
endfunction()

# forge_component(DIR [EXCLUDE REGEX] [CUDA_ONLY files...] [PUBLIC deps...] [PRIVATE deps...]
#                 [CXX_OPTIONS opts...] [CUDA_OPTIONS opts...])
# The library of src/DIR: its *.cc (and *.cu in CUDA builds) but those matching EXCLUDE (the
# programs' mains). CUDA_ONLY names .cc files of src/DIR built only in CUDA builds: host code
# over the CUDA runtime and libraries and our kernels' launchers, which the C++ compiler builds
# (a .cu is only for device code, which needs nvcc). PUBLIC: what its headers include; PRIVATE:
# what only its sources do.
function(forge_component dir)
  cmake_parse_arguments(C "" "EXCLUDE" "CUDA_ONLY;PUBLIC;PRIVATE;CXX_OPTIONS;CUDA_OPTIONS"
                        ${ARGN})
  forge_component_target(${dir} target)
  forge_check_links(${dir} ${target} ${C_PUBLIC} ${C_PRIVATE})

  set(globs ${CMAKE_SOURCE_DIR}/src/${dir}/*.cc)
  if(FORGE_HAVE_CUDA)
    list(APPEND globs ${CMAKE_SOURCE_DIR}/src/${dir}/*.cu)
  endif()
  file(GLOB sources CONFIGURE_DEPENDS ${globs})
  if(C_EXCLUDE)
    list(FILTER sources EXCLUDE REGEX "${C_EXCLUDE}")
  endif()
  foreach(file ${C_CUDA_ONLY})
    if(NOT file MATCHES "\\.cc$" OR NOT EXISTS ${CMAKE_SOURCE_DIR}/src/${dir}/${file})
      message(FATAL_ERROR "${target}: CUDA_ONLY names ${file}, not a .cc file of src/${dir}")
    endif()
    if(NOT FORGE_HAVE_CUDA)
      list(REMOVE_ITEM sources ${CMAKE_SOURCE_DIR}/src/${dir}/${file})
    endif()
  endforeach()
  add_library(${target} STATIC ${sources})

  # The include tree: build/include/<target>/<dir> links to src/<dir>.
  set(root ${CMAKE_BINARY_DIR}/include/${target})
  get_filename_component(parent ${root}/${dir} DIRECTORY)
  file(MAKE_DIRECTORY ${parent})
  if(NOT IS_SYMLINK ${root}/${dir})
    file(CREATE_LINK ${CMAKE_SOURCE_DIR}/src/${dir} ${root}/${dir} SYMBOLIC)
  endif()
  target_include_directories(${target} PUBLIC ${root})

  target_link_libraries(${target} PUBLIC ${C_PUBLIC} PRIVATE ${C_PRIVATE})
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:CXX>:${FORGE_WARNINGS};${C_CXX_OPTIONS}>"
    "$<$<COMPILE_LANGUAGE:CUDA>:${C_CUDA_OPTIONS}>")
endfunction()

# forge_program(NAME SOURCE COMPONENT DIR LINK deps...): the program whose main, SOURCE, lives
# in src/DIR, linking DIR's library and `deps`, which must sit below DIR as that library's do.
function(forge_program name source)
  cmake_parse_arguments(P "" "COMPONENT" "LINK" ${ARGN})
  forge_component_target(${P_COMPONENT} own)
  forge_check_links(${P_COMPONENT} ${name} ${P_LINK})
  add_executable(${name} ${source})
  target_link_libraries(${name} PRIVATE ${own} ${P_LINK})
  target_compile_options(${name} PRIVATE ${FORGE_WARNINGS})
endfunction()
