// dltrain-convert: moves weights between PyTorch's torch.save files (.pth), safetensors and
// dltrain's HDF5 checkpoints, lists a file's tensors, and compares two files.
//
//   dltrain-convert list FILE
//   dltrain-convert convert IN OUT [--section model|optimizer|scheduler]
//   dltrain-convert compare A B [--rtol X] [--atol X] [--section model|optimizer|scheduler]
//
// Input formats are recognised by their content (io::detect_file_format), never by their
// name: a checkpoint named x.safetensors is read as a checkpoint, with a note saying so, and a
// file of no known kind is refused naming what it is. The output format is chosen by OUT's
// extension: .safetensors, or .h5/.hdf5 (a
// checkpoint holding the state dict as its model). Writing .pth is not supported: PyTorch
// reads safetensors (safetensors.torch.load_file) and dltrain checkpoints are HDF5.
// Exit status: 0 on success (compare: identical within tolerance), 1 on differences,
// 2 on usage errors or unreadable files.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "dltrain/dltrain.hpp"
#include "dltrain/io/file_format.hpp"
#include "examples/common/cli.hpp"

using namespace dltrain;

namespace {

using io::FileFormat;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The reader for `path`, from its content; a note on stderr when its extension claims
// another format.
FileFormat sniff(const std::string& path) {
  const FileFormat kind = io::detect_file_format(path);
  switch (kind) {
    case FileFormat::Checkpoint:
    case FileFormat::Hdf5:
    case FileFormat::TorchZip:
    case FileFormat::TorchLegacy:  // load_pth explains how to re-save it
    case FileFormat::Safetensors:
      break;
    case FileFormat::Other:
      DLTRAIN_FAIL("'", path, "' is ", io::describe_file_format(kind, path),
                   ", not weights dltrain-convert reads: a torch.save file (.pth), a safetensors "
                   "file or a dltrain checkpoint (.h5)");
  }
  const bool says_safetensors = ends_with(path, ".safetensors");
  const bool says_pth = ends_with(path, ".pth") || ends_with(path, ".pt");
  const bool says_h5 = ends_with(path, ".h5") || ends_with(path, ".hdf5");
  const bool is_h5 = kind == FileFormat::Checkpoint || kind == FileFormat::Hdf5;
  const bool is_pth = kind == FileFormat::TorchZip || kind == FileFormat::TorchLegacy;
  if ((says_safetensors && kind != FileFormat::Safetensors) || (says_pth && !is_pth) ||
      (says_h5 && !is_h5))
    std::fprintf(stderr, "dltrain-convert: note: '%s' is %s, not %s; reading it as what it is\n",
                 path.c_str(), io::describe_file_format(kind).c_str(),
                 says_safetensors ? "safetensors"
                 : says_pth       ? "a torch.save file"
                                  : "HDF5");
  return kind;
}

StateDict load_as(const std::string& path, FileFormat kind, const std::string& section) {
  switch (kind) {
    case FileFormat::TorchZip:
    case FileFormat::TorchLegacy:
      return io::load_pth(path);
    case FileFormat::Safetensors:
      return io::load_safetensors(path);
    case FileFormat::Other:  // sniff() refused it
      break;
    case FileFormat::Checkpoint:
    case FileFormat::Hdf5: {
      io::Checkpoint c = io::read_checkpoint(path);
      if (section == "optimizer") return c.optimizer;
      if (section == "scheduler") return c.scheduler;
      DLTRAIN_CHECK(section == "model", "--section must be model, optimizer or scheduler, got '",
                    section, "'");
      return c.model;
    }
  }
  return {};
}

StateDict load_any(const std::string& path, const std::string& section) {
  return load_as(path, sniff(path), section);
}

void print_table(const StateDict& sd, const char* title) {
  std::printf("%s: %lld tensors\n", title, static_cast<long long>(sd.size()));
  int64_t total = 0;
  for (const auto& [name, t] : sd) {
    std::printf("  %-56s %-10s %s\n", name.c_str(), dtype_name(t.dtype()),
                shape_str(t.shape()).c_str());
    total += t.numel();
  }
  std::printf("  total elements: %lld\n", static_cast<long long>(total));
}

int list(const std::string& path) {
  const FileFormat kind = sniff(path);
  if (kind == FileFormat::Checkpoint || kind == FileFormat::Hdf5) {
    io::Checkpoint c = io::read_checkpoint(path);
    std::printf(
        "dltrain checkpoint (format %lld, written by dltrain %s): epoch %lld, step %lld, "
        "batch %lld\n",
        static_cast<long long>(c.format_version), c.dltrain_version.c_str(),
        static_cast<long long>(c.progress.epoch), static_cast<long long>(c.progress.step),
        static_cast<long long>(c.progress.batch_in_epoch));
    for (const auto& [k, v] : c.metadata) std::printf("  metadata %s = %s\n", k.c_str(), v.c_str());
    print_table(c.model, "model");
    if (!c.optimizer.empty()) print_table(c.optimizer, "optimizer");
    if (!c.scheduler.empty()) print_table(c.scheduler, "scheduler");
    return 0;
  }
  print_table(load_as(path, kind, "model"),
              kind == FileFormat::Safetensors ? "safetensors" : "torch.save state dict");
  return 0;
}

int convert(const std::string& in, const std::string& out, const std::string& section) {
  StateDict sd = load_any(in, section);
  if (ends_with(out, ".safetensors")) {
    io::save_safetensors(out, sd,
                         {{"source", in}, {"written_by", std::string("dltrain ") + kVersion}});
  } else if (ends_with(out, ".h5") || ends_with(out, ".hdf5")) {
    io::Checkpoint c;
    c.model = sd;
    c.metadata = {{"source", in}};
    io::write_checkpoint(out, c);
  } else if (ends_with(out, ".pth") || ends_with(out, ".pt")) {
    DLTRAIN_FAIL("writing torch.save files is not supported; write '",
                 out.substr(0, out.rfind('.')),
                 ".safetensors' and load it in PyTorch with safetensors.torch.load_file");
  } else {
    DLTRAIN_FAIL("cannot tell the output format from '", out,
                 "'; use a .safetensors or .h5 extension");
  }
  std::printf("wrote %lld tensors to %s\n", static_cast<long long>(sd.size()), out.c_str());
  return 0;
}

int compare(const std::string& a_path, const std::string& b_path, const std::string& section,
            double rtol, double atol) {
  StateDict a = load_any(a_path, section), b = load_any(b_path, section);
  int problems = 0;
  for (const auto& [name, ta] : a) {
    if (!b.contains(name)) {
      std::printf("only in %s: %s\n", a_path.c_str(), name.c_str());
      ++problems;
      continue;
    }
    const Tensor& tb = b.at(name);
    if (ta.shape() != tb.shape() || ta.dtype() != tb.dtype()) {
      std::printf("%s: %s %s vs %s %s\n", name.c_str(), dtype_name(ta.dtype()),
                  shape_str(ta.shape()).c_str(), dtype_name(tb.dtype()),
                  shape_str(tb.shape()).c_str());
      ++problems;
      continue;
    }
    Tensor x = ta.to(DType::f64), y = tb.to(DType::f64);
    // NaN in the same places counts as equal.
    Tensor xn = ne(x, x), yn = ne(y, y);
    bool same_nan = allclose(xn.to(DType::f64), yn.to(DType::f64), 0, 0);
    Tensor xs = masked_fill(x, xn, 0.0), ys = masked_fill(y, yn, 0.0);
    if (!same_nan || !allclose(xs, ys, rtol, atol)) {
      double diff = ta.numel() ? max(abs(sub(xs, ys))).item<double>() : 0.0;
      std::printf("%s: values differ (max |a-b| = %g)\n", name.c_str(), diff);
      ++problems;
    }
  }
  for (const auto& [name, tb] : b) {
    if (!a.contains(name)) {
      std::printf("only in %s: %s\n", b_path.c_str(), name.c_str());
      ++problems;
    }
  }
  std::printf("%lld tensors compared: %s\n", static_cast<long long>(a.size()),
              problems ? "DIFFERENT" : "identical");
  return problems ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file, in, out, a, b;
  std::string section = "model";
  double rtol = 0.0, atol = 0.0;
  const std::vector<std::string> sections{"model", "optimizer", "scheduler"};
  cli::Flags f("dltrain-convert",
               "Moves weights between PyTorch's torch.save files (.pth, read only), safetensors "
               "and dltrain's HDF5 checkpoints (.h5), lists a file's tensors, compares two "
               "files. Input formats are recognised by content; the output's by its extension. "
               "Exit status: 0 on success, 1 on differences, 2 on usage errors or unreadable "
               "files.");
  f.require_subcommand();
  cli::Flags& list_cmd = f.subcommand("list", "list the tensors of FILE");
  list_cmd.add("FILE", &file, "a .pth, .safetensors or .h5 file").required();
  cli::Flags& convert_cmd = f.subcommand("convert", "convert IN to OUT (.safetensors or .h5)");
  convert_cmd.add("IN", &in, "the file to read").required();
  convert_cmd.add("OUT", &out, "the file to write (.safetensors, .h5 or .hdf5)").required();
  convert_cmd.add("--section", &section, "which state dict of a checkpoint").choices(sections);
  cli::Flags& compare_cmd = f.subcommand("compare", "compare the tensors of A and B");
  compare_cmd.add("A", &a, "first file").required();
  compare_cmd.add("B", &b, "second file").required();
  compare_cmd.add("--rtol", &rtol, "relative tolerance").min(0);
  compare_cmd.add("--atol", &atol, "absolute tolerance").min(0);
  compare_cmd.add("--section", &section, "which state dict of a checkpoint").choices(sections);
  f.parse(argc, argv);
  try {
    if (list_cmd.chosen()) return list(file);
    if (convert_cmd.chosen()) return convert(in, out, section);
    return compare(a, b, section, rtol, atol);
  } catch (const Error& e) {
    std::fprintf(stderr, "dltrain-convert: error: %s\n", e.what());
    return 2;
  }
}
