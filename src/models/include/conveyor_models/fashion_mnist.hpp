// conveyor_models/fashion_mnist.hpp: Fashion-MNIST (28x28 grey images of clothes, 10
// classes) read from its gzip-compressed IDX files, as Debian's `dataset-fashion-mnist`
// installs them, through zlib.
//
//   namespace cm = conveyor_models;
//   cm::image_set test = cm::load_fashion_mnist(cm::fashion_mnist_default_dir, cm::split::test);
//   std::span<const std::uint8_t> im = test.image(0);   // 784 pixels, 0 = background
//   std::uint8_t cls = test.labels[0];                    // 0..9, cm::fashion_mnist_classes
//
// IDX (the MNIST format): big-endian u32 magic 0x00000803 (uint8, 3 dimensions) for
// images or 0x00000801 for labels, then one big-endian u32 per dimension, then the
// bytes, row-major. Every malformed case throws data_error with the file's path and
// what is wrong: missing or unreadable, not gzip, a bad magic, a dimension that is 0 or
// absurd, fewer bytes than the header promises, bytes after them, label values >= 10,
// and images and labels of different counts.
// Thread-safety: free functions; an image_set is a plain value.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace conveyor_models {

// A data file that is missing, unreadable or malformed; what() names the file.
class data_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr std::string_view fashion_mnist_default_dir = "/usr/share/datasets/fashion-mnist";

inline constexpr std::array<std::string_view, 10> fashion_mnist_classes = {
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

enum class split { train, test };

// Images (count x rows x cols bytes, row-major) with one label each.
struct image_set {
  std::size_t count = 0, rows = 0, cols = 0;
  std::vector<std::uint8_t> pixels;
  std::vector<std::uint8_t> labels;

  std::size_t pixels_per_image() const noexcept { return rows * cols; }
  std::span<const std::uint8_t> image(std::size_t i) const noexcept {
    return std::span(pixels).subspan(i * pixels_per_image(), pixels_per_image());
  }
};

// The whole content of a gzip file (a plain, uncompressed file is read as it is, as
// zlib's gzread does). @throws data_error when it is missing, unreadable or corrupt.
std::vector<std::uint8_t> read_gzip_file(const std::string& path);

// One IDX file of uint8 images (rows x cols each). @throws data_error.
image_set read_idx_images(const std::string& path);
// One IDX file of uint8 labels, each < classes. @throws data_error.
std::vector<std::uint8_t> read_idx_labels(const std::string& path, std::size_t classes = 10);

// The four file names in a data directory: "<dir>/train-images-idx3-ubyte.gz" etc.
std::string fashion_mnist_path(std::string_view dir, split s, bool labels);

// A split's images and labels from dir (28 x 28 images, 10 classes, counts equal).
// @throws data_error, whose message says how to get the files when one is missing.
image_set load_fashion_mnist(std::string_view dir, split s);

// Writes an IDX file, gzip-compressed (what the tests build their small files with):
// magic 0x0803 + 3 dimensions (count, rows, cols) for images, 0x0801 + count for labels.
// @throws data_error when the file cannot be written.
void write_idx_images_gz(const std::string& path, std::size_t count, std::size_t rows,
                         std::size_t cols, std::span<const std::uint8_t> pixels);
void write_idx_labels_gz(const std::string& path, std::span<const std::uint8_t> labels);
// Any bytes, gzip-compressed (for malformed files). @throws data_error.
void write_gzip_file(const std::string& path, std::span<const std::uint8_t> bytes);

}  // namespace conveyor_models
