# Compiler cache: every build tree of this checkout shares one cache in
# build-ccache/, with paths made relative to the source tree, so two trees
# configured alike (the Release build and the one pip makes for
# torch_pip_install) compile each file once. Off when ccache is absent,
# when ECCL_CCACHE=OFF, or when the caller names its own launcher.
set(ECCL_CCACHE AUTO CACHE STRING "Compile through ccache with a cache in build-ccache/ (AUTO/ON/OFF)")
if(NOT ECCL_CCACHE STREQUAL "OFF" AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(ECCL_CCACHE_PROGRAM ccache)
  if(ECCL_CCACHE_PROGRAM)
    set(ccache_dir "${PROJECT_SOURCE_DIR}/build-ccache")
    if(DEFINED ENV{CCACHE_DIR})  # a user's own cache wins
      set(ccache_dir "$ENV{CCACHE_DIR}")
    endif()
    set(launcher ${CMAKE_COMMAND} -E env CCACHE_DIR=${ccache_dir} CCACHE_BASEDIR=${PROJECT_SOURCE_DIR}
        ${ECCL_CCACHE_PROGRAM})
    foreach(lang C CXX CUDA)
      set(CMAKE_${lang}_COMPILER_LAUNCHER ${launcher})
    endforeach()
  elseif(ECCL_CCACHE STREQUAL "ON")
    message(FATAL_ERROR "eccl: ECCL_CCACHE=ON but ccache was not found")
  endif()
endif()
