# Compile-fail tests: stage chains that must not build, each with the diagnostics the
# error must contain, plus a positive control that must build and two harness self-tests.
# Each case is an EXCLUDE_FROM_ALL object library compiled with the project's own flags
# (warnings, -Werror, sanitizers), so it is checked in every build configuration; its test
# builds it through `cmake --build` and expect_fail.cmake judges result and output.
# Included from tests/CMakeLists.txt.

set(_conveyor_cf_dir ${CMAKE_CURRENT_LIST_DIR})

function(_conveyor_cf_target name)
  if(NOT TARGET cf_${name})
    add_library(cf_${name} OBJECT EXCLUDE_FROM_ALL ${_conveyor_cf_dir}/${name}.cpp)
    target_link_libraries(cf_${name} PRIVATE conveyor::conveyor conveyor_warnings)
  endif()
endfunction()

# conveyor_compile_case(<test name> <case> fail|compile [MATCHES <regex>...]
#                       [PASS_REGULAR_EXPRESSION <regex>])
# PASS_REGULAR_EXPRESSION turns the test into a self-test of the harness: it passes only
# when the harness prints that verdict (i.e. when the harness rejects the case).
function(conveyor_compile_case test_name case expect)
  cmake_parse_arguments(PARSE_ARGV 3 arg "" "PASS_REGULAR_EXPRESSION" "MATCHES")
  _conveyor_cf_target(${case})
  set(match_args)
  set(i 0)
  foreach(m IN LISTS arg_MATCHES)
    list(APPEND match_args "-DMATCH_${i}=${m}")
    math(EXPR i "${i} + 1")
  endforeach()
  add_test(NAME "compile_fail: ${test_name}"
           COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${CMAKE_BINARY_DIR} -DTARGET=cf_${case}
                   -DCONFIG=$<CONFIG> -DEXPECT=${expect} -DMATCH_COUNT=${i} ${match_args}
                   -P ${_conveyor_cf_dir}/expect_fail.cmake)
  # RESOURCE_LOCK: two builds must not run in one build tree at once (ctest -j).
  set_tests_properties("compile_fail: ${test_name}" PROPERTIES
    TIMEOUT 300 LABELS host RESOURCE_LOCK conveyor_build_tree)
  if(arg_PASS_REGULAR_EXPRESSION)
    set_tests_properties("compile_fail: ${test_name}" PROPERTIES
      PASS_REGULAR_EXPRESSION "${arg_PASS_REGULAR_EXPRESSION}")
  endif()
endfunction()

# g++ prints "[with Out = {anonymous}::image; Next = ...]", clang
# "check_connection<(anonymous namespace)::image, ...>": the case's types live in an
# anonymous namespace, so each pattern allows a qualifier before the type's name.
conveyor_compile_case("map taking tensor after a source of image" image_to_tensor fail
  MATCHES "stage type mismatch"
          "(Out = ([{]anonymous[}]::)?image|check_connection<([(]anonymous namespace[)]::)?image,)"
          "map_stage<int \\(\\*\\)\\(([{]anonymous[}]::|[(]anonymous namespace[)]::)?tensor\\)>")
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  # A lambda's type shows its parameter only in g++'s spelling.
  conveyor_compile_case("lambda taking tensor after a source of image" image_to_tensor_lambda fail
    MATCHES "stage type mismatch" "Out = ([{]anonymous[}]::)?image" "lambda\\(([{]anonymous[}]::)?tensor\\)")
endif()
conveyor_compile_case("sink after a sink" sink_after_sink fail
  MATCHES "nothing can follow a sink")
conveyor_compile_case("map after a sink" map_after_sink fail
  MATCHES "nothing can follow a sink")
conveyor_compile_case("unbatch after a non-vector" unbatch_non_vector fail
  MATCHES "stage type mismatch" "unbatch_stage")
conveyor_compile_case("source returning a non-optional" source_not_optional fail
  MATCHES "must return std::optional<T>")
conveyor_compile_case("service pipeline ending in a sink" service_with_sink fail
  MATCHES "leave the sink out")
conveyor_compile_case("submit(x, done) with a callback that may throw" submit_done_not_noexcept fail
  MATCHES "declare done noexcept")

# Positive control: a correct chain of the same shapes must build under the same flags.
conveyor_compile_case("control: a matching chain compiles" control compile)

# The harness itself: it must reject a case that compiles, and a failure whose output
# lacks the expected diagnostics.
conveyor_compile_case("harness rejects a case that compiles" control fail
  PASS_REGULAR_EXPRESSION "VERDICT expected 'cf_control' not to compile, but it compiled")
conveyor_compile_case("harness rejects a failure for the wrong reason" image_to_tensor fail
  MATCHES "a diagnostic no compiler prints"
  # CMake wraps the message's lines, so the pattern allows a line break anywhere between words.
  PASS_REGULAR_EXPRESSION "VERDICT 'cf_image_to_tensor' failed to compile, but the[ \n]+output lacks")
