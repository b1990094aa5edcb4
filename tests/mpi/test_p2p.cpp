// Point-to-point (send/recv) and sub-groups (split, new_group, RankLayout) of the MPI group, on
// 2, 3 and 4 ranks: values computed independently on each rank, so a message delivered to the
// wrong rank, under the wrong tag or out of order shows as a wrong value.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dltrain/dltrain.hpp"

using namespace dltrain;
using namespace dltrain::distributed;

namespace {

// What rank `from` sends with `tag`: small integers, exact in every dtype (bool alternating).
Tensor payload(int from, int tag, int64_t n, DType dt) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = from * 13 + tag * 5 + i;
    v.push_back(dt == DType::b8 ? static_cast<double>(k % 2) : static_cast<double>(k % 97));
  }
  return from_vector(v, {n}, TensorOptions(dt));
}

const DType kAll[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                      DType::i32, DType::i64, DType::u8,  DType::b8};

bool equal(const Tensor& a, const Tensor& b) {
  return a.to(DType::f64).to_vector<double>() == b.to(DType::f64).to_vector<double>();
}

}  // namespace

TEST_CASE("send/recv: a ring in every dtype, recv posted before or after the send", "[mpi][p2p]") {
  ProcessGroup& g = default_group();
  const int next = (g.rank() + 1) % g.size(), prev = (g.rank() + g.size() - 1) % g.size();
  for (DType dt : kAll) {
    for (bool recv_first : {true, false}) {
      INFO("dtype " << dtype_name(dt) << (recv_first ? ", recv first" : ", send first"));
      const int64_t n = 1001;
      Tensor out = payload(g.rank(), 7, n, dt), in = zeros({n}, TensorOptions(dt));
      Work r, s;
      if (recv_first) {
        r = g.recv(in, prev, 7);
        s = g.send(out, next, 7);
      } else {
        s = g.send(out, next, 7);
        r = g.recv(in, prev, 7);
      }
      r.wait();
      s.wait();
      CHECK(r.is_completed());
      CHECK(equal(in, payload(prev, 7, n, dt)));
    }
  }
}

TEST_CASE("send/recv: tags are not mixed up, and one tag keeps its order", "[mpi][p2p]") {
  ProcessGroup& g = default_group();
  if (g.rank() == 0) {
    // Tags 5, 3, 5 sent in this order; rank 1 receives tag 3 first.
    std::vector<Work> ws;
    std::vector<Tensor> keep = {payload(0, 5, 100, DType::f64), payload(0, 3, 100, DType::f64),
                                payload(0, 50, 100, DType::f64)};
    ws.push_back(g.send(keep[0], 1, 5));
    ws.push_back(g.send(keep[1], 1, 3));
    ws.push_back(g.send(keep[2], 1, 5));
    for (auto& w : ws) w.wait();
  } else if (g.rank() == 1) {
    Tensor a = zeros({100}, DType::f64), b = zeros({100}, DType::f64), c = zeros({100}, DType::f64);
    g.recv(b, 0, 3).wait();  // waits past the first tag-5 message
    Work wa = g.recv(a, 0, 5), wc = g.recv(c, 0, 5);
    wc.wait();
    wa.wait();
    CHECK(equal(b, payload(0, 3, 100, DType::f64)));
    CHECK(equal(a, payload(0, 5, 100, DType::f64)));   // first tag-5 message first
    CHECK(equal(c, payload(0, 50, 100, DType::f64)));  // then the second
  }
  g.barrier().wait();
}

TEST_CASE("send/recv: both ranks send 16 MiB to each other before receiving", "[mpi][p2p]") {
  // Far above MPI's eager limit: blocking sends on one thread would deadlock here.
  ProcessGroup& g = default_group();
  if (g.rank() > 1) return;
  const int peer = 1 - g.rank();
  const int64_t n = 2 << 20;  // f64: 16 MiB
  Tensor out = full({n}, 10.0 + g.rank(), DType::f64), in = zeros({n}, DType::f64);
  Work s = g.send(out, peer, 1);
  Work r = g.recv(in, peer, 1);
  s.wait();
  r.wait();
  CHECK(in.to_vector<double>()[static_cast<size_t>(n - 1)] == 10.0 + peer);
  CHECK(min(in).item<double>() == 10.0 + peer);
}

TEST_CASE("send/recv: channels-last tensors travel as laid out", "[mpi][p2p]") {
  ProcessGroup& g = default_group();
  if (g.rank() > 1) return;
  Tensor x = arange(120.0, TensorOptions(DType::f32))
                 .reshape({2, 3, 4, 5})
                 .contiguous(MemoryFormat::ChannelsLast);
  if (g.rank() == 0) {
    g.send(x, 1, 0).wait();
  } else {
    Tensor y = empty({2, 3, 4, 5}, MemoryFormat::ChannelsLast);
    g.recv(y, 0, 0).wait();
    CHECK(equal(y, x));
  }
}

TEST_CASE("send/recv: argument errors name the fix, a size mismatch fails the recv", "[mpi][p2p]") {
  ProcessGroup& g = default_group();
  CHECK_THROWS_WITH(g.send(zeros({4}), g.size(), 0),
                    Catch::Contains("is not a rank of this mpi group"));
  CHECK_THROWS_WITH(g.recv(zeros({4}), -1, 0), Catch::Contains("is not a rank"));
  CHECK_THROWS_WITH(g.send(zeros({4}), g.rank(), 0), Catch::Contains("is this rank itself"));
  CHECK_THROWS_WITH(g.send(zeros({4, 8}).narrow(1, 0, 4), (g.rank() + 1) % g.size(), 0),
                    Catch::Contains("not dense"));
  CHECK_THROWS_WITH(g.recv(zeros({4}), (g.rank() + 1) % g.size(), -3),
                    Catch::Contains("tag -3 is outside [0, "));
  CHECK(g.max_tag() >= 32767);
  CHECK_THROWS_WITH(g.send(zeros({4}), (g.rank() + 1) % g.size(), g.max_tag() + 1),
                    Catch::Contains("is outside"));
  // 10 floats sent, 12 expected: the receiver's wait() says both sides must agree.
  if (g.rank() == 0) {
    g.send(ones({10}), 1, 9).wait();
  } else if (g.rank() == 1) {
    Tensor t = zeros({12});
    Work w = g.recv(t, 0, 9);
    CHECK_THROWS_WITH(w.wait(), Catch::Contains("the message holds 40 bytes, the tensor 48") &&
                                    Catch::Contains("must agree on the shape and dtype"));
  }
  // The group works afterwards.
  Tensor t = ones({3});
  g.all_reduce(t).wait();
  CHECK(t.to_vector<float>()[2] == g.size());
}

TEST_CASE("send/recv: a group of one has no peer", "[mpi][p2p]") {
  auto local = new_local_group(std::chrono::seconds(10));
  CHECK_THROWS_WITH(local->send(zeros({2}), 0, 0), Catch::Contains("has one rank, so there is "
                                                                   "no peer"));
  CHECK_THROWS_WITH(local->recv(zeros({2}), 1, 0), Catch::Contains("no peer"));
}

TEST_CASE("new_group / split: sub-group collectives and ranks", "[mpi][groups]") {
  ProcessGroup& g = default_group();
  const int n = g.size(), me = g.rank();
  // Even ranks, listed in reverse: group rank i is the i-th listed.
  std::vector<int> evens;
  for (int r = n - 1; r >= 0; --r)
    if (r % 2 == 0) evens.push_back(r);
  auto sub = new_group(evens);
  if (me % 2 == 0) {
    REQUIRE(sub);
    CHECK(sub->size() == static_cast<int>(evens.size()));
    CHECK(evens[static_cast<size_t>(sub->rank())] == me);
    Tensor t = full({5}, me + 1.0, DType::f64);
    sub->all_reduce(t).wait();
    double want = 0;
    for (int r : evens) want += r + 1.0;
    CHECK(t.to_vector<double>()[4] == want);
    Tensor b = full({3}, me, DType::i64);
    sub->broadcast(b, 0).wait();  // group rank 0: the largest even rank
    CHECK(b.to_vector<int64_t>()[0] == evens[0]);
  } else {
    CHECK(sub == nullptr);
  }
  // split by parity; the odd group is absent in a world of 1.
  auto parity = g.split(me % 2, -me);  // key -me: ranked in decreasing world rank
  REQUIRE(parity);
  Tensor t = full({1}, me, DType::i64);
  parity->all_reduce(t, ReduceOp::Max).wait();
  int want_max = me;
  for (int r = me % 2; r < n; r += 2) want_max = std::max(want_max, r);
  CHECK(t.item<int64_t>() == want_max);
  CHECK(parity->rank() == (want_max - me) / 2);
  // A sub-group sends and receives with its own ranks.
  if (parity->size() >= 2) {
    Tensor x = full({4}, me, DType::f64);
    if (parity->rank() == 0) {
      parity->send(x, 1, 2).wait();
    } else if (parity->rank() == 1) {
      parity->recv(x, 0, 2).wait();
      CHECK(x.to_vector<double>()[3] == want_max);
    }
  }
  // Nested: a split of the sub-group.
  if (sub && sub->size() >= 2) {
    auto first = new_group({0}, sub.get());
    CHECK((first != nullptr) == (sub->rank() == 0));
  }
  g.barrier().wait();
}

TEST_CASE("new_group: bad lists fail on every rank", "[mpi][groups]") {
  ProcessGroup& g = default_group();
  CHECK_THROWS_WITH(new_group({0, 0}), Catch::Contains("appears twice"));
  CHECK_THROWS_WITH(new_group({g.size()}), Catch::Contains("is not a rank of the parent group"));
  CHECK_THROWS_WITH(new_group({}), Catch::Contains("empty"));
  // Lists that differ between ranks: every rank throws, none is left in the split.
  CHECK_THROWS_WITH(new_group({g.rank()}), Catch::Contains("differ between the ranks"));
  auto all = new_group({0, 1});
  CHECK((all != nullptr) == (g.rank() < 2));
}
