// File kinds by content (io::detect_file_format) and the loaders' messages for a file of
// another kind: each names what the file is and the reader to use, whatever its name says.
#include <catch2/catch.hpp>

#include <filesystem>

#include "dltrain/dltrain.hpp"
#include "dltrain/io/file_format.hpp"
#include "io/io_test_util.hpp"

using namespace dltrain;
using Catch::Contains;
using io::FileFormat;
using testing::kIoDir;

TEST_CASE("detect_file_format tells formats by content", "[io][format]") {
  testing::TempDir dir("file_format");
  REQUIRE(io::detect_file_format(kIoDir + "/tensors.pth") == FileFormat::TorchZip);
  REQUIRE(io::detect_file_format(kIoDir + "/legacy.pth") == FileFormat::TorchLegacy);
  REQUIRE(io::detect_file_format(kIoDir + "/tensors.safetensors") == FileFormat::Safetensors);
  REQUIRE(io::detect_file_format(kIoDir + "/checkpoint_format1.h5") == FileFormat::Hdf5);
  REQUIRE(io::detect_file_format(kIoDir + "/io_reference.txt") == FileFormat::Other);
  REQUIRE(io::describe_file_format(FileFormat::Other, kIoDir + "/io_reference.txt") ==
          "a text file");
  const std::string empty = dir.file("empty"), gz = dir.file("x.gz"), jpg = dir.file("x.jpg"),
                    bin = dir.file("x.bin");
  testing::write_bytes(empty, {});
  testing::write_bytes(gz, {0x1f, 0x8b, 8, 0, 0, 0});
  testing::write_bytes(jpg, {0xff, 0xd8, 0xff, 0xe0, 0, 16});
  testing::write_bytes(bin, {1, 2, 0xfe});
  for (const auto& [path, what] : std::vector<std::pair<std::string, std::string>>{
           {empty, "an empty file"},
           {gz, "a gzip file"},
           {jpg, "a JPEG image"},
           {bin, "an unrecognised file (first bytes 01 02 fe)"}}) {
    REQUIRE(io::detect_file_format(path) == FileFormat::Other);
    REQUIRE(io::describe_file_format(FileFormat::Other, path) == what);
  }
  // A safetensors-like start whose header length does not fit is not safetensors.
  testing::write_bytes(bin, {0xff, 0xff, 0, 0, 0, 0, 0, 0, '{', '}'});
  REQUIRE(io::detect_file_format(bin) == FileFormat::Other);
  REQUIRE_THROWS_WITH(io::detect_file_format(dir.file("missing")), Contains("does not exist"));
  if (io::hdf5_supported()) {
    io::Checkpoint c;
    c.model.insert("w", ones({2}));
    io::write_checkpoint(dir.file("ckpt.safetensors"), c);  // the name does not matter
    REQUIRE(io::detect_file_format(dir.file("ckpt.safetensors")) == FileFormat::Checkpoint);
  }
}

TEST_CASE("each loader names the kind of a file it does not read", "[io][format]") {
  testing::TempDir dir("file_format_loaders");
  // Names that lie, so that only the content can tell.
  const std::string st = dir.file("weights.pth"), pth = dir.file("weights.safetensors");
  std::filesystem::copy_file(kIoDir + "/tensors.safetensors", st);
  std::filesystem::copy_file(kIoDir + "/tensors.pth", pth);
  REQUIRE_THROWS_WITH(io::load_pth(st), Contains("this is a safetensors file, not a torch.save "
                                                 "file") &&
                                            Contains("io::load_safetensors"));
  REQUIRE_THROWS_WITH(io::load_safetensors(pth),
                      Contains("this is a torch.save file (ZIP), not a safetensors file") &&
                          Contains("io::load_pth"));
  const std::string old_ckpt = kIoDir + "/checkpoint_format1.h5";
  REQUIRE_THROWS_WITH(io::load_safetensors(old_ckpt), Contains("this is an HDF5 file") &&
                                                          Contains("not a safetensors file") &&
                                                          Contains("io::read_checkpoint"));
  REQUIRE_THROWS_WITH(io::load_pth(old_ckpt),
                      Contains("this is an HDF5 file") && Contains("not a torch.save file"));
  if (!io::hdf5_supported()) return;
  REQUIRE_THROWS_WITH(io::read_checkpoint(st), Contains("not a dltrain checkpoint: this is a "
                                                        "safetensors file") &&
                                                   Contains("io::load_safetensors"));
  REQUIRE_THROWS_WITH(io::read_checkpoint(pth),
                      Contains("this is a torch.save file (ZIP)") && Contains("io::load_pth"));
  io::Checkpoint c;
  c.model.insert("w", ones({2}));
  const std::string ck = dir.file("model.safetensors");
  io::write_checkpoint(ck, c);
  REQUIRE_THROWS_WITH(io::load_safetensors(ck),
                      Contains("this is a dltrain checkpoint (HDF5), not a safetensors file"));
  REQUIRE_THROWS_WITH(io::list_safetensors(ck), Contains("not a safetensors file"));
}
