// Fashion-MNIST's IDX files through zlib (see conveyor_models/fashion_mnist.hpp).
#include "conveyor_models/fashion_mnist.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

#include <zlib.h>

namespace conveyor_models {
namespace {

constexpr std::uint32_t idx_images_magic = 0x00000803;          // uint8 (0x08), 3 dimensions
constexpr std::uint32_t idx_labels_magic = 0x00000801;          // uint8, 1 dimension
constexpr std::uint64_t max_elements = std::uint64_t{1} << 32;  // 4 GiB: no real set is larger

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw data_error(path + ": " + what);
}

std::uint32_t be32(const std::uint8_t* p) noexcept {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) |
         std::uint32_t{p[3]};
}

void put_be32(std::vector<std::uint8_t>& out, std::uint64_t v, const std::string& path) {
  if (v > std::numeric_limits<std::uint32_t>::max()) fail(path, "a dimension above 2^32 - 1");
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

struct gz_closer {
  void operator()(gzFile f) const noexcept { gzclose(f); }
};
using gz_ptr = std::unique_ptr<gzFile_s, gz_closer>;

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// The header of an IDX file: checks the magic and that the bytes after it are exactly
// the product of the dimensions; returns the dimensions.
std::vector<std::uint32_t> idx_dims(const std::vector<std::uint8_t>& bytes, std::uint32_t magic,
                                    const char* kind, const std::string& path) {
  if (bytes.size() < 4)
    fail(path, "truncated: " + std::to_string(bytes.size()) + " bytes, no IDX header");
  const std::uint32_t got = be32(bytes.data());
  if (got != magic)
    fail(path, std::string("bad magic ") + hex(got) + ", expected " + hex(magic) + " (IDX " + kind +
                   "); is this the right file?");
  const std::size_t n_dims = magic & 0xffu;
  const std::size_t header = 4 + 4 * n_dims;
  if (bytes.size() < header)
    fail(path, "truncated: " + std::to_string(bytes.size()) + " bytes, the IDX header needs " +
                   std::to_string(header));
  std::vector<std::uint32_t> dims;
  std::uint64_t elements = 1;
  for (std::size_t d = 0; d < n_dims; ++d) {
    dims.push_back(be32(bytes.data() + 4 + 4 * d));
    if (dims.back() == 0) fail(path, "dimension " + std::to_string(d) + " is 0");
    elements *= dims.back();
    if (elements > max_elements) fail(path, "dimensions multiply past 2^32 elements");
  }
  const std::uint64_t have = bytes.size() - header;
  if (have < elements)
    fail(path, "truncated: the header promises " + std::to_string(elements) +
                   " bytes of data, the file has " + std::to_string(have));
  if (have > elements)
    fail(path, std::to_string(have - elements) + " bytes after the " + std::to_string(elements) +
                   " the header promises");
  return dims;
}

void write_all(const std::string& path, std::span<const std::uint8_t> bytes) {
  const gz_ptr f{gzopen(path.c_str(), "wb9")};
  if (!f) fail(path, std::string("cannot open for writing: ") + std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const unsigned chunk =
        static_cast<unsigned>(std::min<std::size_t>(bytes.size() - done, 1u << 20));
    if (gzwrite(f.get(), bytes.data() + done, chunk) != static_cast<int>(chunk))
      fail(path, "write failed");
    done += chunk;
  }
}

}  // namespace

std::vector<std::uint8_t> read_gzip_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path, "no such file");
  const gz_ptr f{gzopen(path.c_str(), "rb")};
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  gzbuffer(f.get(), 1u << 17);
  std::vector<std::uint8_t> out;
  std::uint8_t buf[1 << 16];
  for (;;) {
    const int n = gzread(f.get(), buf, sizeof buf);
    if (n < 0) {
      int code = 0;
      const char* msg = gzerror(f.get(), &code);
      fail(path,
           std::string("not a readable gzip file (zlib: ") + (msg != nullptr ? msg : "?") + ")");
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
    if (out.size() > max_elements) fail(path, "more than 4 GiB uncompressed");
  }
  // gzread stops without an error at a stream cut short; gzerror then says so.
  int code = Z_OK;
  const char* msg = gzerror(f.get(), &code);
  if (code != Z_OK && code != Z_STREAM_END)
    fail(path, std::string("corrupt or truncated gzip data (zlib: ") +
                   (msg != nullptr ? msg : "?") + ")");
  return out;
}

image_set read_idx_images(const std::string& path) {
  const std::vector<std::uint8_t> bytes = read_gzip_file(path);
  const std::vector<std::uint32_t> dims = idx_dims(bytes, idx_images_magic, "images", path);
  image_set s;
  s.count = dims[0];
  s.rows = dims[1];
  s.cols = dims[2];
  s.pixels.assign(bytes.begin() + 16, bytes.end());
  return s;
}

std::vector<std::uint8_t> read_idx_labels(const std::string& path, std::size_t classes) {
  const std::vector<std::uint8_t> bytes = read_gzip_file(path);
  idx_dims(bytes, idx_labels_magic, "labels", path);
  std::vector<std::uint8_t> labels(bytes.begin() + 8, bytes.end());
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= classes)
      fail(path, "label " + std::to_string(i) + " is " + std::to_string(labels[i]) +
                     ", not below " + std::to_string(classes));
  return labels;
}

std::string fashion_mnist_path(std::string_view dir, split s, bool labels) {
  std::string p{dir};
  if (!p.empty() && p.back() != '/') p += '/';
  p += s == split::train ? "train" : "t10k";
  p += labels ? "-labels-idx1-ubyte.gz" : "-images-idx3-ubyte.gz";
  return p;
}

image_set load_fashion_mnist(std::string_view dir, split s) {
  const std::string images = fashion_mnist_path(dir, s, false),
                    labels = fashion_mnist_path(dir, s, true);
  for (const std::string& p : {images, labels}) {
    std::error_code ec;
    if (!std::filesystem::exists(p, ec))
      throw data_error(p +
                       ": no such file. Fashion-MNIST is Debian's package dataset-fashion-mnist "
                       "(apt-get install dataset-fashion-mnist, or bash scripts/deps.sh); where "
                       "it cannot be installed, copy its four .gz files into a directory and "
                       "pass it with --data DIR");
  }
  image_set set = read_idx_images(images);
  if (set.rows != 28 || set.cols != 28)
    fail(images, "images of " + std::to_string(set.rows) + " x " + std::to_string(set.cols) +
                     " pixels; Fashion-MNIST's are 28 x 28");
  set.labels = read_idx_labels(labels, fashion_mnist_classes.size());
  if (set.labels.size() != set.count)
    fail(labels, std::to_string(set.labels.size()) + " labels for the " +
                     std::to_string(set.count) + " images of " + images);
  return set;
}

void write_gzip_file(const std::string& path, std::span<const std::uint8_t> bytes) {
  write_all(path, bytes);
}

void write_idx_images_gz(const std::string& path, std::size_t count, std::size_t rows,
                         std::size_t cols, std::span<const std::uint8_t> pixels) {
  std::vector<std::uint8_t> out;
  put_be32(out, idx_images_magic, path);
  put_be32(out, count, path);
  put_be32(out, rows, path);
  put_be32(out, cols, path);
  out.insert(out.end(), pixels.begin(), pixels.end());
  write_all(path, out);
}

void write_idx_labels_gz(const std::string& path, std::span<const std::uint8_t> labels) {
  std::vector<std::uint8_t> out;
  put_be32(out, idx_labels_magic, path);
  put_be32(out, labels.size(), path);
  out.insert(out.end(), labels.begin(), labels.end());
  write_all(path, out);
}

}  // namespace conveyor_models
