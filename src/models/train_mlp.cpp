// train_mlp: trains the example MLP (784 -> 128 -> 128 -> 10, ReLU) on Fashion-MNIST's
// training set and writes its weights, with the input normalization, to
// data/fashion_mlp.bin (conveyor_models/mlp_file.hpp), which the examples and the
// inference benchmark load. Prints the loss and test accuracy after each epoch.
//
//   ./build/src/models/train_mlp [--data DIR] [--out FILE] [--epochs N] [--threads T]
//                                [--hidden H] [--seed S] [--lr LR]
//   defaults: --data /usr/share/datasets/fashion-mnist --out data/fashion_mlp.bin
//             --epochs 8 --threads 2 --hidden 128 --seed 42 --lr 0.05
//
// Deterministic: minibatch SGD with momentum, the samples in an order drawn from the
// seed; each minibatch is split into a fixed number of chunks (chunks_per_batch), each
// chunk's gradient summed in sample order into its own buffer, and the chunks added in
// chunk order, whatever the number of threads that compute them. Built without -march
// or -ffast-math (src/models/CMakeLists.txt), so the same compiler writes the same file
// on every x86-64 machine; its CRC-32 is printed last.
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "conveyor_models/fashion_mnist.hpp"
#include "conveyor_models/mlp_file.hpp"
#include "conveyor_models/reference.hpp"

namespace {

namespace cm = conveyor_models;
using clock_type = std::chrono::steady_clock;

constexpr std::size_t batch_size = 64;
constexpr std::size_t chunks_per_batch = 2;  // fixed: the result does not depend on --threads
constexpr std::size_t chunk_size = batch_size / chunks_per_batch;

struct args {
  std::string data{cm::fashion_mnist_default_dir};
  std::string out = "data/fashion_mlp.bin";
  int epochs = 8;
  std::size_t threads = 2;
  std::size_t hidden = 128;
  std::uint64_t seed = 42;
  float lr = 0.05f;
};

std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// A dot product in eight partial sums, added in a fixed order (the compiler vectorizes
// the inner loop without reordering anything).
float dot(const float* a, const float* b, std::size_t n) noexcept {
  float acc[8] = {};
  std::size_t k = 0;
  for (; k + 8 <= n; k += 8)
    for (std::size_t j = 0; j < 8; ++j) acc[j] += a[k + j] * b[k + j];
  for (; k < n; ++k) acc[0] += a[k] * b[k];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

void axpy(float* y, float a, const float* x, std::size_t n) noexcept {
  for (std::size_t k = 0; k < n; ++k) y[k] += a * x[k];
}

// Parameters (or their gradients, or momenta) of the MLP, layer by layer.
struct params {
  explicit params(const cm::mlp_shape& s) {
    for (std::size_t l = 0; l < s.layers; ++l) {
      w.emplace_back(s.out_features(l) * s.in_features(l), 0.0f);
      b.emplace_back(s.out_features(l), 0.0f);
    }
  }
  void zero() {
    for (auto& v : w) std::fill(v.begin(), v.end(), 0.0f);
    for (auto& v : b) std::fill(v.begin(), v.end(), 0.0f);
  }
  std::vector<std::vector<float>> w, b;
};

// One chunk's forward and backward pass: its gradient (summed over its samples, scaled
// by 1 / batch_size) into g, and its summed loss.
struct chunk_worker {
  chunk_worker(const cm::mlp_shape& s) : shape(s), grad(s) {
    for (std::size_t l = 0; l <= s.layers; ++l)
      act.emplace_back(chunk_size * (l == 0 ? s.input : s.out_features(l - 1)));
    for (std::size_t l = 0; l < s.layers; ++l) delta.emplace_back(chunk_size * s.out_features(l));
  }

  double run(const params& p, const cm::image_set& set, const std::uint32_t* order, std::size_t n,
             cm::normalize_params norm) {
    const cm::mlp_shape& s = shape;
    grad.zero();
    // The input, normalized as the examples' prepare stage does it.
    for (std::size_t i = 0; i < n; ++i)
      cm::normalize_ref(set.image(order[i]), std::span(act[0]).subspan(i * s.input, s.input), norm);
    for (std::size_t l = 0; l < s.layers; ++l) {
      const std::size_t in = s.in_features(l), out = s.out_features(l);
      const bool last = l + 1 == s.layers;
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t o = 0; o < out; ++o) {
          const float z = p.b[l][o] + dot(&act[l][i * in], &p.w[l][o * in], in);
          act[l + 1][i * out + o] = last ? z : std::max(z, 0.0f);
        }
    }
    // Softmax cross-entropy: delta = (softmax - onehot) / batch_size.
    double loss = 0;
    const std::size_t c = s.classes, L = s.layers;
    for (std::size_t i = 0; i < n; ++i) {
      const float* z = &act[L][i * c];
      const float zmax = *std::max_element(z, z + c);
      double sum = 0;
      for (std::size_t k = 0; k < c; ++k) sum += std::exp(static_cast<double>(z[k] - zmax));
      const std::size_t y = set.labels[order[i]];
      loss += std::log(sum) - static_cast<double>(z[y] - zmax);
      for (std::size_t k = 0; k < c; ++k) {
        const double pk = std::exp(static_cast<double>(z[k] - zmax)) / sum;
        delta[L - 1][i * c + k] = static_cast<float>((pk - (k == y ? 1.0 : 0.0)) / batch_size);
      }
    }
    for (std::size_t l = L; l-- > 0;) {
      const std::size_t in = s.in_features(l), out = s.out_features(l);
      float* gw = grad.w[l].data();
      for (std::size_t i = 0; i < n; ++i) {
        const float* d = &delta[l][i * out];
        const float* x = &act[l][i * in];
        for (std::size_t o = 0; o < out; ++o)
          if (d[o] != 0.0f) {
            axpy(gw + o * in, d[o], x, in);
            grad.b[l][o] += d[o];
          }
      }
      if (l == 0) break;
      // delta of the layer below, through its ReLU.
      for (std::size_t i = 0; i < n; ++i) {
        float* dx = &delta[l - 1][i * in];
        std::fill(dx, dx + in, 0.0f);
        const float* d = &delta[l][i * out];
        for (std::size_t o = 0; o < out; ++o)
          if (d[o] != 0.0f) axpy(dx, d[o], &p.w[l][o * in], in);
        const float* h = &act[l][i * in];
        for (std::size_t k = 0; k < in; ++k)
          if (h[k] <= 0.0f) dx[k] = 0.0f;
      }
    }
    return loss;
  }

  cm::mlp_shape shape;
  params grad;
  std::vector<std::vector<float>> act;    // act[0]: input, act[l + 1]: layer l's output
  std::vector<std::vector<float>> delta;  // dLoss / d(layer l's pre-activation)
};

cm::normalize_params dataset_norm(const cm::image_set& train) {
  double sum = 0, sq = 0;
  for (std::uint8_t px : train.pixels) {
    const double x = px / 255.0;
    sum += x;
    sq += x * x;
  }
  const double n = static_cast<double>(train.pixels.size());
  const double mean = sum / n;
  return {.mean = static_cast<float>(mean),
          .stddev = static_cast<float>(std::sqrt(sq / n - mean * mean))};
}

// Test accuracy through the code the examples run: reference_mlp::classify at fp32.
double accuracy(const cm::mlp_weights& w, cm::normalize_params norm, const cm::image_set& test) {
  const cm::reference_mlp ref{w, cm::precision::fp32};
  constexpr std::size_t b = 256;
  std::vector<float> scratch(ref.scratch_floats(b));
  std::vector<std::uint32_t> labels(b);
  std::size_t right = 0;
  for (std::size_t first = 0; first < test.count; first += b) {
    const std::size_t n = std::min(b, test.count - first);
    ref.classify(std::span(test.pixels).subspan(first * 784, n * 784), norm, labels, n, scratch);
    for (std::size_t i = 0; i < n; ++i) right += labels[i] == test.labels[first + i];
  }
  return static_cast<double>(right) / static_cast<double>(test.count);
}

cm::mlp_weights to_weights(const cm::mlp_shape& s, const params& p) { return {s, p.w, p.b}; }

int train(const args& a) {
  const auto t0 = clock_type::now();
  const cm::image_set train = cm::load_fashion_mnist(a.data, cm::split::train);
  const cm::image_set test = cm::load_fashion_mnist(a.data, cm::split::test);
  const cm::mlp_shape shape{.input = 784, .hidden = a.hidden, .layers = 3, .classes = 10};
  const cm::normalize_params norm = dataset_norm(train);
  std::printf("train_mlp: %zu training and %zu test images from %s\n", train.count, test.count,
              a.data.c_str());
  std::printf(
      "model: MLP %zu -> %zu -> %zu -> %zu, ReLU; SGD, momentum 0.9, batch %zu, lr %.3g "
      "(cosine to 0), %d epochs, seed %llu, %zu threads; inputs (x/255 - %.4f) / %.4f\n",
      shape.input, shape.hidden, shape.hidden, shape.classes, batch_size, static_cast<double>(a.lr),
      a.epochs, static_cast<unsigned long long>(a.seed), a.threads, static_cast<double>(norm.mean),
      static_cast<double>(norm.stddev));

  params p{shape}, velocity{shape};
  {
    const cm::mlp_weights init = cm::make_weights(shape, a.seed);  // He-uniform
    p.w = init.w;                                                  // biases start at 0
  }
  std::vector<chunk_worker> workers;
  for (std::size_t c = 0; c < chunks_per_batch; ++c) workers.emplace_back(shape);
  std::vector<double> chunk_loss(chunks_per_batch);

  const std::size_t steps_per_epoch = train.count / batch_size;  // the remainder is left out
  const std::size_t total_steps = steps_per_epoch * static_cast<std::size_t>(a.epochs);
  std::vector<std::uint32_t> order(train.count);
  std::size_t step = 0;
  const std::size_t threads = std::clamp<std::size_t>(a.threads, 1, chunks_per_batch);

  // Thread t computes chunks t, t + threads, ...; a barrier hands each step's batch out
  // and another collects it (std::barrier orders everything before arrive_and_wait()
  // before everything after it, in every thread).
  bool done = false;
  std::barrier start(static_cast<std::ptrdiff_t>(threads)),
      finish(static_cast<std::ptrdiff_t>(threads));
  auto compute_chunks = [&](std::size_t t) {
    for (std::size_t c = t; c < chunks_per_batch; c += threads) {
      const std::uint32_t* ids =
          order.data() + (step % steps_per_epoch) * batch_size + c * chunk_size;
      chunk_loss[c] = workers[c].run(p, train, ids, chunk_size, norm);
    }
  };
  std::vector<std::jthread> helpers;
  for (std::size_t t = 1; t < threads; ++t)
    helpers.emplace_back([&, t] {
      for (;;) {
        start.arrive_and_wait();
        if (done) return;
        compute_chunks(t);
        finish.arrive_and_wait();
      }
    });

  for (int epoch = 0; epoch < a.epochs; ++epoch) {
    for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
    std::uint64_t rng = a.seed * 1000003 + static_cast<std::uint64_t>(epoch);
    for (std::size_t i = order.size() - 1; i > 0; --i)
      std::swap(order[i], order[splitmix64(rng) % (i + 1)]);
    double loss = 0;
    for (std::size_t s = 0; s < steps_per_epoch; ++s, ++step) {
      start.arrive_and_wait();
      compute_chunks(0);
      finish.arrive_and_wait();
      const double progress = static_cast<double>(step) / static_cast<double>(total_steps);
      const float lr =
          static_cast<float>(0.5 * a.lr * (1.0 + std::cos(3.141592653589793 * progress)));
      for (std::size_t l = 0; l < shape.layers; ++l) {
        auto update = [&](std::vector<float>& w, std::vector<float>& v, auto grad_of) {
          for (std::size_t k = 0; k < w.size(); ++k) {
            float g = 0.0f;
            for (std::size_t c = 0; c < chunks_per_batch; ++c) g += grad_of(c)[k];
            v[k] = 0.9f * v[k] + g;
            w[k] -= lr * v[k];
          }
        };
        update(p.w[l], velocity.w[l], [&](std::size_t c) { return workers[c].grad.w[l].data(); });
        update(p.b[l], velocity.b[l], [&](std::size_t c) { return workers[c].grad.b[l].data(); });
      }
      for (double x : chunk_loss) loss += x;
    }
    std::printf("  epoch %d: train loss %.4f, test accuracy %.4f  (%.1f s)\n", epoch + 1,
                loss / static_cast<double>(steps_per_epoch * batch_size),
                accuracy(to_weights(shape, p), norm, test),
                std::chrono::duration<double>(clock_type::now() - t0).count());
    std::fflush(stdout);
  }
  done = true;
  start.arrive_and_wait();  // the helpers see done and return
  helpers.clear();

  const cm::mlp_weights w = to_weights(shape, p);
  const double acc = accuracy(w, norm, test);
  cm::save_mlp(a.out, w, norm);
  const cm::trained_mlp back = cm::load_mlp(a.out);  // what the examples will read
  const std::vector<std::uint8_t> bytes = cm::encode_mlp(*back.weights, back.norm);
  std::printf("test accuracy %.4f; wrote %s (%zu bytes, CRC-32 %08x) in %.1f s\n", acc,
              a.out.c_str(), bytes.size(), cm::crc32_of(bytes.data(), bytes.size() - 4),
              std::chrono::duration<double>(clock_type::now() - t0).count());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string_view k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (v == nullptr || k.substr(0, 2) != "--") {
      std::fprintf(stderr,
                   "usage: train_mlp [--data DIR] [--out FILE] [--epochs N] [--threads T] "
                   "[--hidden H] [--seed S] [--lr LR]\n");
      return 2;
    }
    ++i;
    if (k == "--data")
      a.data = v;
    else if (k == "--out")
      a.out = v;
    else if (k == "--epochs")
      a.epochs = std::atoi(v);
    else if (k == "--threads")
      a.threads = std::strtoull(v, nullptr, 10);
    else if (k == "--hidden")
      a.hidden = std::strtoull(v, nullptr, 10);
    else if (k == "--seed")
      a.seed = std::strtoull(v, nullptr, 10);
    else if (k == "--lr")
      a.lr = std::strtof(v, nullptr);
    else {
      std::fprintf(stderr, "train_mlp: unknown option %s\n", argv[i - 1]);
      return 2;
    }
  }
  try {
    return train(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  }
}
