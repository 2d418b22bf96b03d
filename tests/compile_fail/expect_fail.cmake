# Builds one target of an already configured build tree and judges the outcome.
#
#   cmake -DBUILD_DIR=<dir> -DTARGET=<target> [-DCONFIG=<cfg>] -DEXPECT=fail|compile
#         -DMATCH_COUNT=<n> -DMATCH_0=<regex> ... -P expect_fail.cmake
#
# EXPECT=fail: the build must fail AND its output must match every MATCH_i (so a case
# that fails for the wrong reason, e.g. a typo, does not pass). EXPECT=compile: the build
# must succeed (a positive control proving the harness can tell success from failure).
# Exits non-zero with a "compile_fail: VERDICT ..." line when the expectation is not met.
cmake_minimum_required(VERSION 3.25)

foreach(var BUILD_DIR TARGET EXPECT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "compile_fail: usage error: -D${var}=... is required")
  endif()
endforeach()
if(NOT EXPECT MATCHES "^(fail|compile)$")
  message(FATAL_ERROR "compile_fail: usage error: EXPECT must be fail or compile, got '${EXPECT}'")
endif()
if(NOT DEFINED MATCH_COUNT)
  set(MATCH_COUNT 0)
endif()

set(config_args)
if(CONFIG)
  set(config_args --config ${CONFIG})
endif()
execute_process(
  COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET} ${config_args}
  RESULT_VARIABLE result
  OUTPUT_VARIABLE output
  ERROR_VARIABLE output)

if(EXPECT STREQUAL "compile")
  if(NOT result EQUAL 0)
    message("${output}")
    message(FATAL_ERROR "compile_fail: VERDICT expected '${TARGET}' to compile, but the build failed (${result})")
  endif()
  message("compile_fail: OK '${TARGET}' compiled, as expected")
  return()
endif()

if(result EQUAL 0)
  message("${output}")
  message(FATAL_ERROR "compile_fail: VERDICT expected '${TARGET}' not to compile, but it compiled")
endif()
set(missing)
if(MATCH_COUNT GREATER 0)
  math(EXPR last "${MATCH_COUNT} - 1")
  foreach(i RANGE ${last})
    if(NOT output MATCHES "${MATCH_${i}}")
      list(APPEND missing "${MATCH_${i}}")
    endif()
  endforeach()
endif()
if(missing)
  message("${output}")
  list(JOIN missing "\n  " missing_text)
  message(FATAL_ERROR "compile_fail: VERDICT '${TARGET}' failed to compile, but the output lacks:\n  ${missing_text}")
endif()
message("compile_fail: OK '${TARGET}' failed to compile with the expected diagnostics")
