# Installs a configured and built conveyor into a fresh prefix (CTest fixture setup in
# tests/packaging.cmake):
#   cmake -DBUILD_DIR=<conveyor build dir> -DPREFIX=<empty or stale dir> -P install_prefix.cmake
# The prefix is removed first, so a file that the install no longer produces cannot
# make a consumer test pass.
foreach(var IN ITEMS BUILD_DIR PREFIX)
  if(NOT ${var})
    message(FATAL_ERROR "install_prefix.cmake: pass -D${var}=...")
  endif()
endforeach()
file(REMOVE_RECURSE "${PREFIX}")
execute_process(COMMAND "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${PREFIX}"
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cmake --install ${BUILD_DIR} --prefix ${PREFIX} failed (${rc})")
endif()
file(GLOB_RECURSE configs "${PREFIX}/*/conveyorConfig.cmake")
if(NOT configs)
  message(FATAL_ERROR "the install put no conveyorConfig.cmake under ${PREFIX}")
endif()
message(STATUS "installed conveyor into ${PREFIX}: ${configs}")
