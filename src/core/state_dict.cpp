// StateDict (dltrain/core/state_dict.hpp): the ordered name -> tensor map that modules,
// optimizers and schedulers save and load, with scalar entries and prefix views.
#include "dltrain/core/state_dict.hpp"

#include "dltrain/core/error.hpp"

namespace dltrain {

void StateDict::insert(const std::string& name, const Tensor& t) {
  DLTRAIN_CHECK(t.defined(), "StateDict::insert: tensor for '", name,
                "' is undefined; store only defined tensors");
  for (auto& item : items_) {
    if (item.first == name) {
      item.second = t;
      return;
    }
  }
  items_.emplace_back(name, t);
}

void StateDict::insert_scalar(const std::string& name, double value, bool integer) {
  insert(name, scalar_tensor(value, integer ? DType::i64 : DType::f64));
}

bool StateDict::contains(const std::string& name) const {
  for (const auto& item : items_) {
    if (item.first == name) return true;
  }
  return false;
}

const Tensor& StateDict::at(const std::string& name, const char* context) const {
  for (const auto& item : items_) {
    if (item.first == name) return item.second;
  }
  DLTRAIN_FAIL(context, ": missing key '", name, "' (the state holds ", items_.size(),
               " entries); was it saved by a different model or optimizer?");
}

double StateDict::scalar(const std::string& name, const char* context) const {
  const Tensor& t = at(name, context);
  DLTRAIN_CHECK(t.numel() == 1, context, ": entry '", name, "' should be a scalar but has shape ",
                shape_str(t.shape()));
  return t.item<double>();
}

bool StateDict::erase(const std::string& name) {
  for (auto it = items_.begin(); it != items_.end(); ++it) {
    if (it->first == name) {
      items_.erase(it);
      return true;
    }
  }
  return false;
}

std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> out;
  out.reserve(items_.size());
  for (const auto& item : items_) out.push_back(item.first);
  return out;
}

StateDict StateDict::sub(const std::string& prefix) const {
  StateDict out;
  for (const auto& item : items_) {
    if (item.first.compare(0, prefix.size(), prefix) == 0) {
      out.items_.emplace_back(item.first.substr(prefix.size()), item.second);
    }
  }
  return out;
}

void StateDict::merge(const StateDict& other, const std::string& prefix) {
  for (const auto& item : other.items_) insert(prefix + item.first, item.second);
}

}  // namespace dltrain
