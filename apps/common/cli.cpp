// Flags on CLI11 and JSON reports on nlohmann/json (cli.hpp). CLI11 parses and formats --help;
// the values go through our own conversion because CLI11 2.1's integer conversion reads "010" as
// octal and lets "-1" wrap into an unsigned seed: here a number is decimal, whole numbers are all
// digits, and a value out of its range is an error naming the flag, never a silent change.
#include "apps/common/cli.hpp"

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <system_error>

#include "dltrain/core/error.hpp"

namespace dltrain::cli {

struct Flag::Spec {
  std::string name;  // as shown in messages: the longest of the names
  std::optional<double> min;
  bool positive = false;
  std::vector<std::string> choices;
  bool required = false;
  std::string value_name;
  CLI::Option* option = nullptr;
  // Converts and stores one value; throws std::string (the reason) when it is malformed.
  std::function<void(const std::string&)> assign;

  [[noreturn]] void reject(const std::string& value, const std::string& why) const {
    throw CLI::ValidationError(name, "'" + value + "' " + why);
  }
  void check_number(const std::string& text, double v) const {
    if (positive && !(v > 0)) reject(text, "must be positive");
    if (min && v < *min) {
      std::ostringstream m;
      m << "must be >= " << *min;
      reject(text, m.str());
    }
  }
  void check_choice(const std::string& v) const {
    if (choices.empty()) return;
    for (const std::string& c : choices)
      if (v == c) return;
    std::string all;
    for (const std::string& c : choices) all += (all.empty() ? "" : ", ") + c;
    reject(v, "is not one of " + all);
  }
};

namespace {

// The longest of "-o,--out" (what the messages name).
std::string display_name(const std::string& names) {
  std::string best, cur;
  std::istringstream in(names);
  while (std::getline(in, cur, ','))
    if (cur.size() > best.size()) best = cur;
  return best;
}

template <class T>
std::string to_text(T v) {
  if constexpr (std::is_same_v<T, double>) {
    std::ostringstream s;
    s << v;
    return s.str();
  } else {
    return std::to_string(v);
  }
}

// Strict decimal conversion of the whole text.
template <class T>
T parse_number(const Flag::Spec& spec, const std::string& text) {
  T v{};
  const char* b = text.data();
  const char* e = b + text.size();
  const auto [end, ec] = std::from_chars(b, e, v);
  if constexpr (std::is_integral_v<T>) {
    if (ec == std::errc::result_out_of_range)
      spec.reject(
          text, "is out of range (at most " + std::to_string(std::numeric_limits<T>::max()) + ")");
    if (ec != std::errc() || end != e || text.empty())
      spec.reject(text, std::is_unsigned_v<T> ? "is not a non-negative whole number"
                                              : "is not a whole number");
  } else {
    if (ec != std::errc() || end != e || text.empty()) spec.reject(text, "is not a number");
    if (!std::isfinite(v)) spec.reject(text, "is not a finite number");
  }
  spec.check_number(text, static_cast<double>(v));
  return v;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, ',')) out.push_back(item);
  if (!s.empty() && s.back() == ',') out.emplace_back();
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

// --help: one line per flag, "--name VALUE  meaning [default: D]", negatable switches as
// "--[no-]name", one blank line between groups.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_group(std::string group, bool is_positional,
                         std::vector<const CLI::Option*> opts) const override {
    std::string out = group + ":\n";
    for (const CLI::Option* o : opts) out += make_option(o, is_positional);
    return out;
  }
  std::string make_usage(const CLI::App* app, std::string name) const override {
    return CLI::Formatter::make_usage(app, std::move(name)) + "\n";
  }
  std::string make_option_name(const CLI::Option* opt, bool positional) const override {
    std::string n = CLI::Formatter::make_option_name(opt, positional);
    const size_t no = n.find(",--no-");
    if (no != std::string::npos) n = "--[no-]" + n.substr(no + 6);
    if (const size_t brace = n.find('{'); brace != std::string::npos) n.resize(brace);
    return n;
  }
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string out;
    if (opt->get_type_size() != 0 && !opt->get_type_name().empty())
      out += " " + opt->get_type_name();
    if (opt->get_required()) out += " (required)";
    return out;
  }
  std::string make_option_desc(const CLI::Option* opt) const override {
    std::string d = opt->get_description();
    if (!opt->get_default_str().empty()) d += " [default: " + opt->get_default_str() + "]";
    return d;
  }
};

}  // namespace

// ---- Flag --------------------------------------------------------------------------------------

Flag& Flag::min(double v) {
  spec_->min = v;
  return *this;
}
Flag& Flag::positive() {
  spec_->positive = true;
  return *this;
}
Flag& Flag::choices(std::vector<std::string> values) {
  std::string all;
  for (const std::string& c : values) all += (all.empty() ? "" : "|") + c;
  spec_->choices = std::move(values);
  if (spec_->option && spec_->value_name.empty()) spec_->option->type_name(all);
  return *this;
}
Flag& Flag::required() {
  spec_->required = true;
  if (spec_->option) spec_->option->required();
  return *this;
}
Flag& Flag::value_name(const std::string& name) {
  spec_->value_name = name;
  if (spec_->option) spec_->option->type_name(name);
  return *this;
}

// ---- Flags -------------------------------------------------------------------------------------

struct Flags::Impl {
  std::unique_ptr<CLI::App> owned;  // the top-level app
  CLI::App* app = nullptr;
  std::string program;
  std::string group = "Options";
  std::vector<std::unique_ptr<Flags>> subcommands;
};

Flags::Flags(std::string program, std::string description) : impl_(std::make_unique<Impl>()) {
  impl_->owned = std::make_unique<CLI::App>(std::move(description), program);
  impl_->app = impl_->owned.get();
  impl_->program = std::move(program);
  // A flag given twice takes its last value (scripts pass defaults, users override them).
  impl_->app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  auto fmt = std::make_shared<HelpFormatter>();
  fmt->column_width(34);
  impl_->app->formatter(fmt);
}

Flags::Flags(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Flags::~Flags() = default;

Flags& Flags::group(const std::string& name) {
  impl_->group = name;
  return *this;
}

Flag Flags::bind(const std::string& name, const std::string& help,
                 std::shared_ptr<Flag::Spec> spec) {
  spec->name = display_name(name);
  std::shared_ptr<Flag::Spec> s = spec;
  CLI::Option* o = impl_->app->add_option_function<std::string>(
      name, [s](const std::string& v) { s->assign(v); }, help);
  o->group(impl_->group);
  spec->option = o;
  return Flag(spec);
}

#define DLTRAIN_CLI_NUMBER(T, type_label)                                                     \
  Flag Flags::add(const std::string& name, T* value, const std::string& help) {               \
    auto spec = std::make_shared<Flag::Spec>();                                               \
    Flag::Spec* raw = spec.get();                                                             \
    spec->assign = [raw, value](const std::string& v) { *value = parse_number<T>(*raw, v); }; \
    Flag f = bind(name, help, spec);                                                          \
    spec->option->type_name(type_label)->default_str(to_text(*value));                        \
    return f;                                                                                 \
  }
DLTRAIN_CLI_NUMBER(double, "X")
DLTRAIN_CLI_NUMBER(int64_t, "N")
DLTRAIN_CLI_NUMBER(int, "N")
DLTRAIN_CLI_NUMBER(uint64_t, "N")
#undef DLTRAIN_CLI_NUMBER

Flag Flags::add(const std::string& name, std::string* value, const std::string& help) {
  auto spec = std::make_shared<Flag::Spec>();
  Flag::Spec* raw = spec.get();
  spec->assign = [raw, value](const std::string& v) {
    raw->check_choice(v);
    *value = v;
  };
  Flag f = bind(name, help, spec);
  spec->option->type_name("TEXT");
  if (!value->empty()) spec->option->default_str(*value);
  return f;
}

Flag Flags::add(const std::string& name, std::vector<int64_t>* value, const std::string& help) {
  auto spec = std::make_shared<Flag::Spec>();
  Flag::Spec* raw = spec.get();
  spec->assign = [raw, value](const std::string& v) {
    std::vector<int64_t> out;
    for (const std::string& item : split_commas(v)) {
      if (item.empty()) raw->reject(v, "has an empty item (a list is N,N,...)");
      out.push_back(parse_number<int64_t>(*raw, item));
    }
    if (out.empty()) raw->reject(v, "is an empty list");
    *value = std::move(out);
  };
  Flag f = bind(name, help, spec);
  std::vector<std::string> items;
  for (int64_t x : *value) items.push_back(std::to_string(x));
  spec->option->type_name("N,N,...")->default_str(join(items));
  return f;
}

Flag Flags::add(const std::string& name, std::vector<std::string>* value, const std::string& help) {
  auto spec = std::make_shared<Flag::Spec>();
  Flag::Spec* raw = spec.get();
  spec->assign = [raw, value](const std::string& v) {
    std::vector<std::string> out = split_commas(v);
    for (const std::string& item : out) {
      if (item.empty()) raw->reject(v, "has an empty item (a list is A,B,...)");
      raw->check_choice(item);
    }
    if (out.empty()) raw->reject(v, "is an empty list");
    *value = std::move(out);
  };
  Flag f = bind(name, help, spec);
  spec->option->type_name("A,B,...")->default_str(join(*value));
  return f;
}

Flag Flags::add_switch(const std::string& name, bool* value, const std::string& help,
                       bool negatable) {
  auto spec = std::make_shared<Flag::Spec>();
  spec->name = display_name(name);
  std::string names = name;
  if (negatable) names += ",!--no-" + spec->name.substr(2);
  CLI::Option* o = impl_->app->add_flag(names, *value, help);
  o->group(impl_->group);
  if (negatable) o->default_str(*value ? "on" : "off");
  spec->option = o;
  return Flag(spec);
}

Flags& Flags::subcommand(const std::string& name, const std::string& description) {
  auto impl = std::make_unique<Impl>();
  impl->app = impl_->app->add_subcommand(name, description);
  impl->app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  impl->program = impl_->program + " " + name;
  impl_->subcommands.push_back(std::unique_ptr<Flags>(new Flags(std::move(impl))));
  return *impl_->subcommands.back();
}

bool Flags::chosen() const { return impl_->app->parsed(); }

Flags& Flags::require_subcommand() {
  impl_->app->require_subcommand(1);
  return *this;
}

void Flags::parse(int argc, char** argv) {
  try {
    impl_->app->parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", help().c_str());
    std::exit(0);
  } catch (const CLI::CallForAllHelp&) {
    std::printf("%s", help().c_str());
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    // CLI11 checks required arguments before it reports the ones left over, so "--nope" alone
    // would read "OUT_DIR is required"; and it lists what is left over in no useful order. What
    // was not understood is named first, flags before words.
    const std::vector<std::string> extra = impl_->app->remaining(true);
    if (!extra.empty() && (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr ||
                           dynamic_cast<const CLI::RequiredError*>(&e) != nullptr))
      fail(describe_extras(extra));
    fail(e.what());
  }
}

std::string Flags::describe_extras(const std::vector<std::string>& extra) const {
  for (const std::string& a : extra)
    if (a.size() > 1 && a[0] == '-') {
      const std::string flag = a.substr(0, a.find('='));
      return "unknown flag " + flag + " (the flags are listed by --help)";
    }
  const CLI::App* app = impl_->app;
  std::string subs;
  for (const CLI::App* sub : app->get_subcommands([](const CLI::App*) { return true; }))
    subs += (subs.empty() ? "" : ", ") + sub->get_name();
  if (!subs.empty() && app->get_subcommands().empty())
    return "'" + extra.front() + "' is not a subcommand; pass one of " + subs;
  return "unexpected argument '" + extra.front() + "' (no more positional arguments are taken)";
}

bool Flags::given(const std::string& name) const {
  const CLI::Option* o = impl_->app->get_option_no_throw(name);
  return o != nullptr && o->count() > 0;
}

void Flags::fail(const std::string& message) const {
  std::fflush(stdout);
  std::fprintf(stderr, "%s: error: %s\nRun '%s --help' for the flags and their defaults.\n",
               impl_->program.c_str(), message.c_str(), impl_->program.c_str());
  std::exit(2);
}

std::string Flags::help() const { return impl_->app->help(); }
const std::string& Flags::program() const { return impl_->program; }

// ---- JSON reports ------------------------------------------------------------------------------

nlohmann::json number(double v) {
  if (!std::isfinite(v)) return nullptr;
  return v;
}

namespace {

void replace_walk(nlohmann::json& j, const std::string& pointer,
                  std::vector<std::pair<std::string, std::string>>& out) {
  if (j.is_number_float()) {
    const double v = j.get<double>();
    if (!std::isfinite(v)) {
      out.emplace_back(pointer.empty() ? "/" : pointer,
                       std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"));
      j = nullptr;
    }
  } else if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      std::string key = it.key();
      // RFC 6901 escaping: ~ -> ~0, / -> ~1.
      std::string esc;
      for (char c : key) esc += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
      replace_walk(it.value(), pointer + "/" + esc, out);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i)
      replace_walk(j[i], pointer + "/" + std::to_string(i), out);
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> replace_nonfinite(nlohmann::json& j) {
  std::vector<std::pair<std::string, std::string>> out;
  replace_walk(j, "", out);
  return out;
}

size_t write_json_report(const std::string& path, nlohmann::json report, const std::string& flag) {
  const auto bad = replace_nonfinite(report);
  if (!bad.empty() && report.is_object()) {
    nlohmann::json nf = nlohmann::json::object();
    std::string names;
    for (const auto& [pointer, what] : bad) {
      nf[pointer] = what;
      names += (names.empty() ? "" : ", ") + pointer + " (" + what + ")";
    }
    report["nonfinite"] = nf;
    report["warnings"].push_back(std::to_string(bad.size()) +
                                 " value(s) were not finite and are written as null: " + names);
  }
  std::ofstream out(path);
  DLTRAIN_CHECK(out.good(), "cannot write the ", flag, " file '", path,
                "': check that its folder exists and is writable, or pass another ", flag);
  out << report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  out.close();
  DLTRAIN_CHECK(!out.fail(), "writing the ", flag, " file '", path, "' failed (disk full?)");
  return bad.size();
}

}  // namespace dltrain::cli
