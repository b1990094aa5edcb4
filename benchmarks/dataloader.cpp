// Dataloader throughput on a JPEG image folder: images/s of ImageFolder's training
// pipeline (crop-aware DCT-scaled decode + RandomResizedCrop(224) + RandomHorizontalFlip
// into u8 NHWC batches) through the DataLoader, per thread count. Two ways to use T
// threads are measured: T loader workers that each build whole batches ("workers", what
// torch's DataLoader does with num_workers = T), and the consumer building each batch
// over a T-thread CPU pool ("pool", num_workers = 0). A per-image breakdown (read, full
// decode, crop-aware scaled decode, resample) on one thread comes first. Prints a table
// and writes JSON; benchmarks/peers/torchvision_dataloader.py runs the same pipeline
// with torchvision + PIL and compares (--compare). With HDF5, the same folder packed into
// HDF5 shards (data::pack_image_folder, original bytes kept) is measured through
// PackedImageDataset in the same two ways ("packed" columns). With a CUDA device, a last
// column delivers the batches into GPU memory (T workers, pinned batches, DevicePrefetcher's
// async copy stream, to_float_batch on the GPU to f16 channels-last): what a training loop
// on the GPU receives.
//
//   dataloader [--root DIR] [--images 1000] [--size 350] [--batch 64] [--threads 1,2,N]
//              [--epochs 3] [--json PATH] [--fashion DIR]
//              [--augment trivial|rand|imagenet] [--normalize] [--one-core]
// --augment adds that automatic augmentation after the crop and flip (ImagePipeline::augment,
// data/augment.hpp), --normalize converts each batch to f32 NCHW with ImageNet's mean and
// std on the CPU (to_float_batch, on the consumer thread), as torchvision's recipe does
// with ConvertImageDtype + Normalize; --one-core times only the whole pipeline on one core
// (num_workers 0 and a 1-thread pool: read, decode, augment, collate and normalise
// serially; no breakdown, packed, pool or GPU runs), for
// benchmarks/peers/augment_pipeline_compare.py, which interleaves it with torchvision.
// Without --root a folder of --images Fashion-MNIST-based JPEGs (shorter side ~ --size,
// so ~400 x 350 on average) is generated once under $TMPDIR and reused; --fashion names the
// Fashion-MNIST folder (default Debian's /usr/share/datasets/fashion-mnist; on the GPU
// machine, a carried copy).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/data/augment.hpp"
#include "dltrain/data/dataloader.hpp"
#include "dltrain/data/image_folder.hpp"
#include "dltrain/data/packed.hpp"
#include "dltrain/data/vision.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/io/checkpoint.hpp"

using namespace dltrain;
using namespace dltrain::data;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// "1,2,N" (N: the hardware threads), each item checked after parsing the flags.
std::vector<int> parse_threads(const std::vector<std::string>& items) {
  std::vector<int> out;
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  for (const std::string& item : items) out.push_back(item == "N" ? hw : std::stoi(item));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string generate(int64_t images, int64_t size, const std::string& fashion) {
  const int64_t per_class = (images + 9) / 10;
  const fs::path dir =
      fs::temp_directory_path() /
      ("dltrain_bench_images_" + std::to_string(per_class * 10) + "_" + std::to_string(size));
  if (fs::exists(dir / "done")) return dir.string();
  fs::remove_all(dir);
  MakeImageFolderOptions o;
  o.classes = 10;
  o.per_class = per_class;
  o.size = size;
  std::printf("generating %lld images (shorter side ~%lld) in %s ...\n",
              static_cast<long long>(per_class * 10), static_cast<long long>(size),
              dir.string().c_str());
  if (fs::exists(fashion)) {
    const MNIST src(fashion, /*train=*/true);
    write_image_folder(dir.string(), src.data(), src.targets(), o);
  } else {  // random strokes stand in for Fashion-MNIST
    Generator g(0);
    const Tensor imgs = randint(0, 256, {per_class * 10, 28, 28}, DType::u8, &g);
    std::vector<int64_t> labels(static_cast<size_t>(per_class * 10));
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 10);
    write_image_folder(dir.string(), imgs,
                       from_vector(labels, {static_cast<int64_t>(labels.size())}), o);
  }
  std::ofstream(dir / "done") << "ok\n";
  return dir.string();
}

struct Result {
  int threads;
  std::string mode;
  double images_per_s;
};

// Best epoch of `epochs` (the first one also warms the page cache and allocator); with
// `normalize`, each batch becomes f32 NCHW (x / 255 - mean) / std on the consumer thread.
double run(const std::shared_ptr<Dataset>& ds, int64_t batch, int64_t workers, int epochs,
           bool normalize = false) {
  DataLoaderOptions lo;
  lo.batch_size = batch;
  lo.shuffle = true;
  lo.drop_last = true;
  lo.num_workers = workers;
  lo.prefetch_factor = 2;
  DataLoader loader(ds, lo);
  double best = 0;
  for (int e = 0; e < epochs; ++e) {
    loader.set_epoch(e);
    int64_t n = 0;
    uint64_t check = 0;
    const auto t0 = Clock::now();
    for (const Batch& b : loader) {
      n += b.size();
      if (normalize) {
        const Tensor x = to_float_batch(b.data, kImageNetMean, kImageNetStd);
        check += static_cast<uint64_t>(x.data<float>()[0] > 0);
      } else {
        check += b.data.data<uint8_t>()[0];  // touch the batch
      }
    }
    const double s = seconds(t0, Clock::now());
    best = std::max(best, static_cast<double>(n) / s);
    (void)check;
  }
  return best;
}

// Into GPU memory: pinned batches from `workers` threads, copied by DevicePrefetcher on its
// own stream and normalised on the device to f16 channels-last (what an AMP channels-last
// ResNet-50 consumes). Best epoch, synchronised at the end of each.
double run_gpu(const std::shared_ptr<Dataset>& ds, int64_t batch, int64_t workers, int epochs) {
  DataLoaderOptions lo;
  lo.batch_size = batch;
  lo.shuffle = true;
  lo.drop_last = true;
  lo.num_workers = workers;
  lo.prefetch_factor = 2;
  lo.pin_memory = true;
  DataLoader loader(ds, lo);
  DevicePrefetcher prefetch(loader, Device::cuda(0));
  const std::vector<float> mean{0.485f, 0.456f, 0.406f}, sd{0.229f, 0.224f, 0.225f};
  double best = 0;
  for (int e = 0; e < epochs; ++e) {
    loader.set_epoch(e);
    int64_t n = 0;
    cuda::synchronize();
    const auto t0 = Clock::now();
    for (const Batch& b : prefetch) {
      Tensor x = to_float_batch(b.data, mean, sd, MemoryFormat::ChannelsLast, DType::f16);
      n += x.size(0);
    }
    cuda::synchronize();
    const double s = seconds(t0, Clock::now());
    best = std::max(best, static_cast<double>(n) / s);
  }
  return best;
}

void breakdown(const ImageFolder& ds, int64_t count) {
  const int64_t n = std::min<int64_t>(count, ds.size());
  std::vector<std::vector<uint8_t>> files(static_cast<size_t>(n));
  double t_read = 0, t_full = 0, t_scaled = 0, t_pipe = 0, px_full = 0, px_scaled = 0;
  auto t0 = Clock::now();
  for (int64_t i = 0; i < n; ++i)
    files[static_cast<size_t>(i)] = read_file_bytes(ds.samples()[static_cast<size_t>(i)].first);
  t_read = seconds(t0, Clock::now());
  const ImagePipeline& p = ds.options().transform;
  const RandomResizedCrop rrc(p.size, p.scale, p.ratio);
  for (int64_t i = 0; i < n; ++i) {
    const auto& f = files[static_cast<size_t>(i)];
    t0 = Clock::now();
    const Image full = decode_jpeg(f);
    t_full += seconds(t0, Clock::now());
    px_full += static_cast<double>(full.width * full.height);
    // The crop-aware decode alone (DCT scale and region), with the box the pipeline draws.
    SampleRandom r(0, 0, i);
    const CropBox box = rrc.get_params(full.height, full.width, r);
    const JpegScale s = jpeg_scale_for_crop(std::min(box.height, box.width), p.size);
    const int64_t sh = jpeg_scaled(full.height, s), sw = jpeg_scaled(full.width, s);
    const CropBox region{box.top * sh / full.height, box.left * sw / full.width,
                         std::max<int64_t>(1, box.height * sh / full.height),
                         std::max<int64_t>(1, box.width * sw / full.width)};
    CropBox at;
    t0 = Clock::now();
    const Image part = decode_jpeg_region(f.data(), f.size(), s, region, at);
    t_scaled += seconds(t0, Clock::now());
    px_scaled += static_cast<double>(part.width * part.height);
    std::vector<uint8_t> out(static_cast<size_t>(p.size * p.size * 3));
    t0 = Clock::now();
    p.apply_jpeg(f.data(), f.size(), 0, 0, i, out.data());
    t_pipe += seconds(t0, Clock::now());
  }
  const double k = 1e3 / static_cast<double>(n);
  std::printf("per image, 1 thread, %lld images (avg %.0f kpixel, %.1f KB):\n",
              static_cast<long long>(n), px_full / static_cast<double>(n) / 1e3, [&] {
                double b = 0;
                for (const auto& f : files) b += static_cast<double>(f.size());
                return b / static_cast<double>(n) / 1024;
              }());
  std::printf("  read file            %7.3f ms\n", t_read * k);
  std::printf("  full decode          %7.3f ms\n", t_full * k);
  std::printf(
      "  crop-aware decode    %7.3f ms  (%.0f%% of the full decode's pixels; %s)\n", t_scaled * k,
      100 * px_scaled / px_full,
      jpeg_region_decode_supported() ? "libjpeg region decode" : "no region decode in this build");
  std::printf("  whole pipeline       %7.3f ms  (header + scaled decode + resample + flip)\n",
              t_pipe * k);
}

}  // namespace

int main(int argc, char** argv) {
  std::string root, json, threads_arg = "1,2,N", augment = "none";
  bool normalize = false, one_core = false;
  std::string fashion = "/usr/share/datasets/fashion-mnist";
  int64_t images = 1000, size = 350, batch = 64;
  int epochs = 3;
  std::vector<std::string> threads_list{"1", "2", "N"};
  cli::Flags flags("dataloader",
                   "The ImageFolder JPEG pipeline (RandomResizedCrop(224) + flip into u8 NHWC "
                   "batches), images/s per worker-thread count; compare with "
                   "benchmarks/peers/torchvision_dataloader.py.");
  flags.group(cli::group::kBenchmark);
  flags.add("--root", &root, "an ImageNet-style folder (empty: one is generated)")
      .value_name("DIR");
  flags.add("--images", &images, "images generated when --root is empty").positive();
  flags.add("--size", &size, "mean shorter side of the generated images").positive();
  flags.add("--batch", &batch, "images per batch").positive();
  flags.add("--threads", &threads_list, "worker-thread counts to time (N: all hardware threads)")
      .value_name("T,T,...");
  flags.add("--epochs", &epochs, "epochs timed per thread count").positive();
  flags.add("--fashion", &fashion, "the Fashion-MNIST files the generated images come from")
      .value_name("DIR");
  flags.add("--json", &json, "write the figures here").value_name("FILE.json");
  flags
      .add("--augment", &augment,
           "automatic augmentation after crop and flip: none, trivial, rand or imagenet")
      .value_name("NAME");
  flags.add_switch("--normalize", &normalize,
                   "convert each batch to f32 NCHW with ImageNet's mean and std (CPU)");
  flags.add_switch("--one-core", &one_core,
                   "time only the whole pipeline on one thread (no breakdown, packed, pool or "
                   "GPU runs)");
  flags.parse(argc, argv);
  for (const std::string& t : threads_list)
    if (t != "N" && (t.empty() || t.size() > 4 ||
                     t.find_first_not_of("0123456789") != std::string::npos || std::stoi(t) < 1))
      flags.fail("--threads: '" + t + "' is not a thread count (a positive whole number or N)");
  try {
    if (!jpeg_supported()) {
      std::fprintf(stderr,
                   "dataloader: this build has no JPEG support (install "
                   "libturbojpeg0-dev and rebuild)\n");
      return 1;
    }
    if (root.empty()) root = generate(images, size, fashion);
    ImageFolderOptions fo;  // ImagePipeline::train(224)
    std::string pipeline = "RandomResizedCrop(224) + RandomHorizontalFlip";
    if (augment != "none") {
      fo.transform.augment.push_back(make_auto_augment(augment));
      pipeline += " + " + fo.transform.augment.back()->repr();
    }
    pipeline += normalize ? ", f32 NCHW normalised" : ", u8 NHWC";
    auto ds = std::make_shared<ImageFolder>(root, fo);
    std::printf("ImageFolder %s: %lld images, %zu classes; batch %lld; %s\n", root.c_str(),
                static_cast<long long>(ds->size()), ds->classes().size(),
                static_cast<long long>(batch), pipeline.c_str());
    set_num_threads(1);
    if (!one_core) breakdown(*ds, 200);

    // The packed copy of the folder (kept between runs: a resume finds it complete).
    std::shared_ptr<PackedImageDataset> packed;
    if (io::hdf5_supported() && !one_core) {
      const fs::path dir = fs::temp_directory_path() / "dltrain_bench_packed";
      fs::create_directories(dir);
      fs::path name = fs::path(root).lexically_normal();
      if (!name.has_filename()) name = name.parent_path();  // "dir/"
      const std::string prefix = (dir / name.filename()).string();
      PackOptions po;
      po.max_side = 0;  // the folder's own bytes, so both read the same JPEGs
      po.resume = true;
      const PackResult pr = pack_image_folder(root, prefix, po);
      std::printf("\npacked %lld images into %lld HDF5 shards at %s (%lld written, %.1f s)\n",
                  static_cast<long long>(pr.images), static_cast<long long>(pr.shards),
                  prefix.c_str(), static_cast<long long>(pr.shards_written), pr.seconds);
      packed = std::make_shared<PackedImageDataset>(prefix);  // ImagePipeline::train(224)
    }

    std::vector<Result> results;
    if (one_core) {
      set_num_threads(1);
      const double w = run(ds, batch, 0, epochs, normalize);
      std::printf("\none core (num_workers 0, 1 pool thread): %.1f img/s\n", w);
      results.push_back({1, "one-core", w});
    }
    const bool gpu = cuda::is_available() && !one_core;
    if (!one_core) {
      std::printf("\n%8s %16s %12s %16s", "threads", "workers img/s", "per thread", "pool img/s");
      if (packed) std::printf(" %16s %16s", "packed workers", "packed pool");
      std::printf(" %16s\n", gpu ? "into GPU img/s" : "GPU: no device");
    }
    for (int t : one_core ? std::vector<int>{} : parse_threads(threads_list)) {
      set_num_threads(1);
      const double w = run(ds, batch, t, epochs, normalize);
      set_num_threads(t);
      const double p = run(ds, batch, 0, epochs, normalize);
      std::printf("%8d %16.1f %12.1f %16.1f", t, w, w / t, p);
      results.push_back({t, "workers", w});
      results.push_back({t, "pool", p});
      if (packed) {
        set_num_threads(1);
        const double pw = run(packed, batch, t, epochs);
        set_num_threads(t);
        const double pp = run(packed, batch, 0, epochs);
        std::printf(" %16.1f %16.1f", pw, pp);
        results.push_back({t, "packed-workers", pw});
        results.push_back({t, "packed-pool", pp});
      }
      if (gpu) {
        set_num_threads(1);
        const double g =
            run_gpu(packed ? std::static_pointer_cast<Dataset>(packed) : ds, batch, t, epochs);
        std::printf(" %16.1f", g);
        results.push_back({t, packed ? "packed-workers-gpu" : "workers-gpu", g});
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    if (!json.empty()) {
      nlohmann::json rows = nlohmann::json::array();
      for (const auto& r : results)
        rows.push_back(
            {{"threads", r.threads}, {"mode", r.mode}, {"images_per_s", r.images_per_s}});
      cli::write_json_report(json, {{"benchmark", "dataloader"},
                                    {"root", root},
                                    {"images", ds->size()},
                                    {"batch", batch},
                                    {"pipeline", pipeline},
                                    {"hardware_threads", std::thread::hardware_concurrency()},
                                    {"results", rows}});
      std::printf("wrote %s\n", json.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dataloader: %s\n", e.what());
    return 1;
  }
  return 0;
}
