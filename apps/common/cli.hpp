// The command line and the JSON reports of every dltrain program (examples, tools, benchmarks):
// one flag parser on CLI11 and one report writer on nlohmann/json, in a small static library
// (dltrain_cli) that is not installed, so the library's own package depends on neither.
//
// Invariants the programs rely on: every flag is bound to a variable whose value at add() time is
// the default shown by --help; a value is converted strictly (a whole number is all digits, "2.5"
// or "abc" is refused, a count below its minimum is refused, never truncated or wrapped); every
// parse error prints "PROGRAM: error: ..." naming the flag and exits with status 2; --help prints
// every flag grouped as the course's script groups them (Group below) and exits with 0. A report
// is written with non-finite numbers as null and a "nonfinite" / "warnings" field naming them.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dltrain::cli {

/// The flag groups of --help, in the order of the course's script (dlojz.py): the run's
/// hyper-parameters, the large-batch and augmentation lessons' flags, its test mode, the
/// DataLoader, the device and precision, data parallelism, checkpoints and reports, the profiler.
/// Programs may use other names; these come first.
namespace group {
inline constexpr const char* kTraining = "Training (hyper-parameters)";
/// Day 2 of the course: optimizers and schedules for large global batches.
inline constexpr const char* kLargeBatch =
    "Large batches (optimizer, schedule, accumulation, weight averaging)";
/// Day 3: data augmentation.
inline constexpr const char* kAugment = "Data augmentation";
inline constexpr const char* kTest = "Test mode";
inline constexpr const char* kData = "Data and DataLoader";
inline constexpr const char* kDevice = "Device and precision";
inline constexpr const char* kDistributed = "Data parallelism";
inline constexpr const char* kCheckpoint = "Checkpoint and report";
inline constexpr const char* kProfiler = "Profiler";
inline constexpr const char* kBenchmark = "Benchmark";
}  // namespace group

class Flags;

/// One flag, as returned by Flags::add: constraints on its value, checked at parse time (a
/// violation is a parse error naming the flag, exit status 2).
class Flag {
 public:
  /// The value must be >= v (numbers, and each element of a list).
  Flag& min(double v);
  /// The value must be > 0.
  Flag& positive();
  /// The value must be one of `values` (strings).
  Flag& choices(std::vector<std::string> values);
  /// The flag must be given.
  Flag& required();
  /// The placeholder of the value in --help ("DIR", "FILE.json"); a default is chosen by type.
  Flag& value_name(const std::string& name);

  struct Spec;

 private:
  friend class Flags;
  explicit Flag(std::shared_ptr<Spec> s) : spec_(std::move(s)) {}
  std::shared_ptr<Spec> spec_;
};

/// A command line: flags (`--name VALUE`, `--name=VALUE`, switches `--name`) and positional
/// arguments (a name without dashes) bound to variables, grouped for --help.
class Flags {
 public:
  /// `program` is the name in messages; `description` the first paragraph of --help.
  Flags(std::string program, std::string description);
  ~Flags();
  Flags(const Flags&) = delete;
  Flags& operator=(const Flags&) = delete;

  /// Flags added after this call go to `name` in --help.
  Flags& group(const std::string& name);

  /// Binds `name` ("--epochs", "-o,--out", or "FILE" for a positional argument) to `*value`;
  /// its current value is the default shown in --help.
  Flag add(const std::string& name, std::string* value, const std::string& help);
  Flag add(const std::string& name, double* value, const std::string& help);
  Flag add(const std::string& name, int64_t* value, const std::string& help);
  Flag add(const std::string& name, int* value, const std::string& help);
  Flag add(const std::string& name, uint64_t* value, const std::string& help);
  /// A comma-separated list of whole numbers ("64,128,256").
  Flag add(const std::string& name, std::vector<int64_t>* value, const std::string& help);
  /// A comma-separated list of words ("forward,train").
  Flag add(const std::string& name, std::vector<std::string>* value, const std::string& help);
  /// A switch: `--name` sets *value to true. With `negatable`, `--no-name` sets it to false
  /// (the course's BooleanOptionalAction flags: --pin-memory / --no-pin-memory).
  Flag add_switch(const std::string& name, bool* value, const std::string& help,
                  bool negatable = false);

  /// A subcommand (`dltrain-convert list FILE`): flags added to the returned Flags belong to it.
  Flags& subcommand(const std::string& name, const std::string& description);
  /// After parse(): whether this subcommand was given.
  bool chosen() const;
  /// Requires exactly one subcommand.
  Flags& require_subcommand();

  /// Parses the command line into the bound variables. --help prints the help and exits with 0;
  /// an unknown flag, a missing or malformed value, or a value out of range prints the error
  /// naming the flag and exits with 2.
  void parse(int argc, char** argv);
  /// Whether `name` was given on the command line (after parse()).
  bool given(const std::string& name) const;
  /// Prints "PROGRAM: error: MESSAGE" and how to get help to stderr, exits with status 2. For
  /// errors found after parse() that concern flags: name the flag and the fix.
  [[noreturn]] void fail(const std::string& message) const;
  /// The help text.
  std::string help() const;
  const std::string& program() const;

 private:
  struct Impl;
  explicit Flags(std::unique_ptr<Impl> impl);
  // The error for arguments left over after parsing: the first unknown flag, else the first
  // word (a wrong subcommand, or one positional argument too many).
  std::string describe_extras(const std::vector<std::string>& extra) const;
  Flag bind(const std::string& name, const std::string& help, std::shared_ptr<Flag::Spec> spec);
  std::unique_ptr<Impl> impl_;
};

/// `v` as a JSON number, or null when it is NaN or infinite (write_json_report does this too,
/// and names the value).
nlohmann::json number(double v);

/// Writes `report` to `path` as indented JSON (rank 0's job; the caller decides who writes). A
/// NaN or infinite number becomes null, and the report gains "nonfinite" ({JSON pointer: "nan" |
/// "inf" | "-inf"}) and a "warnings" line naming them, so a diverged run still writes valid
/// JSON. Throws dltrain::Error naming `flag` and the path when the file cannot be written.
/// Returns the number of non-finite values.
size_t write_json_report(const std::string& path, nlohmann::json report,
                         const std::string& flag = "--json");

/// The same replacement as write_json_report, in place, without writing: the pointers of the
/// values replaced, each with "nan", "inf" or "-inf".
std::vector<std::pair<std::string, std::string>> replace_nonfinite(nlohmann::json& j);

}  // namespace dltrain::cli
