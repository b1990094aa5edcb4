// Writes the seed corpus of the libFuzzer targets: valid files of every format, made by the
// library's own writers (plus the PyTorch-made .pth and the format-1 checkpoint shipped in
// tests/reference/io). Usage: make_seeds OUT_DIR REFERENCE_DIR
// OUT_DIR/<target>/ gets the seeds of fuzz_<target>; OUT_DIR/pack/ a valid packed dataset
// (fuzz_packed's DLTRAIN_FUZZ_PACK=OUT_DIR/pack/p).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "dltrain/data/idx.hpp"
#include "dltrain/data/image.hpp"
#include "dltrain/data/packed.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/io/checkpoint.hpp"
#include "dltrain/io/safetensors.hpp"

namespace fs = std::filesystem;
using namespace dltrain;

namespace {
std::vector<uint8_t> slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void spit(const fs::path& p, const std::vector<uint8_t>& prefix, const std::vector<uint8_t>& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(prefix.data()),
          static_cast<std::streamsize>(prefix.size()));
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
data::Image pattern(int64_t w, int64_t h, int64_t c) {
  data::Image im(w, h, c);
  for (size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<uint8_t>(i * 13 + i / 7);
  return im;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_seeds OUT_DIR REFERENCE_DIR\n");
    return 2;
  }
  try {
    const fs::path out = argv[1], ref = argv[2];
    for (const char* t :
         {"idx", "jpeg", "safetensors", "pth", "checkpoint", "packed", "packed_restamp", "pack"})
      fs::create_directories(out / t);
    manual_seed(7);

    const Tensor img = randint(0, 255, {3, 4, 5}, TensorOptions(DType::u8));
    data::write_idx((out / "idx/u8.idx").string(), img);
    data::write_idx((out / "idx/f32.idx").string(), randn({2, 3}));
    data::write_idx((out / "idx/i32.idx").string(), randint(-9, 9, {7}, TensorOptions(DType::i32)));
    if (data::gzip_supported())
      data::write_idx((out / "idx/u8.idx.gz").string(), img, /*gzip=*/true);

    if (data::jpeg_supported()) {
      spit(out / "jpeg/rgb.jpg", {}, data::encode_jpeg(pattern(16, 12, 3), 85));
      spit(out / "jpeg/gray.jpg", {}, data::encode_jpeg(pattern(9, 17, 1), 70));
      spit(out / "jpeg/cmyk.jpg", {}, data::encode_jpeg(pattern(8, 8, 4), 90));
    }

    StateDict sd;
    sd.insert("w", randn({3, 2}));
    sd.insert("b", zeros({2}, TensorOptions(DType::f16)));
    sd.insert("n", randint(0, 5, {4}, TensorOptions(DType::i64)));
    io::save_safetensors((out / "safetensors/small.safetensors").string(), sd);
    if (fs::exists(ref / "io/tensors.safetensors"))
      fs::copy_file(ref / "io/tensors.safetensors", out / "safetensors/torch.safetensors",
                    fs::copy_options::overwrite_existing);

    for (const auto& e : fs::directory_iterator(ref / "io"))
      if (e.path().extension() == ".pth")
        fs::copy_file(e.path(), out / "pth" / e.path().filename(),
                      fs::copy_options::overwrite_existing);

    if (io::hdf5_supported()) {
      io::Checkpoint ck;
      ck.model = sd;
      ck.optimizer.insert("state.0.momentum", randn({3, 2}));
      ck.progress.epoch = 2;
      ck.progress.step = 17;
      ck.metadata["example"] = "fuzz";
      io::write_checkpoint((out / "checkpoint/small.h5").string(), ck);

      if (data::jpeg_supported()) {
        const fs::path folder = out / "pack/folder";
        for (const char* cls : {"a", "b"}) {
          fs::create_directories(folder / cls);
          spit(folder / cls / "0.jpg", {}, data::encode_jpeg(pattern(12, 10, 3), 80));
        }
        data::PackOptions po;
        po.max_side = 0;
        po.num_threads = 1;
        const std::string prefix = (out / "pack/p").string();
        data::pack_image_folder(folder.string(), prefix, po);
        spit(out / "packed/index.bin", {0}, slurp(data::packed_index_path(prefix)));
        spit(out / "packed/shard.bin", {1}, slurp(data::packed_shard_path(prefix, 0)));
        spit(out / "packed_restamp/index.bin", {}, slurp(data::packed_index_path(prefix)));
        fs::remove_all(folder);  // the pack is the seed; its source is not needed
      }
    }
    std::printf("make_seeds: corpus written to %s\n", out.string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_seeds: %s\n", e.what());
    return 1;
  }
}
