// conveyor/pipeline.hpp: everything a program needs to compose and run a pipeline: the
// stages, `|`, the pipeline itself, its options and its report.
//
//   #include <conveyor/pipeline.hpp>
//   conveyor::pipeline p{conveyor::source(next_image)          // prepare
//                        | conveyor::map(decode).workers(3).ordered()
//                        | conveyor::batch(64)
//                        | conveyor::map(classify)             // or a GPU segment
//                        | conveyor::unbatch()
//                        | conveyor::sink(write_label)};       // postprocess
//   conveyor::report r = p.run();                              // blocks until done
//   std::cout << r;                                            // the table and the verdict
//
// The runtime a GPU segment runs on comes from its own header: conveyor/runtime/cuda/
// runtime.hpp (with conveyor::cuda) or conveyor/runtime/host/runtime.hpp (no GPU needed).
// Thread-safety: see conveyor/pipeline/pipeline.hpp.
#pragma once

#include "conveyor/base/error.hpp"
#include "conveyor/base/outcome.hpp"
#include "conveyor/pipeline/options.hpp"
#include "conveyor/pipeline/pipeline.hpp"
#include "conveyor/report/report.hpp"
#include "conveyor/report/verdict.hpp"
#include "conveyor/stage/batch.hpp"
#include "conveyor/stage/chain.hpp"
#include "conveyor/stage/gpu.hpp"
#include "conveyor/stage/map.hpp"
#include "conveyor/stage/sink.hpp"
#include "conveyor/stage/source.hpp"
