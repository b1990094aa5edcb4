// "[.h5py_fixture]" (hidden: run by tests/io/h5py_reads.py, ctest io.h5py_reads_dltrain_files)
// writes what dltrain puts in HDF5 files, and a JSON description of what it wrote, for h5py to
// check against: a checkpoint saved through io::save_checkpoint (a model with a BatchNorm, SGD
// with momentum after a step, a OneCycleLR), a checkpoint holding one tensor of every dtype
// (io::write_checkpoint), and a packed dataset of 5 JPEGs in 3 shards (data::pack_image_folder)
// with the CRC-32 of every image as PackedImageDataset reads it back.
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dltrain/data/packed.hpp"
#include "dltrain/dltrain.hpp"
#include "src/io/verified_header.hpp"

using namespace dltrain;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Shape, dtype and every value (as f64, or as integers for integer dtypes) of each entry.
json describe(const StateDict& sd) {
  json out = json::object();
  for (const auto& [key, t0] : sd) {
    const Tensor t = t0.detach().contiguous();
    json e;
    e["shape"] = std::vector<int64_t>(t.shape().begin(), t.shape().end());
    e["dtype"] = dtype_name(t.dtype());
    if (is_floating(t.dtype()))
      e["values"] = t.to(DType::f64).reshape({-1}).to_vector<double>();
    else
      e["values"] = t.to(DType::i64).reshape({-1}).to_vector<int64_t>();
    out[key] = e;
  }
  return out;
}

json describe(const io::Checkpoint& c) {
  json j;
  j["attrs"] = {{"format_version", c.format_version},
                {"epoch", c.progress.epoch},
                {"step", c.progress.step},
                {"batch_in_epoch", c.progress.batch_in_epoch},
                {"samples_in_epoch", c.progress.samples_in_epoch},
                {"global_batch", c.progress.global_batch},
                {"rng_seed", static_cast<int64_t>(c.rng_seed)},
                {"rng_offset", static_cast<int64_t>(c.rng_offset)}};
  j["dltrain_version"] = c.dltrain_version;
  j["metadata"] = c.metadata;
  j["groups"] = {{"model", describe(c.model)},
                 {"optimizer", describe(c.optimizer)},
                 {"scheduler", describe(c.scheduler)}};
  if (!c.scaler.empty()) j["groups"]["scaler"] = describe(c.scaler);
  return j;
}

data::Image pattern(int64_t w, int64_t h, int64_t seed) {
  data::Image im(w, h, 3);
  for (size_t i = 0; i < im.pixels.size(); ++i)
    im.pixels[i] = static_cast<uint8_t>(i * 13 + i / 7 + static_cast<size_t>(seed) * 29);
  return im;
}

}  // namespace

TEST_CASE("HDF5 files for h5py_reads.py", "[.h5py_fixture]") {
  const char* dir_env = std::getenv("DLTRAIN_H5PY_FIXTURE");
  REQUIRE(dir_env != nullptr);
  if (!io::hdf5_supported() || !data::jpeg_supported()) {
    std::printf("SKIPPED: this build has no HDF5 or no TurboJPEG\n");
    std::exit(4);  // h5py_reads.py reports the skip (ctest's SKIP_RETURN_CODE)
  }
  const fs::path dir = dir_env;
  json expect;
  manual_seed(12);

  // A training checkpoint, as the examples write it.
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 3), std::make_shared<nn::BatchNorm1d>(3)});
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::OneCycleLR sched(opt, 0.1, 10);
  Tensor y = model->forward(randn({5, 4}));
  Tensor loss = mean(mul(y, y));
  loss.backward();
  opt.step();
  sched.step();
  const std::string ckpt = (dir / "checkpoint.h5").string();
  io::save_checkpoint(
      ckpt, *model, &opt, &sched,
      {.epoch = 1, .step = 7, .batch_in_epoch = 3, .samples_in_epoch = 15, .global_batch = 5},
      {{"example", "h5py"}});
  expect["checkpoint"] = describe(io::read_checkpoint(ckpt));

  // Every dtype a checkpoint stores (f16/bf16 as their 16-bit patterns), and a 0-d tensor.
  io::Checkpoint all;
  all.model.insert("f32", randn({2, 3}));
  all.model.insert("f64", randn({3}, DType::f64));
  all.model.insert("f16", randn({2, 2}).to(DType::f16));
  all.model.insert("bf16", randn({5}).to(DType::bf16));
  all.model.insert("i32", randint(-100, 100, {4}, TensorOptions(DType::i32)));
  all.model.insert(
      "i64", randint(-(int64_t{1} << 40), int64_t{1} << 40, {2, 1}, TensorOptions(DType::i64)));
  all.model.insert("u8", randint(0, 255, {6}, TensorOptions(DType::u8)));
  all.model.insert("b8", randint(0, 2, {3}, TensorOptions(DType::u8)).to(DType::b8));
  all.model.insert("scalar", full({}, 2.5));
  all.progress.epoch = 3;
  all.metadata["note"] = "every dtype";
  const std::string dtypes = (dir / "dtypes.h5").string();
  io::write_checkpoint(dtypes, all);
  expect["dtypes"] = describe(io::read_checkpoint(dtypes));

  // A packed dataset: 5 JPEGs in 2 classes, 2 per shard (3 shards).
  const fs::path folder = dir / "images";
  for (int i = 0; i < 5; ++i) {
    const fs::path cls = folder / (i < 3 ? "cat" : "dog");
    fs::create_directories(cls);
    const auto bytes = data::encode_jpeg(pattern(10 + i, 8, i), 85);
    std::ofstream(cls / (std::to_string(i) + ".jpg"), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  }
  data::PackOptions po;
  po.max_side = 0;
  po.images_per_shard = 2;
  po.num_threads = 1;
  const std::string prefix = (dir / "pack").string();
  data::pack_image_folder(folder.string(), prefix, po);
  const data::PackedIndex ix = data::read_packed_index(prefix);
  data::PackedImageDataset ds(prefix, {});
  json pack;
  pack["index"] = fs::path(data::packed_index_path(prefix)).filename().string();
  pack["format_version"] = ix.format_version;
  pack["num_images"] = ix.num_images;
  pack["max_side"] = ix.max_side;
  pack["quality"] = ix.quality;
  pack["classes"] = ix.classes;
  pack["shard_counts"] = ix.shard_counts;
  pack["shards"] = json::array();
  for (const auto& f : ix.shard_files) pack["shards"].push_back(fs::path(f).filename().string());
  pack["jpeg_crc32"] = json::array();
  pack["jpeg_size"] = json::array();
  pack["labels"] = json::array();
  for (int64_t i = 0; i < ds.size(); ++i) {
    const std::vector<uint8_t> jpeg = ds.read_jpeg(i);
    // zlib's CRC-32, as Python's zlib.crc32 computes it over the bytes h5py reads.
    pack["jpeg_crc32"].push_back(io::detail::crc32_update(0, jpeg.data(), jpeg.size()));
    pack["jpeg_size"].push_back(jpeg.size());
    pack["labels"].push_back(ds.targets()[static_cast<size_t>(i)]);
  }
  expect["pack"] = pack;

  std::ofstream(dir / "expect.json") << expect.dump(1);
}
