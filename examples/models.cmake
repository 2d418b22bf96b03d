# The examples built on the example model (src/models/): the CPU reference model everywhere,
# the cuBLAS one too when CUDA is built (they pick the runtime when they start).
foreach(name IN ITEMS mlp_inference online_serving)
  conveyor_example(${name} ${name}.cpp)
  target_link_libraries(${name} PRIVATE conveyor_models_ref)
  if(TARGET conveyor_models)
    target_link_libraries(${name} PRIVATE conveyor_models)  # brings conveyor::cuda
  endif()
endforeach()
# mlp_inference as a CTest test (examples/CMakeLists.txt adds it with these arguments):
# one pass over Fashion-MNIST's test set per path and run, two runs; it checks the labels
# against the serial loop's and the accuracy, never a time. Needs the data set installed
# (scripts/deps.sh installs dataset-fashion-mnist).
set(_example_args_mlp_inference --runs 2 --seconds 0)
