# INTERFACE target carrying conveyor's own warning flags. Linked PRIVATE by the project's
# tests, examples and benchmarks only; never exported, so consumers keep their flags.
add_library(conveyor_warnings INTERFACE)
set(_cxx_warnings -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Woverloaded-virtual
    -Wimplicit-fallthrough -Wcast-align -Wmissing-declarations)
target_compile_options(conveyor_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:${_cxx_warnings}>
  # nvcc forwards host flags; -Wpedantic trips over nvcc's generated host code.
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wshadow>)
if(CONVEYOR_WERROR)
  target_compile_options(conveyor_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror>)
endif()
