# Applied per target through eccl_sanitize(<target>), never directory-wide.
if(ECCL_SANITIZE STREQUAL "address")
  set(ECCL_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
elseif(ECCL_SANITIZE STREQUAL "thread")
  set(ECCL_SANITIZE_FLAGS -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT ECCL_SANITIZE STREQUAL "")
  message(FATAL_ERROR "ECCL_SANITIZE must be empty, address or thread")
endif()

# Line tables are all a sanitizer report needs (file:line in every frame);
# full debug info of the template-heavy tests at -O2 tripled their compile
# time (reconfigure_test.cc: 33 s against 11 s), and the ASan build was
# 12 of CI's 29 minutes. -O1 is also what the sanitizers' own docs advise.
set(ECCL_SANITIZE_COMPILE_ONLY -O1 -g1)

# A C program that clang links gets no C++ half of the sanitizer runtime,
# which libeccl's C++ checks (UBSan's vptr and function types) need.
set(ECCL_SANITIZE_C_LINK "")
if(ECCL_SANITIZE_FLAGS AND CMAKE_C_COMPILER_ID STREQUAL "Clang")
  set(ECCL_SANITIZE_C_LINK -fsanitize-link-c++-runtime -lstdc++)
endif()

function(eccl_sanitize target)
  if(ECCL_SANITIZE_FLAGS)
    target_compile_options(${target} PRIVATE ${ECCL_SANITIZE_FLAGS} ${ECCL_SANITIZE_COMPILE_ONLY})
    # The lock order (common/mutex.h) is checked where the suites run sanitized.
    target_compile_definitions(${target} PRIVATE ECCL_LOCK_ORDER_CHECKS)
    target_link_options(${target} PRIVATE ${ECCL_SANITIZE_FLAGS})
    foreach(flag ${ECCL_SANITIZE_C_LINK})
      target_link_options(${target} PRIVATE $<$<LINK_LANGUAGE:C>:${flag}>)
    endforeach()
  endif()
endfunction()
