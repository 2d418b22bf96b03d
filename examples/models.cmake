# The examples built on the example model (src/models/): the CPU reference model everywhere,
# the cuBLAS one too when CUDA is built (they pick the runtime when they start).
foreach(name IN ITEMS mlp_inference online_serving)
  conveyor_example(${name} ${name}.cpp)
  target_link_libraries(${name} PRIVATE conveyor_models_ref)
  if(TARGET conveyor_models)
    target_link_libraries(${name} PRIVATE conveyor_models)  # brings conveyor::cuda
  endif()
endforeach()
