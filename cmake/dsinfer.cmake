# Shared compile flags and helpers for dsinfer targets.

set(DSINFER_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wno-missing-field-initializers)
if(DSINFER_WERROR)
  list(APPEND DSINFER_WARNINGS -Werror)
endif()
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  list(APPEND DSINFER_WARNINGS -Wthread-safety)
endif()

if(DSINFER_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC's flow analysis reports spurious maybe-uninitialized warnings inside libstdc++
    # (e.g. std::regex, std::function) under the sanitizers at -O1; the release build
    # keeps the warning as an error.
    list(APPEND DSINFER_WARNINGS -Wno-maybe-uninitialized)
  endif()
  add_link_options(-fsanitize=address,undefined)
endif()

# dsi_library(NAME SOURCES... DEPS ...): one static library per module folder.
function(dsi_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  target_compile_options(${name} PRIVATE ${DSINFER_WARNINGS})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
endfunction()

# dsi_test(NAME SOURCES... DEPS ... [ARGS ...]): one GoogleTest binary, registered with
# CTest (ARGS: its command-line arguments there, e.g. a --gtest_filter).
# Tests find vendored data (DSINFER_SOURCE_DIR/tests/data, see its README) and generated
# models through DSINFER_SOURCE_DIR (tests/support/build_paths.h, linked in through
# dsi_gtest_main); nothing outside the repository.
# The binary's main (tests/support/gtest_main.cc) exits with DSI_TEST_SKIP_RETURN_CODE when
# a test skipped (GTEST_SKIP): ctest reports it as skipped, not passed.
set(DSI_TEST_SKIP_RETURN_CODE 77)
function(dsi_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS;ARGS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${DSINFER_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} dsi_gtest_main)
  add_test(NAME ${name} COMMAND ${name} ${ARG_ARGS})
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE ${DSI_TEST_SKIP_RETURN_CODE})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT})
  if(ARG_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
endfunction()
