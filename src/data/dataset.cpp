// Dataset's default batching and TensorDataset's gather.
//
// The gather copies whole rows (the bytes of one sample, contiguous because the
// dataset keeps its tensors contiguous) with memcpy, split over the CPU pool: it
// is dtype-agnostic and bandwidth-bound, which is all a batch of samples needs.
#include "dltrain/data/dataset.hpp"

#include <algorithm>
#include <cstring>

#include "dltrain/autograd/node.hpp"
#include "dltrain/core/error.hpp"
#include "dltrain/core/parallel.hpp"
#include "dltrain/ops/indexing.hpp"
#include "dltrain/ops/shape.hpp"

namespace dltrain::data {

const Tensor& Batch::field(const std::string& name) const {
  for (const auto& [n, t] : fields)
    if (n == name) return t;
  std::string have;
  for (const auto& f : fields) have += (have.empty() ? "" : ", ") + f.first;
  DLTRAIN_FAIL("Batch: no field '", name, "'; the batch has ",
               have.empty() ? std::string("no fields") : "the fields " + have,
               " (a dataset's get_batch sets them, e.g. GraphDataset)");
}

bool Batch::has_field(const std::string& name) const {
  for (const auto& f : fields)
    if (f.first == name) return true;
  return false;
}

Batch& Batch::set_field(const std::string& name, Tensor t) {
  for (auto& f : fields)
    if (f.first == name) {
      f.second = std::move(t);
      return *this;
    }
  fields.emplace_back(name, std::move(t));
  return *this;
}

Batch Dataset::get_batch(const std::vector<int64_t>& indices) const {
  DLTRAIN_CHECK(!indices.empty(), "Dataset::get_batch: the index list is empty");
  std::vector<Tensor> xs, ys;
  xs.reserve(indices.size());
  ys.reserve(indices.size());
  bool any_target = false;
  for (int64_t i : indices) {
    Example e = get(i);
    any_target = any_target || e.target.defined();
    xs.push_back(std::move(e.data));
    ys.push_back(std::move(e.target));
  }
  autograd::NoGradGuard no_grad;
  Batch b;
  b.data = stack(xs);
  if (any_target) {
    for (size_t k = 0; k < ys.size(); ++k)
      DLTRAIN_CHECK(ys[k].defined(), "Dataset::get_batch: sample ", indices[k],
                    " has no target but others in the batch do");
    b.target = stack(ys);
  }
  return b;
}

Tensor gather_rows(const Tensor& t, const std::vector<int64_t>& indices, const char* what) {
  DLTRAIN_CHECK(t.dim() >= 1, what, ": cannot gather rows of a 0-d tensor");
  const int64_t n = t.size(0);
  for (int64_t i : indices)
    DLTRAIN_CHECK(i >= 0 && i < n, what, ": index ", i, " is out of range for a dataset of ", n,
                  " samples (valid: 0 .. ", n - 1, ")");
  const int64_t count = static_cast<int64_t>(indices.size());
  if (!t.device().is_cpu()) {
    autograd::NoGradGuard no_grad;
    return index_select(t, 0, from_vector(indices).to(t.device()));
  }
  const Tensor src = t.contiguous();
  Shape shape = src.shape();
  shape[0] = count;
  Tensor out = empty(shape, TensorOptions(src.dtype()));
  if (count == 0 || out.numel() == 0) return out;
  const size_t row_bytes = static_cast<size_t>(src.numel() / n) * src.element_size();
  const auto* in = static_cast<const unsigned char*>(src.data_ptr());
  auto* dst = static_cast<unsigned char*>(out.data_ptr());
  // About 64 KiB per chunk: small batches stay on the calling thread.
  const int64_t grain = std::max<int64_t>(1, static_cast<int64_t>((size_t{1} << 16) / row_bytes));
  parallel_for(0, count, grain, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k)
      std::memcpy(dst + static_cast<size_t>(k) * row_bytes,
                  in + static_cast<size_t>(indices[static_cast<size_t>(k)]) * row_bytes, row_bytes);
  });
  return out;
}

namespace {
Tensor prepare(const Tensor& t, const char* name) {
  DLTRAIN_CHECK(t.defined(), "TensorDataset: ", name, " is undefined");
  DLTRAIN_CHECK(t.dim() >= 1, "TensorDataset: ", name,
                " must have a leading sample dimension but is 0-d; use .unsqueeze(0)");
  return t.detach().contiguous();
}
}  // namespace

TensorDataset::TensorDataset(Tensor data) : data_(prepare(data, "data")), size_(data_.size(0)) {}

TensorDataset::TensorDataset(Tensor data, Tensor targets) : TensorDataset(std::move(data)) {
  targets_ = prepare(targets, "targets");
  DLTRAIN_CHECK(targets_.size(0) == size_, "TensorDataset: data of shape ",
                shape_str(data_.shape()), " and targets of shape ", shape_str(targets_.shape()),
                " must have the same first dimension (number of samples)");
}

Example TensorDataset::get(int64_t index) const {
  DLTRAIN_CHECK(index >= 0 && index < size_, "TensorDataset::get: index ", index,
                " is out of range for a dataset of ", size_, " samples");
  Example e;
  e.data = data_.select(0, index);
  if (targets_.defined()) e.target = targets_.select(0, index);
  return e;
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  DLTRAIN_CHECK(!indices.empty(), "TensorDataset::get_batch: the index list is empty");
  Batch b;
  b.data = gather_rows(data_, indices, "TensorDataset::get_batch");
  if (targets_.defined()) b.target = gather_rows(targets_, indices, "TensorDataset::get_batch");
  return b;
}

}  // namespace dltrain::data
