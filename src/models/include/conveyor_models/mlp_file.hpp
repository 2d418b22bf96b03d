// conveyor_models/mlp_file.hpp: a trained MLP's weights in a file, and the input
// normalization it was trained with: what src/models/train_mlp writes and the examples load
// (data/fashion_mlp.bin), for the CPU reference and the cuBLAS model alike.
//
//   namespace cm = conveyor_models;
//   cm::trained_mlp t = cm::load_mlp("data/fashion_mlp.bin");     // checks everything
//   cm::mlp_options o = t.options();           // shape, norm and the weights themselves
//   cm::cpu_mlp model{o};                       // or cm::mlp (CUDA) with the same options
//
// The format, all little-endian:
//   offset 0   8 bytes  magic "CVYMLP\r\n" (the \r\n shows a text-mode transfer)
//          8   u32      version, 1
//         12   u32 x 4  layers, input, hidden, classes (conveyor_models::mlp_shape)
//         28   f32 x 2  normalization mean, stddev (pixels x / 255 -> (x - mean) / stddev)
//         36   f32 ...  per layer l: w[l] (out_features(l) x in_features(l), row-major),
//                       then b[l] (out_features(l))
//        end-4 u32      CRC-32 (zlib's crc32) of every byte before it
// load_mlp checks the magic, the version, the shape, the file's length against it and
// the checksum, and throws mlp_file_error saying which failed.
// Thread-safety: free functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "conveyor_models/reference.hpp"

namespace conveyor_models {

class mlp_file_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr char mlp_file_magic[8] = {'C', 'V', 'Y', 'M', 'L', 'P', '\r', '\n'};
inline constexpr std::uint32_t mlp_file_version = 1;

struct trained_mlp {
  std::shared_ptr<const mlp_weights> weights;
  normalize_params norm;

  const mlp_shape& shape() const noexcept { return weights->shape; }
  // Options for reference_mlp / cpu_mlp / mlp with these weights and this normalization
  // (fp32, one lane, batches up to 256: change what the program needs).
  mlp_options options() const;
};

// The file's bytes for these weights (what save_mlp writes).
std::vector<std::uint8_t> encode_mlp(const mlp_weights& w, normalize_params norm);
// @throws mlp_file_error (what = `what`: a path, or "<memory>") on a bad magic, version,
// shape, length or checksum.
trained_mlp decode_mlp(const std::vector<std::uint8_t>& bytes, const std::string& what);

// @throws mlp_file_error when the file cannot be written.
void save_mlp(const std::string& path, const mlp_weights& w, normalize_params norm);
// @throws mlp_file_error when the file is missing, unreadable or malformed.
trained_mlp load_mlp(const std::string& path);

// Where the examples look for the trained weights by default: data/fashion_mlp.bin in
// the source tree this was built from, or, when that is gone (binaries copied to another
// machine), data/fashion_mlp.bin under the working directory.
std::string default_mlp_path();

// The CRC-32 (zlib's) the file ends with, over any bytes.
std::uint32_t crc32_of(const std::uint8_t* data, std::size_t size) noexcept;

}  // namespace conveyor_models
