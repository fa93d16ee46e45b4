// SPDX-License-Identifier: Apache-2.0
// Fashion-MNIST, data-parallel with mirror: an MLP 784-256-128-10 (ReLU, softmax cross-entropy,
// SGD with momentum 0.9 and a cosine learning-rate schedule) trained on R CPU replicas.
//
//   fashion_mnist [--epochs 10] [--replicas 2] [--batch-size 256] [--lr 0.1] [--momentum 0.9] [--seed 1]
//                 [--policy default|reduction_to_one_device|hierarchical_copy]
//                 [--data /usr/share/datasets/fashion-mnist] [--limit N] [--device threads|cuda|auto|cluster]
//
// --device cuda (CUDA builds) trains on GPUs (train_and_test_on_gpus below, gpu_model.cu): each
// replica's parameters, momentum, activations and gradients live in its GPU's memory, the
// products go through cuBLAS and the element-wise parts through small kernels, all on the
// replica's stream, and the gradient all-reduce is ctx.all_reduce of one device_span through the
// ops policy (NcclAllReduce by default; ReductionToOneDevice when replicas share a GPU). --device
// auto picks cuda when a GPU is visible and threads otherwise (mirror::cuda::device_count), like
// TF's CPU fallback.
//
// Multi-worker (MPI builds): `mpirun -np W --bind-to none fashion_mnist --device cluster
// --replicas R` trains on W processes x R replicas (devices::Cluster<Threads>); every worker
// reads and shuffles the same data and takes its part of each global batch. With W x R = N it
// learns exactly what one process with --replicas N does (tests/examples/run_fashion_mnist_cluster.py).
//
// The mirror parts, in the order a step uses them:
//  - the parameters and the momentum buffers are ONE MirroredVariable<State> (a Hana struct of
//    std::vector<float>), so every replica holds an equal copy;
//  - distribute_dataset splits each global batch (a Hana struct of a matrix_view of images and a
//    span of labels, views into the shuffled training set) into per-replica row ranges, no copy;
//  - in run, each replica computes the gradient of its rows into its own buffers, ONE fused
//    in-place all-reduce (ReduceOp::sum over a struct of std::span<float>) sums them, and
//    update(apply_momentum, synced_grads) applies the same step to every copy;
//  - the replicas return their rows' losses; reduce(mean, ..., axis0) gives the batch's mean.
// Prints one line per epoch and, last, exactly "test_accuracy=0.xxxx".

#include <unistd.h>
#if FASHION_MNIST_BLAS
#include <dlfcn.h>
#endif

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <mirror/mirror.hpp>
#include <functional>
#if MIRROR_HAS_MPI
#include <csignal>
#include <mirror/backends/mpi/elastic.hpp>  // --elastic
#endif
#include "dataset.hpp"
#include "gunzip.hpp"
#include "idx.hpp"
#include "model.hpp"
#if FASHION_MNIST_GPU
#include "gpu_model.hpp"
#endif

namespace fm = fashion_mnist;

// --device cluster (MPI builds). The GPU kit's copy of this program is built without it: it runs
// on a GPU machine that has no MPI (tools/gpu_kit/meson.build).
#ifndef FASHION_MNIST_CLUSTER
#define FASHION_MNIST_CLUSTER MIRROR_HAS_MPI
#endif

namespace {

struct Options {
  int epochs = 10;
  int replicas = 2;
  std::size_t batch_size = 256;
  float lr = 0.1f;
  float momentum = 0.9f;
  std::uint64_t seed = 1;
  std::string policy = "default";
  std::string optimizer = "sharded";
  std::string data = "/usr/share/datasets/fashion-mnist";
  std::size_t limit = 0;  // 0: the whole training set
  std::string device = "threads";
  std::string timeline;  // --timeline FILE: the strategy's timeline (docs/debugging.md)
  double overlap_mib = -1;  // --overlap MIB: bucketed reduction during backward (< 0: off)
  bool elastic = false;      // --elastic: go on after a worker dies (cluster, replicated optimiser)
  std::size_t commit_every = 10;  // --commit-every N: steps between the elastic loop's commits
  long long kill_at_step = -1;    // --kill-at-step K: the last worker dies at step K (a demonstration)
};

constexpr const char* usage_text =
    "usage: fashion_mnist [options]\n"
    "  --epochs N        passes over the training set (default 10)\n"
    "  --replicas N      CPU replicas, one thread each (default 2)\n"
    "  --batch-size N    global batch size, split over the replicas (default 256)\n"
    "  --lr X            initial learning rate, cosine-decayed to 0 over the run (default 0.1)\n"
    "  --momentum X      SGD momentum (default 0.9; 0: plain SGD)\n"
    "  --seed N          initial weights and shuffling (default 1)\n"
    "  --policy P        all-reduce algorithm: default, reduction_to_one_device, hierarchical_copy\n"
    "  --optimizer O     sharded (default): each replica steps 1/N of the model and keeps 1/N of the\n"
    "                    momentum (reduce_scatter + all_gather, MirroredVariable::handle::update_sharded)\n"
    "                    (CPU devices); replicated: every replica steps the whole model after an\n"
    "                    all-reduce (the only one on cuda)\n"
    "  --data DIR        folder of the IDX files (default /usr/share/datasets/fashion-mnist,\n"
    "                    from Debian's dataset-fashion-mnist package)\n"
    "  --limit N         train on the first N training images only (default: all)\n"
    "  --device D        threads (default); cuda: the model on GPUs, cuBLAS and CUDA kernels (CUDA builds;\n"
    "                    R replicas over the largest number of visible GPUs that divides R, the rest as\n"
    "                    logical devices sharing them; policy default is NcclAllReduce with one replica\n"
    "                    per GPU, ReductionToOneDevice when replicas share a GPU);\n"
    "                    auto: cuda when a GPU is visible, else threads; cluster: one worker of\n"
    "                    devices::Cluster<Threads>, launched with mpirun -np W (MPI builds; --replicas\n"
    "                    is per worker, policy default)\n"
    "  --overlap MIB     reduce the gradients in buckets of MIB MiB (0: one per buffer) that start\n"
    "                    during the backward pass, layer by layer (ctx.gradient_buckets: all-reduced\n"
    "                    for --optimizer replicated, reduce-scattered for sharded; on cuda the buckets\n"
    "                    are runs of the one gradient array, each all-reduced in place on the\n"
    "                    replica's communication stream)\n"
    "  --timeline FILE   write a timeline of the training to FILE, a Chrome trace that Perfetto and\n"
    "                    chrome://tracing open (each worker of a cluster: FILE.worker<w>.json)\n"
    "  --elastic 1       with --device cluster and --optimizer replicated, under an MPI with its\n"
    "                    fault-tolerance extension (mpirun --with-ft ulfm): when a worker dies the others\n"
    "                    go on from the last commit (mirror::elastic), the global batches re-split over\n"
    "                    the survivors\n"
    "  --commit-every N  --elastic: commit the model every N steps (default 10)\n"
    "  --kill-at-step K  --elastic: the last worker kills itself (SIGKILL) at step K, to show it\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "fashion_mnist: %s\n%s", msg.c_str(), usage_text);
  std::exit(2);
}

std::uint64_t parse_number(std::string_view flag, const char* text, std::uint64_t min) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-' || v < min) {
    usage_error(std::string(flag) + " needs an integer >= " + std::to_string(min) + ", got '" + text + "'");
  }
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error("missing value after " + std::string(a));
    const char* v = argv[++i];
    if (a == "--epochs") {
      o.epochs = static_cast<int>(parse_number(a, v, 0));
    } else if (a == "--replicas") {
      o.replicas = static_cast<int>(parse_number(a, v, 1));
    } else if (a == "--batch-size") {
      o.batch_size = parse_number(a, v, 1);
    } else if (a == "--seed") {
      o.seed = parse_number(a, v, 0);
    } else if (a == "--limit") {
      o.limit = parse_number(a, v, 0);
    } else if (a == "--momentum") {
      char* end = nullptr;
      o.momentum = std::strtof(v, &end);
      if (end == v || *end != '\0' || !(o.momentum >= 0.0f && o.momentum < 1.0f)) {
        usage_error("--momentum needs a number in [0, 1), got '" + std::string(v) + "'");
      }
    } else if (a == "--lr") {
      char* end = nullptr;
      o.lr = std::strtof(v, &end);
      if (end == v || *end != '\0' || !(o.lr > 0.0f)) usage_error("--lr needs a positive number, got '" + std::string(v) + "'");
    } else if (a == "--policy") {
      o.policy = v;
      if (o.policy != "default" && o.policy != "reduction_to_one_device" && o.policy != "hierarchical_copy") {
        usage_error("unknown --policy '" + o.policy + "'");
      }
    } else if (a == "--optimizer") {
      o.optimizer = v;
      if (o.optimizer != "sharded" && o.optimizer != "replicated") usage_error("unknown --optimizer '" + o.optimizer + "'");
    } else if (a == "--data") {
      o.data = v;
    } else if (a == "--timeline") {
      o.timeline = v;
    } else if (a == "--overlap") {
      char* end = nullptr;
      o.overlap_mib = std::strtod(v, &end);
      if (end == v || *end != '\0' || !(o.overlap_mib >= 0)) {
        usage_error("--overlap needs a bucket size in MiB >= 0, got '" + std::string(v) + "'");
      }
    } else if (a == "--elastic") {
      o.elastic = parse_number(a, v, 0) != 0;
    } else if (a == "--commit-every") {
      o.commit_every = parse_number(a, v, 1);
    } else if (a == "--kill-at-step") {
      o.kill_at_step = static_cast<long long>(parse_number(a, v, 0));
    } else if (a == "--device") {
      o.device = v;
      if (o.device != "threads" && o.device != "cuda" && o.device != "auto" && o.device != "cluster") {
        usage_error("unknown --device '" + o.device + "'");
      }
#if !FASHION_MNIST_CLUSTER
      if (o.device == "cluster") usage_error("--device cluster needs a build with MPI (libopenmpi-dev)");
#endif
#if !FASHION_MNIST_GPU
      if (o.device == "cuda") {
        usage_error("--device cuda needs a build with CUDA (nvcc and cuBLAS found at configure time)");
      }
#endif
    } else {
      usage_error("unknown option '" + std::string(a) + "'");
    }
  }
  if (o.elastic && (o.device != "cluster" || o.optimizer != "replicated")) {
    usage_error("--elastic needs --device cluster and --optimizer replicated (the committed model is the mirrored "
                "parameters and momentum)");
  }
  return o;
}

/// Which library does the matrix products; with a BLAS (EIGEN_USE_BLAS), makes it single-threaded:
/// each replica is one thread, and mirror is what runs them in parallel.
std::string configure_gemm() {
#if FASHION_MNIST_BLAS
  const auto set_threads = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  const auto config = reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  if (set_threads == nullptr) {
    std::fprintf(stderr,
                 "fashion_mnist: warning: the matrix products go to a system BLAS that is not OpenBLAS (the "
                 "reference BLAS is ~10x slower); install OpenBLAS: apt-get install libopenblas0-pthread\n");
    return "Eigen + system BLAS (not OpenBLAS)";
  }
  set_threads(1);
  return std::string("Eigen + ") + (config != nullptr ? config() : "OpenBLAS") + ", 1 thread per replica";
#else
  return "Eigen";
#endif
}

/// A global batch: rows of images and their labels, views into the shuffled training set.
struct Batch {
  BOOST_HANA_DEFINE_STRUCT(Batch, (mirror::matrix_view<const std::uint8_t>, images), (std::span<const std::int32_t>, labels));
};

/// What every replica needs to know about a step besides its rows.
struct StepInfo {
  std::size_t global_rows;  // the global batch's size: gradients are divided by it
  float lr;
};

/// A progress bar on stdout, drawn only when stdout is a terminal.
class Progress {
 public:
  Progress() : tty_(::isatty(STDOUT_FILENO) == 1) {}
  /// Whether draw() would draw now (on a terminal, every 100 ms and at the end).
  bool due(std::size_t done, std::size_t total) const {
    return tty_ && (done >= total || std::chrono::steady_clock::now() - last_ >= std::chrono::milliseconds(100));
  }
  void draw(int epoch, int epochs, std::size_t done, std::size_t total, double loss) {
    if (!due(done, total)) return;
    last_ = std::chrono::steady_clock::now();
    constexpr int width = 30;
    const int filled = total == 0 ? width : static_cast<int>(width * done / total);
    std::printf("\r  epoch %d/%d [%s%s] %3d%%  loss %.4f", epoch, epochs, std::string(filled, '#').c_str(),
                std::string(width - filled, '.').c_str(), total == 0 ? 100 : static_cast<int>(100 * done / total),
                loss);
    std::fflush(stdout);
  }
  void clear() {
    if (tty_) std::printf("\r\033[K");
  }

 private:
  bool tty_;
  std::chrono::steady_clock::time_point last_{};
};

bool chief = true;  // prints the progress lines (every worker of a cluster trains the same model)
bool lost_a_worker = false;  // --elastic: this process survived a worker's death

/// The parameters of the model in `state` (the replicated optimiser's State, or the sharded
/// one's Params).
const fm::Params& params_of(const fm::State& s) noexcept { return s.params; }
const fm::Params& params_of(const fm::Params& p) noexcept { return p; }

/// Where an --elastic loop resumes: the committed model and the step after it, and where to
/// commit (every --commit-every steps). `first` is its first strategy (--kill-at-step fires there).
struct Resume {
  const fm::State& model;
  std::size_t step;
  std::function<void(const fm::State&, std::size_t)> commit;
  bool first;
};

/// Trains on `strategy` and returns the test accuracy; with `resume`, from its model and step,
/// committing as it goes (the replicated optimiser only).
template <bool Sharded, class Strategy>
double train_and_test_on(Strategy& strategy, const Options& o, const fm::split& train, const fm::split& test,
                         const Resume* resume) {
  if (!o.timeline.empty()) strategy.set_timeline(o.timeline);
  chief = strategy.is_chief();
  const int replicas = strategy.num_replicas_in_sync();  // in every worker
  const int local = strategy.num_local_replicas();       // in this process

  // The model. Replicated: one variable of parameters and momentum; every replica's copy starts
  // from the same seeded weights and every replica steps all of it. Sharded: the parameters are
  // the variable, and the momentum is a PerReplica of cuts, 1/N of it on each replica, made
  // with distribute_values_from_function.
  auto model = [&] {
    if constexpr (Sharded) {
      return std::pair{strategy.make_variable(fm::init_params(o.seed)),
                       strategy.distribute_values_from_function([](const mirror::ValueContext& c) {
                         return mirror::cut_for_replica(fm::zero_params(), c);
                       })};
    } else {
      return strategy.make_variable(resume != nullptr ? resume->model
                                                      : fm::State{fm::init_params(o.seed), fm::zero_params()});
    }
  }();
  // Each replica's activations and gradient buffers (replica i receives component i).
  const std::size_t rows_per_replica = (o.batch_size + static_cast<std::size_t>(replicas) - 1) / replicas;
  mirror::PerReplica<fm::Workspace> work(
      std::vector<fm::Workspace>(static_cast<std::size_t>(local), fm::Workspace(rows_per_replica)));

  const std::size_t bucket_bytes = o.overlap_mib >= 0 ? static_cast<std::size_t>(o.overlap_mib * 1048576.0) : 0;
  auto train_step = [momentum = o.momentum, overlap = o.overlap_mib >= 0, bucket_bytes](
                        auto& ctx, const Batch& batch, auto& s, fm::Workspace& w, const StepInfo& info) {
    const std::size_t n = batch.labels.size();
    std::vector<float> losses(n), correct(n);
    const auto step = [&](const auto& grads) {
      s.update([&](fm::State& st, const fm::ParamSpans& g) { fm::apply_momentum(st, g, info.lr, momentum); }, grads);
    };
    if (overlap) {
      // Each layer's gradient buffers are marked ready as backward finishes them (the last
      // layer first); a bucket's all-reduce starts as soon as its buffers are all ready.
      fm::ParamSpans spans = w.grads();
      auto buckets = ctx.gradient_buckets(mirror::ReduceOp::sum, spans, bucket_bytes);
      w.forward_backward(s.value().params, batch.images, batch.labels, info.global_rows, losses, correct,
                         [&](std::size_t leaf) { buckets.ready(leaf); });
      step(buckets.finish());
    } else {
      w.forward_backward(s.value().params, batch.images, batch.labels, info.global_rows, losses, correct);
      // One fused collective over the six gradient buffers, in place: afterwards every replica's
      // buffers hold the global batch's mean gradient.
      step(ctx.all_reduce(mirror::ReduceOp::sum, w.grads()));
    }
    return std::pair{std::move(losses), std::move(correct)};
  };
  auto sharded_step = [momentum = o.momentum, overlap = o.overlap_mib >= 0, bucket_bytes](
                          auto& ctx, const Batch& batch, auto& params, fm::Params& velocity, fm::Workspace& w,
                          const StepInfo& info) {
    const std::size_t n = batch.labels.size();
    std::vector<float> losses(n), correct(n);
    const auto step = [&](std::span<float> p, std::span<const float> g, std::span<float> v) {
      fm::momentum_step(p, v, g, info.lr, momentum);
    };
    if (overlap) {
      // Each layer's buffers are reduce-scattered in buckets started during backward; then, as
      // below, each replica steps its cut and the cuts are all-gathered.
      fm::ParamSpans spans = w.grads();
      auto buckets = ctx.gradient_buckets(mirror::ReduceOp::sum, spans, bucket_bytes, mirror::sharded);
      w.forward_backward(params.value(), batch.images, batch.labels, info.global_rows, losses, correct,
                         [&](std::size_t leaf) { buckets.ready(leaf); });
      params.update_sharded(step, buckets, velocity);
    } else {
      w.forward_backward(params.value(), batch.images, batch.labels, info.global_rows, losses, correct);
      // The gradient is reduce-scattered in place (one fused collective over the six buffers),
      // each replica steps its cut of the parameters with its cut of the momentum, and the cuts
      // are all-gathered into every replica's copy.
      params.update_sharded(step, mirror::ReduceOp::sum, w.grads(), velocity);
    }
    return std::pair{std::move(losses), std::move(correct)};
  };
  const auto step_on = [&](const auto& per_replica, const StepInfo& info) {
    if constexpr (Sharded) {
      return strategy.run(sharded_step, per_replica, model.first, model.second, work, info);
    } else {
      return strategy.run(train_step, per_replica, model, work, info);
    }
  };
  auto& variable = [&]() -> auto& {
    if constexpr (Sharded) {
      return model.first;
    } else {
      return model;
    }
  }();

  std::vector<std::uint8_t> images(train.images.size());
  std::vector<std::int32_t> labels(train.rows);
  std::vector<std::size_t> order(train.rows);
  std::iota(order.begin(), order.end(), std::size_t{0});
  fm::rng shuffle_rng{o.seed * 0x2545f4914f6cdd1dULL + 1};

  const std::size_t steps_per_epoch = (train.rows + o.batch_size - 1) / o.batch_size;
  const double total_steps = static_cast<double>(steps_per_epoch) * o.epochs;
  const std::size_t first_step = resume != nullptr ? resume->step : 0;
  std::size_t step = 0;
  Progress progress;

  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    // Shuffle the training set (the same permutation whatever the replica count).
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[shuffle_rng.below(i)]);
    // An elastic loop that resumes skips the steps before its commit (the permutations above
    // still advance, so every epoch's order is the same as without a loss).
    if (step + steps_per_epoch <= first_step) {
      step += steps_per_epoch;
      continue;
    }
    // The gather (47 MB) is memory-bound: every replica of this process copies a share.
    strategy.run([&, local](auto& ctx) {
      const std::size_t r = static_cast<std::size_t>(ctx.replica_id_in_sync_group() % local);
      const std::size_t n = static_cast<std::size_t>(local);
      for (std::size_t i = train.rows * r / n, end = train.rows * (r + 1) / n; i < end; ++i) {
        std::copy_n(train.images.data() + order[i] * fm::pixels, fm::pixels, images.data() + i * fm::pixels);
        labels[i] = train.labels[order[i]];
      }
    });
    std::vector<Batch> batches;
    for (std::size_t first = 0; first < train.rows; first += o.batch_size) {
      const std::size_t g = std::min(o.batch_size, train.rows - first);
      batches.push_back({{std::span<const std::uint8_t>(images).subspan(first * fm::pixels, g * fm::pixels), fm::pixels},
                         std::span<const std::int32_t>(labels).subspan(first, g)});
    }

    double loss_sum = 0, correct_sum = 0;
    std::size_t seen = 0, k = first_step > step ? first_step - step : 0;
    step += k;
    batches.erase(batches.begin(), batches.begin() + static_cast<std::ptrdiff_t>(k));
    k = 0;
    for (const auto& per_replica : strategy.distribute_dataset(batches)) {
      const std::size_t g = batches[k++].labels.size();
#if MIRROR_HAS_MPI
      if constexpr (Strategy::multi_worker) {
        if (resume != nullptr && resume->first && static_cast<long long>(step) == o.kill_at_step &&
            strategy.worker_index() == strategy.num_workers() - 1) {
          std::printf("worker %d: killing itself (SIGKILL) at step %zu\n", strategy.worker_index(), step);
          std::fflush(stdout);
          std::raise(SIGKILL);
        }
      }
#endif
      const double t = static_cast<double>(step++) / total_steps;
      const StepInfo info{g, static_cast<float>(o.lr * 0.5 * (1.0 + std::cos(3.141592653589793 * t)))};
      const auto [losses, correct] = step_on(per_replica, info);  // PerReplica each
      if (resume != nullptr && (step % o.commit_every == 0 || step == static_cast<std::size_t>(total_steps))) {
        if constexpr (!Sharded) resume->commit(variable.value(), step);
      }
      const float loss = strategy.reduce(mirror::ReduceOp::mean, losses, mirror::axis0);
      const float accuracy = strategy.reduce(mirror::ReduceOp::mean, correct, mirror::axis0);
      loss_sum += static_cast<double>(loss) * g;
      correct_sum += static_cast<double>(accuracy) * g;
      seen += g;
      if (chief) progress.draw(epoch, o.epochs, seen, train.rows, loss_sum / seen);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!chief) continue;
    progress.clear();
    std::printf("epoch %d/%d  loss %.4f  train_accuracy %.4f  samples/s %.0f\n", epoch, o.epochs, loss_sum / seen,
                correct_sum / seen, static_cast<double>(seen) / seconds);
    std::fflush(stdout);
  }

  // Test accuracy: the whole test set as one global batch, split over the replicas.
  const std::vector<Batch> test_batch{{{std::span<const std::uint8_t>(test.images), fm::pixels}, test.labels}};
  double accuracy = 0;
  for (const auto& per_replica : strategy.distribute_dataset(test_batch)) {
    const auto correct = strategy.run(
        [](const Batch& b, auto& s, fm::Workspace& w) {
          constexpr std::size_t chunk = 256;
          std::vector<float> ok(b.labels.size());
          for (std::size_t first = 0; first < ok.size(); first += chunk) {
            const std::size_t n = std::min(chunk, ok.size() - first);
            w.forward(params_of(s.value()), b.images.subrows(first, n));
            for (std::size_t i = 0; i < n; ++i) ok[first + i] = w.predicted(i) == b.labels[first + i] ? 1.0f : 0.0f;
          }
          return ok;
        },
        per_replica, variable, work);
    accuracy = strategy.reduce(mirror::ReduceOp::mean, correct, mirror::axis0);
  }
  return accuracy;
}

template <class Device, class Ops, bool Sharded>
double train_and_test(const Options& o, const fm::split& train, const fm::split& test, Device device) {
  mirror::Strategy<Device, Ops> strategy{device};
  return train_and_test_on<Sharded>(strategy, o, train, test, nullptr);
}

#if FASHION_MNIST_CLUSTER
/// --elastic: the cluster's training inside mirror::elastic::train. The committed state is the
/// model (parameters and momentum, mirrored) and its step; after a loss the survivors resume from
/// it on a strategy over themselves, the global batches split over fewer replicas.
double train_elastic(const Options& o, const fm::split& train, const fm::split& test,
                     const mirror::devices::Threads& threads) {
  using Cluster = mirror::devices::Cluster<mirror::devices::Threads>;
  using Strategy = mirror::Strategy<Cluster>;
  mirror::elastic::state<fm::State> state{fm::State{fm::init_params(o.seed), fm::zero_params()}};
  double accuracy = 0;
  mirror::elastic::train<Strategy>(
      Cluster{.local = threads}, state,
      [&](Strategy& strategy, mirror::elastic::state<fm::State>& st) {
        const Resume resume{st.value(), static_cast<std::size_t>(st.step()),
                            [&](const fm::State& model, std::size_t step) {
                              st.commit(model, static_cast<std::int64_t>(step));
                            },
                            st.epochs().size() == 1};
        if (strategy.is_chief() && !resume.first) {
          std::printf("resuming at step %zu on %d workers (%d replicas)\n", resume.step, strategy.num_workers(),
                      strategy.num_replicas_in_sync());
          std::fflush(stdout);
        }
        accuracy = train_and_test_on<false>(strategy, o, train, test, &resume);
      },
      [&](const mirror::worker_lost_error& e) {
        lost_a_worker = true;
        if (!chief) return;  // the last strategy's chief, if it survived, tells
        std::printf("\n%s\n", e.what());  // below the progress bar, where one is drawn
        std::fflush(stdout);
      });
  return accuracy;
}
#endif

/// `--device auto`: cuda when this process sees a GPU (and was built with CUDA), else threads.
std::string resolve_device(const std::string& device) {
  if (device != "auto") return device;
#if FASHION_MNIST_GPU
  if (mirror::cuda::device_count() > 0) return "cuda";
#endif
  return "threads";
}

#if FASHION_MNIST_GPU
/// R replicas on the GPUs: as many physical GPUs as possible (the largest count <= the visible
/// GPUs that divides R), the rest as logical devices sharing them.
mirror::devices::Cuda cuda_layout(int replicas) {
  const int visible = std::max(1, mirror::cuda::device_count());
  int gpus = std::min(visible, replicas);
  while (replicas % gpus != 0) --gpus;
  mirror::devices::Cuda d;
  for (int g = 0; g < gpus; ++g) d.gpus.push_back(g);
  d.replicas_per_gpu = replicas / gpus;
  return d;
}

/// The --policy on `device`: "default" is NcclAllReduce (default_ops_t), which needs one replica
/// per GPU (NCCL refuses two ranks on one GPU); with logical devices it is ReductionToOneDevice,
/// and the first line says so.
std::string cuda_policy(const Options& o, const mirror::devices::Cuda& device) {
  if (o.policy != "default") return o.policy;
  if (device.replicas_per_gpu > 1) return "reduction_to_one_device";
  return "nccl_all_reduce";
}

/// --device cuda: the model on the GPUs (gpu_model.cu). Each replica keeps its parameters,
/// momentum, activations and gradients in its GPU's memory; a step copies its rows there (from
/// pinned memory, asynchronously), runs forward and backward with cuBLAS and small kernels on the
/// replica's stream, all-reduces the gradients in place with ctx.all_reduce of ONE device_span
/// (the six layers are one array: nothing to pack) through Ops on the replicas' streams, and
/// applies the same momentum step on every replica, so the copies stay equal without a variable.
/// The host waits for the GPUs only at the end of an epoch (the totals it prints).
template <class Ops>
double train_and_test_on_gpus(const Options& o, const fm::split& train, const fm::split& test,
                              const mirror::devices::Cuda& device) {
  namespace gpu = fm::gpu;
  mirror::Strategy<mirror::devices::Cuda, Ops> strategy{device};  // first: no GPU is its error
  if (!o.timeline.empty()) strategy.set_timeline(o.timeline);
  const int replicas = strategy.num_replicas_in_sync();
  const std::size_t rows_per_replica = (o.batch_size + static_cast<std::size_t>(replicas) - 1) / replicas;
  const std::size_t eval_rows = (test.rows + static_cast<std::size_t>(replicas) - 1) / replicas;
  // Room for a step's rows, and for the test set's in chunks of at most 2048.
  const std::size_t max_rows = std::max(rows_per_replica, std::min<std::size_t>(eval_rows, 2048));

  const fm::Params init = fm::init_params(o.seed);
  const std::vector<float> initial = gpu::pack(init.w1, init.b1, init.w2, init.b2, init.w3, init.b3);
  // Each replica's model, made on its own thread with its GPU current.
  mirror::PerReplica<gpu::replica> models = strategy.run(
      [&](auto&) { return gpu::replica(mirror::cuda::current_stream(), max_rows, initial); });

  std::vector<std::uint8_t> images(train.images.size());
  std::vector<std::int32_t> labels(train.rows);
  // Copies from these are asynchronous: the host enqueues the next steps while the GPUs work.
  const gpu::pinned pin_images(images.data(), images.size());
  const gpu::pinned pin_labels(labels.data(), labels.size() * sizeof(std::int32_t));
  const gpu::pinned pin_test_images(test.images.data(), test.images.size());
  const gpu::pinned pin_test_labels(test.labels.data(), test.labels.size() * sizeof(std::int32_t));
  std::vector<std::size_t> order(train.rows);
  std::iota(order.begin(), order.end(), std::size_t{0});
  fm::rng shuffle_rng{o.seed * 0x2545f4914f6cdd1dULL + 1};

  const std::size_t bucket_bytes = o.overlap_mib >= 0 ? static_cast<std::size_t>(o.overlap_mib * 1048576.0) : 0;
  auto train_step = [momentum = o.momentum, overlap = o.overlap_mib >= 0, bucket_bytes](
                        auto& ctx, const Batch& batch, gpu::replica& m, const StepInfo& info) {
    if (overlap) {
      // The six layers' gradients as six views of the one array, in layout order: the buckets
      // are runs of them (adjacent, so each is reduced in place), started as backward enqueues
      // the last kernel of each; NCCL runs on the communication stream beside the earlier
      // layers' kernels.
      float* g = m.gradients();
      using view = mirror::cuda::device_span<float>;
      using L = gpu::layout;
      std::array<view, 6> layers{view{g + L::w1, L::b1 - L::w1}, view{g + L::b1, L::w2 - L::b1},
                                 view{g + L::w2, L::b2 - L::w2}, view{g + L::b2, L::w3 - L::b2},
                                 view{g + L::w3, L::b3 - L::w3}, view{g + L::b3, L::total - L::b3}};
      auto buckets = ctx.gradient_buckets(mirror::ReduceOp::sum, layers, bucket_bytes);
      m.forward_backward(batch.images.data.data(), batch.labels.data(), batch.labels.size(), info.global_rows,
                         [&](std::size_t leaf) { buckets.ready(leaf); });
      (void)buckets.finish();
    } else {
      m.forward_backward(batch.images.data.data(), batch.labels.data(), batch.labels.size(), info.global_rows);
      // One collective over the whole gradient, in place on the replica's stream.
      (void)ctx.all_reduce(mirror::ReduceOp::sum, mirror::cuda::device_span<float>{m.gradients(), gpu::layout::total});
    }
    m.apply_momentum(info.lr, momentum);
  };
  // {loss sum, correct predictions} of every replica since the last call (a pair returned from
  // fn comes back as a pair of PerReplica).
  auto totals = [&] {
    const auto [losses, corrects] = strategy.run([](gpu::replica& m) { return m.take_totals(); }, models);
    std::pair<double, double> sum{0, 0};
    for (const double l : losses) sum.first += l;
    for (const double c : corrects) sum.second += c;
    return sum;
  };

  const std::size_t steps_per_epoch = (train.rows + o.batch_size - 1) / o.batch_size;
  const double total_steps = static_cast<double>(steps_per_epoch) * o.epochs;
  std::size_t step = 0;
  Progress progress;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    // The same permutation as on threads; the GPUs have finished with the last epoch's rows (the
    // totals below waited for them) before they are overwritten.
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[shuffle_rng.below(i)]);
    for (std::size_t i = 0; i < train.rows; ++i) {
      std::copy_n(train.images.data() + order[i] * fm::pixels, fm::pixels, images.data() + i * fm::pixels);
      labels[i] = train.labels[order[i]];
    }
    std::vector<Batch> batches;
    for (std::size_t first = 0; first < train.rows; first += o.batch_size) {
      const std::size_t g = std::min(o.batch_size, train.rows - first);
      batches.push_back({{std::span<const std::uint8_t>(images).subspan(first * fm::pixels, g * fm::pixels), fm::pixels},
                         std::span<const std::int32_t>(labels).subspan(first, g)});
    }
    std::size_t seen = 0, k = 0;
    double loss_sum = 0, correct_sum = 0;
    auto add_totals = [&] {
      const auto [l, c] = totals();
      loss_sum += l;
      correct_sum += c;
    };
    for (const auto& per_replica : strategy.distribute_dataset(batches)) {
      const std::size_t g = batches[k++].labels.size();
      const double t = static_cast<double>(step++) / total_steps;
      const StepInfo info{g, static_cast<float>(o.lr * 0.5 * (1.0 + std::cos(3.141592653589793 * t)))};
      strategy.run(train_step, per_replica, models, info);
      seen += g;
      if (progress.due(seen, train.rows)) {  // on a terminal only: reading the loss waits for the GPUs
        add_totals();
        progress.draw(epoch, o.epochs, seen, train.rows, loss_sum / static_cast<double>(seen));
      }
    }
    add_totals();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    progress.clear();
    std::printf("epoch %d/%d  loss %.4f  train_accuracy %.4f  samples/s %.0f\n", epoch, o.epochs, loss_sum / seen,
                correct_sum / seen, static_cast<double>(seen) / seconds);
    std::fflush(stdout);
  }

  // Test accuracy: the whole test set as one global batch, split over the replicas.
  const std::vector<Batch> test_batch{{{std::span<const std::uint8_t>(test.images), fm::pixels}, test.labels}};
  for (const auto& per_replica : strategy.distribute_dataset(test_batch)) {
    strategy.run([](const Batch& b, gpu::replica& m) { m.evaluate(b.images.data.data(), b.labels.data(), b.labels.size()); },
                 per_replica, models);
  }
  return totals().second / static_cast<double>(test.rows);
}

/// Trains on the GPUs with the --policy (see cuda_policy).
double train_on_gpus(const Options& o, const fm::split& train, const fm::split& test,
                     const mirror::devices::Cuda& device) {
  const std::string policy = cuda_policy(o, device);
  if (policy == "reduction_to_one_device") {
    return train_and_test_on_gpus<mirror::ops::ReductionToOneDevice>(o, train, test, device);
  }
  if (policy == "hierarchical_copy") return train_and_test_on_gpus<mirror::ops::HierarchicalCopy>(o, train, test, device);
  return train_and_test_on_gpus<mirror::default_ops_t<mirror::devices::Cuda>>(o, train, test, device);
}
#endif

/// Trains with the --optimizer.
template <class Device, class Ops>
double train_with_optimizer(const Options& o, const fm::split& train, const fm::split& test, const Device& device) {
  if (o.optimizer == "replicated") return train_and_test<Device, Ops, false>(o, train, test, device);
  return train_and_test<Device, Ops, true>(o, train, test, device);
}

/// Trains with the --policy on `device`'s replicas.
template <class Device>
double train_with_policy(const Options& o, const fm::split& train, const fm::split& test, const Device& device) {
  if (o.policy == "reduction_to_one_device") return train_with_optimizer<Device, mirror::ops::ReductionToOneDevice>(o, train, test, device);
  if (o.policy == "hierarchical_copy") return train_with_optimizer<Device, mirror::ops::HierarchicalCopy>(o, train, test, device);
  return train_with_optimizer<Device, mirror::default_ops_t<Device>>(o, train, test, device);
}

}  // namespace

/// How the banner names --overlap.
std::string overlap_text(const Options& o) {
  if (o.overlap_mib < 0) return "";
  char text[96];
  std::snprintf(text, sizeof text, ", overlap: gradient buckets of %g MiB", o.overlap_mib);
  return text;
}

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  o.device = resolve_device(o.device);
  try {
    const fm::split train = fm::load_split(o.data, "train", o.limit, fm::gunzip);
    const fm::split test = fm::load_split(o.data, "t10k", 0, fm::gunzip);
    std::string gemm, where = o.device == "cluster" ? "per worker, devices::Cluster<Threads>" : "devices::Threads";
    std::string policy = o.policy;
#if FASHION_MNIST_GPU
    const mirror::devices::Cuda gpus = cuda_layout(o.replicas);
    if (o.device == "cuda") {
      gemm = fm::gpu::cublas_version() + " and CUDA kernels";
      where = "devices::Cuda, " + std::to_string(gpus.gpus.size()) + " GPU" + (gpus.gpus.size() == 1 ? "" : "s") +
              " x " + std::to_string(gpus.replicas_per_gpu) + " replica" + (gpus.replicas_per_gpu == 1 ? "" : "s");
      policy = cuda_policy(o, gpus);
      if (o.policy == "default") policy += gpus.replicas_per_gpu > 1 ? " (default; NCCL needs one GPU per replica)" : " (default)";
    }
#endif
    if (gemm.empty()) gemm = configure_gemm();
    std::printf("fashion_mnist: %zu training and %zu test images from %s; MLP 784-256-128-10, SGD momentum %.2g (%s), "
                "lr %g (cosine), global batch %zu on %d replica%s (%s), policy %s, seed %llu%s; %s\n",
                train.rows, test.rows, o.data.c_str(), double(o.momentum),
                o.device == "cuda" ? "replicated" : o.optimizer.c_str(), double(o.lr), o.batch_size, o.replicas,
                o.replicas == 1 ? "" : "s", where.c_str(), policy.c_str(), static_cast<unsigned long long>(o.seed),
                overlap_text(o).c_str(), gemm.c_str());
    std::fflush(stdout);
    double accuracy = 0;
    using mirror::devices::Threads;
    const Threads threads{.replicas = o.replicas};
    if (o.device == "cluster") {
#if FASHION_MNIST_CLUSTER
      using Cluster = mirror::devices::Cluster<Threads>;
      if (o.elastic) {
        accuracy = train_elastic(o, train, test, threads);
      } else {
        accuracy = train_with_optimizer<Cluster, mirror::default_ops_t<Cluster>>(o, train, test, Cluster{.local = threads});
      }
#endif
    } else if (o.device == "cuda") {
#if FASHION_MNIST_GPU
      accuracy = train_on_gpus(o, train, test, gpus);
#endif
    } else {
      accuracy = train_with_policy(o, train, test, threads);
    }
    if (chief) std::printf("test_accuracy=%.4f\n", accuracy);
    if (lost_a_worker) {
      // Open MPI 5.0's MPI_Finalize (at exit) can wait for ever on the survivors of a death
      // (docs/multi-worker.md#losing-a-worker): the results are out, so leave without it.
      std::fflush(stdout);
      std::_Exit(0);
    }
    return 0;
  } catch (const fm::idx_error& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fashion_mnist: error: %s\n", e.what());
    return 1;
  }
}
