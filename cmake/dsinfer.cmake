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

# dsi_test(NAME SOURCES... DEPS ...): one GoogleTest binary, registered with CTest.
# Tests find ../shared and generated models through DSINFER_SOURCE_DIR.
function(dsi_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE ${DSINFER_WARNINGS})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
      DSINFER_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
      DSINFER_BINARY_DIR="${PROJECT_BINARY_DIR}")
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  set_tests_properties(${name} PROPERTIES TIMEOUT ${ARG_TIMEOUT})
  if(ARG_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}")
  endif()
endfunction()
