// dltrain-convert: moves weights between PyTorch's torch.save files (.pth), safetensors and
// dltrain's HDF5 checkpoints, lists a file's tensors, and compares two files.
//
//   dltrain-convert list FILE
//   dltrain-convert convert IN OUT [--section SECTION]
//   dltrain-convert compare A B [--rtol X] [--atol X] [--section SECTION]
//   dltrain-convert restamp FILE [-o OUT] [--timeout SECONDS]
//   dltrain-convert export-onnx WEIGHTS OUT.onnx --model resnet50 [--image-size 224]
//                   [--batch 1] [--dynamic-batch] [--dynamic-image-size] [--section model]
//
// SECTION, which state dict of a checkpoint: model (the default), optimizer, scheduler, scaler,
// or extra/NAME for a further state (io::ExtraState: extra/ema, the examples' --ema), and
// extra/NAME/PREFIX for its entries under "PREFIX." with the prefix dropped (extra/ema/shadow:
// the moving average as a model's state dict, to convert or export-onnx).
//
// export-onnx: builds the named model of the ResNet family (resnet18 ... resnet152; the number
// of classes from fc.weight, the CIFAR stem when conv1 is 3x3), loads WEIGHTS into it (strict:
// every key must match) and writes it as ONNX with io::export_onnx (eval mode, opset 17), for
// users who deploy with ONNX Runtime or TensorRT without writing C++. --dynamic-image-size makes
// the height and width symbolic ("height", "width"): the ResNets end in a global average pool,
// so the file takes any image size (the export traces a second time at 3x and 4x the size).
//
// restamp: a checkpoint without dltrain's integrity header (written by dltrain 0.1.0, or an
// HDF5 file from another program) is refused by io::read_checkpoint, because HDF5 1.10 can
// crash on its damaged metadata. restamp reads it in a child process (this program again,
// started with posix_spawn: no fork of a process that may hold threads or MPI), which writes
// it back with the header; a crash or hang there becomes an error here, naming the file, and
// nothing is written. In place, the original is kept as FILE.unstamped.
//
// Input formats are recognised by their content (io::detect_file_format), never by their
// name: a checkpoint named x.safetensors is read as a checkpoint, with a note saying so, and a
// file of no known kind is refused naming what it is. The output format is chosen by OUT's
// extension: .safetensors, or .h5/.hdf5 (a
// checkpoint holding the state dict as its model). Writing .pth is not supported: PyTorch
// reads safetensors (safetensors.torch.load_file) and dltrain checkpoints are HDF5.
// Exit status: 0 on success (compare: identical within tolerance), 1 on differences,
// 2 on usage errors or unreadable files.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/common/cli.hpp"
#include "dltrain/dltrain.hpp"
#include "dltrain/io/file_format.hpp"
#include "dltrain/io/onnx.hpp"
#include "src/io/checkpoint_header.hpp"

extern char** environ;

// gcc defines __SANITIZE_ADDRESS__; clang 14 only answers __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define DLTRAIN_CONVERT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DLTRAIN_CONVERT_ASAN 1
#endif
#endif

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

// --section extra/NAME[/PREFIX] of checkpoint `c` (see the file comment).
StateDict extra_section(const io::Checkpoint& c, const std::string& section,
                        const std::string& path) {
  const std::string rest = section.substr(6);
  const size_t slash = rest.find('/');
  const std::string name = rest.substr(0, slash);
  std::string held;
  for (const auto& [k, v] : c.extra) held += (held.empty() ? "" : ", ") + ("extra/" + k);
  DLTRAIN_CHECK(c.extra.count(name), "'", path, "' holds no extra state '", name, "' (",
                held.empty() ? std::string("it holds none") : "it holds " + held, ")");
  const StateDict& sd = c.extra.at(name);
  if (slash == std::string::npos) return sd;
  const std::string prefix = rest.substr(slash + 1) + ".";
  StateDict out;
  for (const auto& [k, t] : sd)
    if (k.rfind(prefix, 0) == 0) out.insert(k.substr(prefix.size()), t);
  DLTRAIN_CHECK(!out.empty(), "'", path, "': extra state '", name, "' has no entries under '",
                prefix, "'");
  return out;
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
      if (section == "scaler") return c.scaler;
      if (section.rfind("extra/", 0) == 0) return extra_section(c, section, path);
      DLTRAIN_CHECK(section == "model",
                    "--section must be model, optimizer, scheduler, scaler or extra/NAME, got '",
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
    if (!c.scaler.empty()) print_table(c.scaler, "scaler");
    for (const auto& [name, sd] : c.extra) print_table(sd, ("extra/" + name).c_str());
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

// The hidden first argument that makes this program restamp's child.
constexpr const char* kRestampChild = "__restamp-child";

// The child of restamp: reads IN unverified and writes it to OUT with the header. Its exit
// status: 0 written, 2 dltrain::Error (message on stderr), 3 another exception.
int restamp_child(const std::string& in, const std::string& out) {
#if !defined(DLTRAIN_CONVERT_ASAN)
  // A corrupt size that slipped past the reader's checks must not allocate its way into swap
  // (ASan reserves more address space than this, so not under it).
  const rlim_t cap =
      std::max<rlim_t>(rlim_t{8} << 30, static_cast<rlim_t>(std::filesystem::file_size(in) * 16));
  rlimit lim{cap, cap};
  ::setrlimit(RLIMIT_AS, &lim);
#endif
  try {
    const io::Checkpoint c = io::detail::read_unverified_checkpoint(in);
    io::write_checkpoint(out, c);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 3;
  }
}

// Runs restamp's child on `in` -> `tmp`, with at most `timeout_s` seconds. Throws
// dltrain::Error naming `in` when the child fails, crashes or hangs (then killed).
void run_restamp_child(const std::string& in, const std::string& tmp, double timeout_s) {
  int fds[2];
  DLTRAIN_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "restamp: cannot make a pipe (", std::strerror(errno),
                ")");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);  // clears O_CLOEXEC
  std::string arg0 = "dltrain-convert", arg1 = kRestampChild, arg2 = in, arg3 = tmp;
  char* child_argv[] = {arg0.data(), arg1.data(), arg2.data(), arg3.data(), nullptr};
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, child_argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    DLTRAIN_FAIL("restamp: cannot start the child process that checks '", in, "' (",
                 std::strerror(rc), ")");
  }
  // The child's messages, until it closes its end or the time is up.
  using Clock = std::chrono::steady_clock;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  std::string messages;
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // closed: the child ended
    if (messages.size() < (64 << 10)) messages.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  while (!messages.empty() && messages.back() == '\n') messages.pop_back();
  std::error_code ec;
  const bool wrote = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!wrote) {
    // The child's write_checkpoint writes TMP.tmp-<its pid> and renames it: a child killed
    // while writing leaves that behind.
    std::filesystem::remove(tmp, ec);
    std::filesystem::remove(tmp + ".tmp-" + std::to_string(pid), ec);
  }
  DLTRAIN_CHECK(!timed_out, "restamp: reading '", in, "' took longer than ", timeout_s,
                " s in the checking process, which was stopped; the file is probably damaged "
                "(HDF5 can loop on damaged metadata): use an older checkpoint ('",
                in, ".1', ...) or a good copy, or give more time with --timeout");
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    DLTRAIN_FAIL("restamp: '", in, "' is damaged: reading it crashed the checking process (signal ",
                 sig, ", ", ::strsignal(sig),
                 ": HDF5 fails this way on damaged metadata); nothing was written and the file "
                 "is unchanged; use an older checkpoint ('",
                 in, ".1', ...) or a good copy");
  }
  DLTRAIN_CHECK(
      wrote, "restamp: '", in, "' cannot be read: ",
      messages.empty() ? "the checking process failed without a message" : messages.c_str(),
      "; nothing was written and the file is unchanged");
}

int restamp(const std::string& file, const std::string& out_arg, double timeout_s) {
  const FileFormat kind = io::detect_file_format(file);
  const std::string out = out_arg.empty() ? file : out_arg;
  std::error_code ec;
  const bool in_place = out == file || std::filesystem::equivalent(out, file, ec);
  if (kind == FileFormat::Checkpoint) {
    const io::Checkpoint c = io::read_checkpoint(file);  // every byte checked against its CRC
    if (!in_place) io::write_checkpoint(out, c);
    std::printf("'%s' already has dltrain's integrity header and reads (%lld model tensors)%s\n",
                file.c_str(), static_cast<long long>(c.model.size()),
                in_place ? "; nothing to do" : ("; copied to '" + out + "'").c_str());
    return 0;
  }
  DLTRAIN_CHECK(kind == FileFormat::Hdf5, "restamp: '", file, "' is ",
                io::describe_file_format(kind, file),
                ", not an HDF5 checkpoint without dltrain's header (what restamp is for)");
  const std::string kept = file + ".unstamped";
  DLTRAIN_CHECK(!in_place || !std::filesystem::exists(kept), "restamp: '", kept,
                "' exists already (an earlier restamp keeps the original there); move it "
                "away, or write elsewhere with -o OUT");
  const std::string tmp = out + ".restamp-" + std::to_string(::getpid());
  run_restamp_child(file, tmp, timeout_s);
  // The child's output is read here through its CRC, as any checkpoint.
  io::Checkpoint c;
  try {
    c = io::read_checkpoint(tmp);
  } catch (const Error&) {
    std::filesystem::remove(tmp, ec);
    throw;
  }
  if (in_place) {
    std::filesystem::rename(file, kept, ec);
    if (ec) std::filesystem::remove(tmp);
    DLTRAIN_CHECK(!ec, "restamp: cannot rename '", file, "' to '", kept, "' (", ec.message(),
                  "); nothing was changed");
  }
  std::filesystem::rename(tmp, out, ec);
  DLTRAIN_CHECK(!ec, "restamp: cannot rename '", tmp, "' to '", out, "' (", ec.message(), ")",
                in_place ? "; the original is in '" + kept + "'" : std::string());
  std::printf(
      "'%s': read in a separate process and written%s with dltrain's integrity header: %lld "
      "model, %lld optimizer, %lld scheduler tensors, step %lld%s%s%s\n"
      "note: the original had no CRC, so its values could not be checked; if in doubt, "
      "compare them with a copy you trust (dltrain-convert compare)\n",
      file.c_str(), in_place ? "" : (" to '" + out + "'").c_str(),
      static_cast<long long>(c.model.size()), static_cast<long long>(c.optimizer.size()),
      static_cast<long long>(c.scheduler.size()), static_cast<long long>(c.progress.step),
      in_place ? "; the original is kept as '" : "", in_place ? kept.c_str() : "",
      in_place ? "'" : "");
  return 0;
}

int export_onnx_cmd(const std::string& in, const std::string& out, const std::string& model_name,
                    const std::string& section, int64_t image_size, int64_t batch, bool dynamic,
                    bool dynamic_size) {
  const StateDict sd = load_any(in, section);
  DLTRAIN_CHECK(sd.contains("fc.weight") && sd.contains("conv1.weight"), "export-onnx: '", in,
                "' holds no fc.weight or conv1.weight, so it is not the state dict of a ResNet "
                "(torchvision's names); list its tensors with dltrain-convert list");
  models::ResNetOptions o;
  o.num_classes = sd.at("fc.weight").size(0);
  o.cifar_stem = sd.at("conv1.weight").dim() == 4 && sd.at("conv1.weight").size(2) == 3;
  auto model = models::resnet(model_name, o);
  model->load_state_dict(sd);
  io::OnnxExportOptions eo{.dynamic_batch = dynamic};
  if (dynamic_size) eo.dynamic_axes = {{"input", {{2, "height"}, {3, "width"}}}};
  io::export_onnx(*model, {zeros({batch, 3, image_size, image_size})}, out, eo);
  const std::string hw = dynamic_size
                             ? std::string("height, width")
                             : std::to_string(image_size) + ", " + std::to_string(image_size);
  std::printf("'%s': %s (%lld classes%s) from '%s', input [%s, 3, %s], opset 17\n", out.c_str(),
              model_name.c_str(), static_cast<long long>(o.num_classes),
              o.cifar_stem ? ", CIFAR stem" : "", in.c_str(),
              dynamic ? "batch" : std::to_string(batch).c_str(), hw.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], kRestampChild) == 0) return restamp_child(argv[2], argv[3]);
  std::string file, in, out, a, b;
  std::string section = "model";
  double rtol = 0.0, atol = 0.0;
  const char* section_help =
      "which state dict of a checkpoint: model, optimizer, scheduler, scaler, extra/NAME, "
      "extra/NAME/PREFIX (extra/ema/shadow: --ema's averaged weights)";
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
  convert_cmd.add("--section", &section, section_help).value_name("SECTION");
  cli::Flags& compare_cmd = f.subcommand("compare", "compare the tensors of A and B");
  compare_cmd.add("A", &a, "first file").required();
  compare_cmd.add("B", &b, "second file").required();
  compare_cmd.add("--rtol", &rtol, "relative tolerance").min(0);
  compare_cmd.add("--atol", &atol, "absolute tolerance").min(0);
  compare_cmd.add("--section", &section, section_help).value_name("SECTION");
  std::string restamp_out;
  double timeout_s = 600;
  cli::Flags& restamp_cmd =
      f.subcommand("restamp",
                   "check a checkpoint without dltrain's integrity header (dltrain 0.1.0's, or "
                   "HDF5 from another program) in a separate process and write it back with the "
                   "header; in place, the original is kept as FILE.unstamped");
  restamp_cmd.add("FILE", &file, "the checkpoint to check and stamp").required();
  restamp_cmd.add("-o,--output", &restamp_out, "write the stamped copy here instead of in place");
  restamp_cmd.add("--timeout", &timeout_s, "seconds the check may take before it is stopped")
      .min(1);
  std::string model_name;
  int64_t image_size = 224, batch = 1;
  bool dynamic = false, dynamic_size = false;
  cli::Flags& onnx_cmd = f.subcommand(
      "export-onnx",
      "write a ResNet's weights as an ONNX model (eval mode, opset 17) for ONNX Runtime or "
      "TensorRT");
  onnx_cmd.add("WEIGHTS", &in, "the weights (.pth, .safetensors or .h5)").required();
  onnx_cmd.add("OUT", &out, "the ONNX file to write").required();
  onnx_cmd.add("--model", &model_name, "the architecture")
      .choices({"resnet18", "resnet34", "resnet50", "resnet101", "resnet152"})
      .required();
  onnx_cmd.add("--image-size", &image_size, "height and width of the input images").min(1);
  onnx_cmd.add("--batch", &batch, "the batch size of the exported input").min(1);
  onnx_cmd.add_switch("--dynamic-batch", &dynamic, "make the batch dim symbolic ('batch')");
  onnx_cmd.add_switch("--dynamic-image-size", &dynamic_size,
                      "make the height and width symbolic ('height', 'width'): any image size");
  onnx_cmd.add("--section", &section, section_help).value_name("SECTION");
  f.parse(argc, argv);
  try {
    if (list_cmd.chosen()) return list(file);
    if (convert_cmd.chosen()) return convert(in, out, section);
    if (restamp_cmd.chosen()) return restamp(file, restamp_out, timeout_s);
    if (onnx_cmd.chosen())
      return export_onnx_cmd(in, out, model_name, section, image_size, batch, dynamic,
                             dynamic_size);
    return compare(a, b, section, rtol, atol);
  } catch (const Error& e) {
    std::fprintf(stderr, "dltrain-convert: error: %s\n", e.what());
    return 2;
  }
}
