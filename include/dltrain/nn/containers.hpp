// Containers: Sequential (a chain of single-tensor modules), ModuleList and
// ModuleDict (registries the owner iterates itself). Children are named
// "0", "1", ... in Sequential/ModuleList (as PyTorch, so state-dict keys such
// as "downsample.1.running_mean" line up) and by key in ModuleDict.
//
// Modules with several inputs and outputs declare their own typed call: a forward with their
// own parameters (a GNN layer's `forward(x, edge_index, edge_attr)` returning a std::tuple), or,
// when the only parameter is one tensor (whose forward(const Tensor&) is the virtual returning
// Tensor), an operator()(const Tensor&) returning what they return (a VAE encoder's
// std::pair<Tensor, Tensor> of mu and logvar). Two containers keep those types: Chain<M...> (a
// Sequential checked at compile time: each module's result, spread when it is a std::tuple or
// std::pair, is the next one's arguments) and ModuleListOf<M> (a ModuleList whose elements are M).
// Both are plain Modules (children "0", "1", ..., printed as Sequential / ModuleList), so
// state_dict, to(), printing and parameters() see the same tree as with the untyped containers.
#pragma once

#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dltrain/nn/module.hpp"

namespace dltrain::nn {

/// Runs its children in order, each on the previous one's output.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);
  /// Appends a module named by its position; returns *this for chaining.
  Sequential& push_back(std::shared_ptr<Module> m);
  /// Appends a module under an explicit name.
  Sequential& push_back(const std::string& name, std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
  int64_t size() const { return static_cast<int64_t>(children_ref().size()); }
  /// The i-th module (negative counts from the end); throws when out of range.
  std::shared_ptr<Module> operator[](int64_t i) const;
};

/// A Sequential of `modules`, shared: std::make_shared<nn::Sequential>({a, b}) cannot compile
/// (a braced list does not pass through make_shared's forwarding), nn::sequential({a, b}) does.
std::shared_ptr<Sequential> sequential(std::initializer_list<std::shared_ptr<Module>> modules);

/// An indexable list of modules; forward is the owner's business.
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  ModuleList(std::initializer_list<std::shared_ptr<Module>> modules);
  ModuleList& push_back(std::shared_ptr<Module> m);
  int64_t size() const { return static_cast<int64_t>(children_ref().size()); }
  std::shared_ptr<Module> operator[](int64_t i) const;
  /// The modules in order.
  std::vector<std::shared_ptr<Module>> modules() const;
};

/// Modules by name, in insertion order.
class ModuleDict : public Module {
 public:
  ModuleDict() : Module("ModuleDict") {}
  ModuleDict& insert(const std::string& key, std::shared_ptr<Module> m);
  bool contains(const std::string& key) const;
  /// The module under `key`; throws naming the keys present when absent.
  std::shared_ptr<Module> operator[](const std::string& key) const { return child(key); }
  int64_t size() const { return static_cast<int64_t>(children_ref().size()); }
  std::vector<std::string> keys() const;
};

namespace detail {

template <class T>
struct is_tuple_like : std::false_type {};
template <class... A>
struct is_tuple_like<std::tuple<A...>> : std::true_type {};
template <class A, class B>
struct is_tuple_like<std::pair<A, B>> : std::true_type {};

template <class M, class... A>
concept callable_op = requires(M& m, A&&... a) {
  m(std::forward<A>(a)...);
};
template <class M, class... A>
concept callable_forward = requires(M& m, A&&... a) {
  m.forward(std::forward<A>(a)...);
};

/// How a Chain calls a module: operator() when it takes the arguments (Module's own
/// operator()(const Tensor&) is the virtual forward; a typed module may define its own), else
/// forward(...).
template <class M, class... A>
decltype(auto) call_module(M& m, A&&... a) {
  if constexpr (callable_op<M, A...>)
    return m(std::forward<A>(a)...);
  else
    return m.forward(std::forward<A>(a)...);
}

/// call_module with a std::tuple / std::pair spread into arguments.
template <class M, class V>
decltype(auto) call_with(M& m, V&& v) {
  if constexpr (is_tuple_like<std::remove_cvref_t<V>>::value)
    return std::apply(
        [&m](auto&&... a) -> decltype(auto) {
          return call_module(m, std::forward<decltype(a)>(a)...);
        },
        std::forward<V>(v));
  else
    return call_module(m, std::forward<V>(v));
}

// The result type of a chain, without instantiating any call (Invalid where a module cannot
// take its predecessor's result), so that Chain::forward(const Tensor&) can ask.
struct Invalid {};
template <class M, class... A>
auto call_result() {
  if constexpr (callable_op<M, A...>)
    return std::type_identity<decltype(std::declval<M&>()(std::declval<A>()...))>{};
  else if constexpr (callable_forward<M, A...>)
    return std::type_identity<decltype(std::declval<M&>().forward(std::declval<A>()...))>{};
  else
    return std::type_identity<Invalid>{};
}
template <class M, class V>
struct StepResult {
  using type = typename decltype(call_result<M, V>())::type;
};
template <class M, class... A>
struct StepResult<M, std::tuple<A...>> {
  using type = typename decltype(call_result<M, A...>())::type;
};
template <class M, class A, class B>
struct StepResult<M, std::pair<A, B>> {
  using type = typename decltype(call_result<M, A, B>())::type;
};
template <class V, class... Ms>
struct FoldResult {
  using type = V;
};
template <class V, class M, class... Rest>
struct FoldResult<V, M, Rest...> {
  using type =
      typename FoldResult<typename StepResult<M, std::remove_cvref_t<V>>::type, Rest...>::type;
};
template <class... Rest>
struct FoldResult<Invalid, Rest...> {
  using type = Invalid;
};
template <class M0, class... Rest>
struct OneTensorResult {
  using type =
      typename FoldResult<typename decltype(call_result<M0, const Tensor&>())::type, Rest...>::type;
};

[[noreturn]] void chain_not_one_tensor(const std::string& tree);

}  // namespace detail

/// A Sequential of typed modules: operator()(in...) runs the first module on in..., then each
/// next module on the previous result (spread when it is a std::tuple or std::pair), and returns
/// the last result with its type. A module is called with operator() when that accepts the
/// arguments, else with forward(...) (detail::call_module). A mismatch between one module's result
/// and the next one's forward is a compile error. forward(const Tensor&) (the Module interface that
/// Sequential, DDP and other untyped callers use) works when the chain maps one tensor to one
/// tensor and raises dltrain::Error otherwise.
template <class... Ms>
class Chain : public Module {
  static_assert(sizeof...(Ms) >= 1, "Chain needs at least one module");

 public:
  explicit Chain(std::shared_ptr<Ms>... modules)
      : Module("Sequential"), modules_(std::move(modules)...) {
    std::apply(
        [this](const auto&... m) { (add_child(std::to_string(children_ref().size()), m), ...); },
        modules_);
  }

  /// Runs the chain on `in` (any arguments the first module's forward takes).
  template <class... In>
  auto operator()(In&&... in) {
    return run<0>(detail::call_module(*std::get<0>(modules_), std::forward<In>(in)...));
  }

  Tensor forward(const Tensor& x) override {
    if constexpr (std::is_convertible_v<typename detail::OneTensorResult<Ms...>::type, Tensor>)
      return (*this)(x);
    else
      detail::chain_not_one_tensor(str());
  }

  /// The I-th module, typed.
  template <size_t I>
  const auto& get() const {
    return std::get<I>(modules_);
  }
  static constexpr size_t size() { return sizeof...(Ms); }

 private:
  // By value: each result is a temporary of the caller's full expression.
  template <size_t I, class V>
  auto run(V&& v) {
    if constexpr (I + 1 == sizeof...(Ms))
      return std::remove_cvref_t<V>(std::forward<V>(v));
    else
      return run<I + 1>(detail::call_with(*std::get<I + 1>(modules_), std::forward<V>(v)));
  }

  std::tuple<std::shared_ptr<Ms>...> modules_;
};

/// make_shared of a Chain: `auto vae = nn::chain(encoder, reparameterize, decoder);`.
template <class... Ms>
std::shared_ptr<Chain<Ms...>> chain(std::shared_ptr<Ms>... modules) {
  return std::make_shared<Chain<Ms...>>(std::move(modules)...);
}

/// A ModuleList whose elements are M (a GNN's message-passing layers, a U-Net's down blocks):
/// operator[] and modules() return shared_ptr<M>, so their typed forward can be called.
template <class M>
class ModuleListOf : public Module {
  static_assert(std::is_base_of_v<Module, M>, "ModuleListOf<M>: M must derive from nn::Module");

 public:
  ModuleListOf() : Module("ModuleList") {}
  ModuleListOf(std::initializer_list<std::shared_ptr<M>> modules) : ModuleListOf() {
    for (const auto& m : modules) push_back(m);
  }
  ModuleListOf& push_back(std::shared_ptr<M> m) {
    add_child(std::to_string(children_ref().size()), std::move(m));
    return *this;
  }
  int64_t size() const { return static_cast<int64_t>(children_ref().size()); }
  /// The i-th module (negative counts from the end); throws when out of range, or when
  /// replace_module put a module of another type there.
  std::shared_ptr<M> operator[](int64_t i) const {
    const int64_t n = size();
    DLTRAIN_CHECK(i >= -n && i < n, "ModuleListOf[", i, "]: index out of range for ", n,
                  " modules");
    const auto& c = children_ref()[static_cast<size_t>(i < 0 ? i + n : i)];
    auto m = std::dynamic_pointer_cast<M>(c.second);
    DLTRAIN_CHECK(m != nullptr, "ModuleListOf: element '", c.first, "' is a ",
                  c.second->type_name(), ", not the list's module type");
    return m;
  }
  /// The modules in order.
  std::vector<std::shared_ptr<M>> modules() const {
    std::vector<std::shared_ptr<M>> out;
    for (int64_t i = 0; i < size(); ++i) out.push_back((*this)[i]);
    return out;
  }
};

}  // namespace dltrain::nn
