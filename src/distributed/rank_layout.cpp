// RankLayout: the coordinates of each rank and its three groups (see the header for the order).
#include "dltrain/distributed/rank_layout.hpp"

#include <cstdio>
#include <sstream>

#include "dltrain/core/error.hpp"

namespace dltrain::distributed {

RankLayout::RankLayout(const RankLayoutOptions& o) {
  ProcessGroup& parent = o.parent ? *o.parent : default_group();
  size_ = parent.size();
  DLTRAIN_CHECK(o.pipeline >= 1 && o.tensor >= 1 && o.data >= 0,
                "RankLayout: pipeline = ", o.pipeline, ", data = ", o.data, ", tensor = ", o.tensor,
                ": pipeline and tensor must be >= 1 and data >= 0 (0: what is left)");
  p_ = o.pipeline;
  t_ = o.tensor;
  if (o.data == 0) {
    DLTRAIN_CHECK(size_ % (p_ * t_) == 0, "RankLayout: ", size_,
                  " ranks cannot be divided into pipeline = ", p_, " x tensor = ", t_,
                  " (that needs a multiple of ", p_ * t_,
                  " ranks); launch a multiple of it, or change the sizes");
    d_ = size_ / (p_ * t_);
  } else {
    d_ = o.data;
    DLTRAIN_CHECK(p_ * d_ * t_ == size_, "RankLayout: pipeline = ", p_, " x data = ", d_,
                  " x tensor = ", t_, " = ", p_ * d_ * t_, " ranks, but the group has ", size_,
                  "; launch ", p_ * d_ * t_, " ranks, or pass data = 0 to use what is left");
  }
  const int r = parent.rank();
  tensor_rank_ = r % t_;
  replica_ = (r / t_) % d_;
  stage_ = r / (t_ * d_);
  // Colours: the coordinates the members share; keys: the coordinate that ranks them.
  pipeline_ = parent.split(replica_ * t_ + tensor_rank_, stage_);
  data_ = parent.split(stage_ * t_ + tensor_rank_, replica_);
  tensor_ = parent.split(stage_ * d_ + replica_, tensor_rank_);
  if (o.print && r == 0) {
    std::printf("%s", str().c_str());
    std::fflush(stdout);
  }
}

int RankLayout::rank_of(int stage, int replica, int tensor_rank) const {
  DLTRAIN_CHECK(stage >= 0 && stage < p_ && replica >= 0 && replica < d_ && tensor_rank >= 0 &&
                    tensor_rank < t_,
                "RankLayout::rank_of(", stage, ", ", replica, ", ", tensor_rank,
                "): out of range for ", p_, " stages x ", d_, " replicas x ", t_, " tensor shards");
  return tensor_rank + t_ * (replica + d_ * stage);
}

std::string RankLayout::str() const {
  std::ostringstream os;
  os << "rank layout: " << size_ << (size_ == 1 ? " rank" : " ranks") << " = " << p_
     << " pipeline stage" << (p_ == 1 ? "" : "s") << " x " << d_ << " data-parallel replica"
     << (d_ == 1 ? "" : "s") << " x " << t_ << " tensor-parallel shard" << (t_ == 1 ? "" : "s")
     << "\n";
  for (int p = 0; p < p_; ++p) {
    os << "  stage " << p << ":";
    for (int d = 0; d < d_; ++d) {
      os << (d == 0 ? " " : " | ") << "replica " << d << " ranks";
      for (int t = 0; t < t_; ++t) os << " " << rank_of(p, d, t);
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace dltrain::distributed
