// A trained MLP's weights file (see conveyor_models/mlp_file.hpp).
#include "conveyor_models/mlp_file.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include <zlib.h>

namespace conveyor_models {
namespace {

constexpr std::size_t header_bytes = 36;
constexpr std::size_t max_dim = std::size_t{1} << 20;

[[noreturn]] void fail(const std::string& what, const std::string& why) {
  throw mlp_file_error(what + ": " + why);
}

void put_u32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}
void put_f32(std::vector<std::uint8_t>& out, float v) {
  put_u32(out, std::bit_cast<std::uint32_t>(v));
}

std::uint32_t get_u32(const std::uint8_t* p) noexcept {
  return std::uint32_t{p[0]} | (std::uint32_t{p[1]} << 8) | (std::uint32_t{p[2]} << 16) |
         (std::uint32_t{p[3]} << 24);
}
float get_f32(const std::uint8_t* p) noexcept { return std::bit_cast<float>(get_u32(p)); }

// Floats the weights of `s` take in the file.
std::uint64_t floats_of(const mlp_shape& s) {
  std::uint64_t n = 0;
  for (std::size_t l = 0; l < s.layers; ++l)
    n += std::uint64_t{s.out_features(l)} * (s.in_features(l) + 1);
  return n;
}

}  // namespace

std::string default_mlp_path() {
#ifdef CONVEYOR_MODELS_MLP_FILE
  std::error_code ec;
  if (std::filesystem::exists(CONVEYOR_MODELS_MLP_FILE, ec)) return CONVEYOR_MODELS_MLP_FILE;
#endif
  return "data/fashion_mlp.bin";
}

std::uint32_t crc32_of(const std::uint8_t* data, std::size_t size) noexcept {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(size, 1u << 30));
    crc = crc32(crc, data, chunk);
    data += chunk;
    size -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

mlp_options trained_mlp::options() const {
  mlp_options o;
  o.shape = weights->shape;
  o.norm = norm;
  o.weights = weights;
  return o;
}

std::vector<std::uint8_t> encode_mlp(const mlp_weights& w, normalize_params norm) {
  validate(w.shape);
  const mlp_shape& s = w.shape;
  if (w.w.size() != s.layers || w.b.size() != s.layers)
    throw mlp_file_error("encode_mlp: the weights need one matrix and one bias per layer");
  std::vector<std::uint8_t> out(std::begin(mlp_file_magic), std::end(mlp_file_magic));
  put_u32(out, mlp_file_version);
  for (std::size_t v : {s.layers, s.input, s.hidden, s.classes})
    put_u32(out, static_cast<std::uint32_t>(v));
  put_f32(out, norm.mean);
  put_f32(out, norm.stddev);
  for (std::size_t l = 0; l < s.layers; ++l) {
    if (w.w[l].size() != s.out_features(l) * s.in_features(l) || w.b[l].size() != s.out_features(l))
      throw mlp_file_error("encode_mlp: layer " + std::to_string(l) +
                           "'s weights do not match the shape");
    for (float x : w.w[l]) put_f32(out, x);
    for (float x : w.b[l]) put_f32(out, x);
  }
  put_u32(out, crc32_of(out.data(), out.size()));
  return out;
}

trained_mlp decode_mlp(const std::vector<std::uint8_t>& bytes, const std::string& what) {
  if (bytes.size() < header_bytes + 4)
    fail(what, "truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the header");
  if (std::memcmp(bytes.data(), mlp_file_magic, sizeof mlp_file_magic) != 0)
    fail(what, "bad magic: not a conveyor MLP weights file (src/models/train_mlp writes them)");
  const std::uint32_t version = get_u32(bytes.data() + 8);
  if (version != mlp_file_version)
    fail(what, "version " + std::to_string(version) + ", this program reads version " +
                   std::to_string(mlp_file_version));
  mlp_shape s{.input = get_u32(bytes.data() + 16),
              .hidden = get_u32(bytes.data() + 20),
              .layers = get_u32(bytes.data() + 12),
              .classes = get_u32(bytes.data() + 24)};
  if (s.layers < 1 || s.layers > 64 || s.input < 1 || s.input > max_dim || s.classes < 1 ||
      s.classes > max_dim || (s.layers > 1 && (s.hidden < 1 || s.hidden > max_dim)))
    fail(what, "bad shape: " + std::to_string(s.layers) + " layers, " + std::to_string(s.input) +
                   " -> " + std::to_string(s.hidden) + " -> " + std::to_string(s.classes));
  const std::uint64_t need = header_bytes + 4 * floats_of(s) + 4;
  if (bytes.size() != need)
    fail(what, std::string(bytes.size() < need ? "truncated: " : "too long: ") +
                   std::to_string(bytes.size()) + " bytes, the shape in its header needs " +
                   std::to_string(need));
  const std::uint32_t stored = get_u32(bytes.data() + bytes.size() - 4);
  const std::uint32_t computed = crc32_of(bytes.data(), bytes.size() - 4);
  if (stored != computed) fail(what, "checksum mismatch: the file is corrupt");
  const normalize_params norm{.mean = get_f32(bytes.data() + 28),
                              .stddev = get_f32(bytes.data() + 32)};
  if (!(norm.stddev > 0.0f)) fail(what, "normalization stddev is not > 0");
  auto w = std::make_shared<mlp_weights>();
  w->shape = s;
  const std::uint8_t* p = bytes.data() + header_bytes;
  for (std::size_t l = 0; l < s.layers; ++l) {
    std::vector<float> m(s.out_features(l) * s.in_features(l)), b(s.out_features(l));
    for (float& x : m) x = get_f32(p), p += 4;
    for (float& x : b) x = get_f32(p), p += 4;
    w->w.push_back(std::move(m));
    w->b.push_back(std::move(b));
  }
  return {std::move(w), norm};
}

void save_mlp(const std::string& path, const mlp_weights& w, normalize_params norm) {
  const std::vector<std::uint8_t> bytes = encode_mlp(w, norm);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail(path, std::string("cannot open for writing: ") + std::strerror(errno));
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f.flush()) fail(path, "write failed");
}

trained_mlp load_mlp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f)
    fail(path,
         std::string("cannot open: ") + std::strerror(errno) +
             " (the weights are data/fashion_mlp.bin in the source tree; pass --weights FILE)");
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(f)),
                                  std::istreambuf_iterator<char>());
  if (f.bad()) fail(path, "read failed");
  return decode_mlp(bytes, path);
}

}  // namespace conveyor_models
