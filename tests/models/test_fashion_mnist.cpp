// The example model's data and weights files: Fashion-MNIST's IDX reader (zlib) on small
// files this test writes itself, gzip-compressed with zlib, and the trained-weights file
// (mlp_file.hpp): every malformed case gets its own clear error.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>  // getpid: a directory per test process

#include "conveyor/base/error.hpp"
#include "conveyor_models/cpu_mlp.hpp"
#include "conveyor_models/fashion_mnist.hpp"
#include "conveyor_models/mlp_file.hpp"
#include "conveyor_models/reference.hpp"

namespace cm = conveyor_models;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system's temporary one, removed at the end of the test.
struct temp_dir {
  temp_dir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("conveyor_test_fmnist_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  fs::path path;
};

std::vector<std::uint8_t> be32(std::uint32_t v) {
  return {static_cast<std::uint8_t>(v >> 24), static_cast<std::uint8_t>(v >> 16),
          static_cast<std::uint8_t>(v >> 8), static_cast<std::uint8_t>(v)};
}

std::vector<std::uint8_t> cat(std::initializer_list<std::vector<std::uint8_t>> parts) {
  std::vector<std::uint8_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// A Fashion-MNIST-like directory: n images of 28 x 28 (pixel = image index + position),
// labels i % 10.
void write_set(const temp_dir& d, cm::split s, std::size_t n) {
  std::vector<std::uint8_t> px(n * 784), labels(n);
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>(i / 784 + i % 784);
  for (std::size_t i = 0; i < n; ++i) labels[i] = static_cast<std::uint8_t>(i % 10);
  cm::write_idx_images_gz(cm::fashion_mnist_path(d.path.string(), s, false), n, 28, 28, px);
  cm::write_idx_labels_gz(cm::fashion_mnist_path(d.path.string(), s, true), labels);
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const cm::data_error& e) {
    return e.what();
  } catch (const cm::mlp_file_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("fashion_mnist: the four file names are Debian's") {
  CHECK(cm::fashion_mnist_path("/d", cm::split::train, false) == "/d/train-images-idx3-ubyte.gz");
  CHECK(cm::fashion_mnist_path("/d/", cm::split::train, true) == "/d/train-labels-idx1-ubyte.gz");
  CHECK(cm::fashion_mnist_path("/d", cm::split::test, false) == "/d/t10k-images-idx3-ubyte.gz");
  CHECK(cm::fashion_mnist_path("/d", cm::split::test, true) == "/d/t10k-labels-idx1-ubyte.gz");
}

TEST_CASE("fashion_mnist: a written set reads back, pixel for pixel") {
  const temp_dir d;
  const std::size_t n = GENERATE(1, 7, 100);
  CAPTURE(n);
  write_set(d, cm::split::test, n);
  const cm::image_set s = cm::load_fashion_mnist(d.path.string(), cm::split::test);
  REQUIRE(s.count == n);
  CHECK(s.rows == 28);
  CHECK(s.cols == 28);
  REQUIRE(s.pixels.size() == n * 784);
  REQUIRE(s.labels.size() == n);
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(s.labels[i] == i % 10);
    CHECK(s.image(i)[5] == static_cast<std::uint8_t>(i + 5));
  }
}

TEST_CASE("fashion_mnist: a missing file says which, and how to get the data") {
  const temp_dir d;
  const std::string e =
      error_of([&] { cm::load_fashion_mnist(d.path.string(), cm::split::train); });
  CHECK_THAT(e, Catch::Contains("train-images-idx3-ubyte.gz: no such file"));
  CHECK_THAT(e, Catch::Contains("dataset-fashion-mnist"));
  CHECK_THAT(e, Catch::Contains("--data DIR"));
  CHECK_THAT(error_of([&] { cm::read_idx_labels(d / "nothing.gz"); }),
             Catch::Contains("no such file"));
}

TEST_CASE("fashion_mnist: malformed IDX files each get their own error") {
  const temp_dir d;
  const std::string p = d / "bad.gz";
  const std::vector<std::uint8_t> px(2 * 4, 9);
  SECTION("bad magic") {
    cm::write_gzip_file(p, cat({be32(0x00000801), be32(2), be32(2), be32(2), px}));
    CHECK_THAT(error_of([&] { cm::read_idx_images(p); }), Catch::Contains("bad magic 0x00000801"));
  }
  SECTION("a header cut short") {
    cm::write_gzip_file(p, cat({be32(0x00000803), be32(2)}));
    CHECK_THAT(error_of([&] { cm::read_idx_images(p); }), Catch::Contains("truncated"));
  }
  SECTION("fewer pixels than the header promises") {
    cm::write_gzip_file(p, cat({be32(0x00000803), be32(3), be32(2), be32(2), px}));
    CHECK_THAT(error_of([&] { cm::read_idx_images(p); }),
               Catch::Contains("truncated: the header promises 12 bytes of data, the file has 8"));
  }
  SECTION("bytes after the data") {
    cm::write_gzip_file(p, cat({be32(0x00000803), be32(1), be32(2), be32(2), px}));
    CHECK_THAT(error_of([&] { cm::read_idx_images(p); }), Catch::Contains("4 bytes after the 4"));
  }
  SECTION("a zero dimension") {
    cm::write_gzip_file(p, cat({be32(0x00000803), be32(0), be32(2), be32(2)}));
    CHECK_THAT(error_of([&] { cm::read_idx_images(p); }), Catch::Contains("dimension 0 is 0"));
  }
  SECTION("a label out of range") {
    cm::write_gzip_file(p, cat({be32(0x00000801), be32(3), {1, 10, 2}}));
    CHECK_THAT(error_of([&] { cm::read_idx_labels(p); }),
               Catch::Contains("label 1 is 10, not below 10"));
  }
  SECTION("a gzip stream cut short") {
    cm::write_idx_images_gz(p, 1000, 28, 28, std::vector<std::uint8_t>(1000 * 784, 3));
    const auto size = fs::file_size(p);
    fs::resize_file(p, size / 2);
    CHECK_THAT(error_of([&] { cm::read_idx_images(p); }), Catch::Contains("truncated"));
  }
  SECTION("a plain (uncompressed) IDX file is read as it is") {
    const auto bytes = cat({be32(0x00000803), be32(2), be32(2), be32(1), {4, 5, 6, 7}});
    std::ofstream(p, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
    const cm::image_set s = cm::read_idx_images(p);
    CHECK(s.count == 2);
    CHECK(s.pixels == std::vector<std::uint8_t>{4, 5, 6, 7});
  }
}

TEST_CASE("fashion_mnist: images and labels of different counts, or images not 28 x 28") {
  const temp_dir d;
  write_set(d, cm::split::train, 5);
  SECTION("count mismatch") {
    const std::vector<std::uint8_t> four(4, 1);
    cm::write_idx_labels_gz(cm::fashion_mnist_path(d.path.string(), cm::split::train, true), four);
    CHECK_THAT(error_of([&] { cm::load_fashion_mnist(d.path.string(), cm::split::train); }),
               Catch::Contains("4 labels for the 5 images"));
  }
  SECTION("another image size") {
    cm::write_idx_images_gz(cm::fashion_mnist_path(d.path.string(), cm::split::train, false), 5, 32,
                            32, std::vector<std::uint8_t>(5 * 32 * 32));
    CHECK_THAT(error_of([&] { cm::load_fashion_mnist(d.path.string(), cm::split::train); }),
               Catch::Contains("images of 32 x 32 pixels"));
  }
}

TEST_CASE("mlp_file: weights and normalization round-trip, bit for bit") {
  const temp_dir d;
  const cm::mlp_shape shape{
      .input = 12, .hidden = 5, .layers = GENERATE(as<std::size_t>{}, 1, 2, 3), .classes = 3};
  CAPTURE(shape.layers);
  const cm::mlp_weights w = cm::make_weights(shape, 7);
  cm::save_mlp(d / "w.bin", w, {.mean = 0.25f, .stddev = 0.5f});
  const cm::trained_mlp t = cm::load_mlp(d / "w.bin");
  CHECK(t.norm.mean == 0.25f);
  CHECK(t.norm.stddev == 0.5f);
  CHECK(t.shape().layers == shape.layers);
  CHECK(t.weights->w == w.w);
  CHECK(t.weights->b == w.b);
  CHECK(fs::file_size(d / "w.bin") == cm::encode_mlp(w, t.norm).size());
  // A model built from the options computes with exactly these weights.
  const cm::mlp_options o = t.options();
  const cm::reference_mlp a{cm::weights_of(o), cm::precision::fp32}, b{w, cm::precision::fp32};
  const std::vector<float> x(2 * shape.input, 0.5f);
  CHECK(a.forward(x, 2) == b.forward(x, 2));
}

TEST_CASE("mlp_file: bad magic, version, shape, length and checksum are each named") {
  const cm::mlp_weights w =
      cm::make_weights({.input = 4, .hidden = 3, .layers = 2, .classes = 2}, 1);
  const std::vector<std::uint8_t> good = cm::encode_mlp(w, {});
  auto err = [](std::vector<std::uint8_t> b) {
    return error_of([&] { cm::decode_mlp(b, "w.bin"); });
  };
  CHECK_NOTHROW(cm::decode_mlp(good, "w.bin"));
  auto bad = good;
  bad[0] = 'X';
  CHECK_THAT(err(bad), Catch::Contains("w.bin: bad magic"));
  bad = good;
  bad[8] = 2;
  CHECK_THAT(err(bad), Catch::Contains("version 2"));
  bad = good;
  bad[12] = 0;  // layers
  CHECK_THAT(err(bad), Catch::Contains("bad shape"));
  bad = good;
  bad[16] = 5;  // input 4 -> 5: the length no longer fits
  CHECK_THAT(err(bad), Catch::Contains("truncated"));
  bad = good;
  bad.pop_back();
  CHECK_THAT(err(bad), Catch::Contains("truncated"));
  bad = good;
  bad.push_back(0);
  CHECK_THAT(err(bad), Catch::Contains("too long"));
  bad = good;
  bad[40] ^= 1;  // a weight's bit
  CHECK_THAT(err(bad), Catch::Contains("checksum mismatch"));
  CHECK_THAT(err({}), Catch::Contains("truncated"));
  CHECK_THAT(error_of([] { cm::load_mlp("/nonexistent/w.bin"); }), Catch::Contains("cannot open"));
}

TEST_CASE("mlp_file: weights of another shape than the options' are refused") {
  cm::mlp_options o;
  o.shape = {.input = 8, .hidden = 4, .layers = 2, .classes = 2};
  o.weights = std::make_shared<const cm::mlp_weights>(
      cm::make_weights({.input = 8, .hidden = 5, .layers = 2, .classes = 2}, 1));
  CHECK_THROWS_AS(cm::cpu_mlp{o}, conveyor::config_error);
}

TEST_CASE(
    "mlp_file: the shipped weights (data/fashion_mlp.bin) load and have the example's shape") {
  const cm::trained_mlp t = cm::load_mlp(cm::default_mlp_path());
  CHECK(t.shape().input == 784);
  CHECK(t.shape().classes == 10);
  CHECK(t.norm.stddev > 0.0f);
}
