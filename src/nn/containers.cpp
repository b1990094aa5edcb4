// nn::Sequential and nn::ModuleList (dltrain/nn/containers.hpp): children registered by
// index or name, forward in order, indexing with negative positions.
#include "dltrain/nn/containers.hpp"

namespace dltrain::nn {

namespace {
std::shared_ptr<Module> at(const NamedModules& v, int64_t i, const char* who) {
  auto n = static_cast<int64_t>(v.size());
  DLTRAIN_CHECK(i >= -n && i < n, who, "[", i, "]: index out of range for ", n, " modules");
  return v[static_cast<size_t>(i < 0 ? i + n : i)].second;
}
}  // namespace

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) : Sequential() {
  for (const auto& m : modules) push_back(m);
}

std::shared_ptr<Sequential> sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  return std::make_shared<Sequential>(modules);
}

Sequential& Sequential::push_back(std::shared_ptr<Module> m) {
  return push_back(std::to_string(children_ref().size()), std::move(m));
}

Sequential& Sequential::push_back(const std::string& name, std::shared_ptr<Module> m) {
  add_child(name, std::move(m));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& c : children_ref()) y = (*c.second)(y);  // errors name the child
  return y;
}

std::shared_ptr<Module> Sequential::operator[](int64_t i) const {
  return at(children_ref(), i, "Sequential");
}

ModuleList::ModuleList(std::initializer_list<std::shared_ptr<Module>> modules) : ModuleList() {
  for (const auto& m : modules) push_back(m);
}

ModuleList& ModuleList::push_back(std::shared_ptr<Module> m) {
  add_child(std::to_string(children_ref().size()), std::move(m));
  return *this;
}

std::shared_ptr<Module> ModuleList::operator[](int64_t i) const {
  return at(children_ref(), i, "ModuleList");
}

std::vector<std::shared_ptr<Module>> ModuleList::modules() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& c : children_ref()) out.push_back(c.second);
  return out;
}

namespace detail {
void chain_not_one_tensor(const std::string& tree) {
  DLTRAIN_FAIL(
      "Chain::forward(const Tensor&): this chain does not map one tensor to one tensor, "
      "so it cannot run through the one-tensor Module interface (Sequential, DDP); call "
      "it with operator() for its typed result. The chain:\n",
      tree);
}
}  // namespace detail

ModuleDict& ModuleDict::insert(const std::string& key, std::shared_ptr<Module> m) {
  add_child(key, std::move(m));
  return *this;
}

bool ModuleDict::contains(const std::string& key) const {
  for (const auto& c : children_ref()) {
    if (c.first == key) return true;
  }
  return false;
}

std::vector<std::string> ModuleDict::keys() const {
  std::vector<std::string> out;
  for (const auto& c : children_ref()) out.push_back(c.first);
  return out;
}

}  // namespace dltrain::nn
