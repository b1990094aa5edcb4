// A minimal TCP rendezvous: rank 0 serves one blob (NCCL's unique id) to the other ranks.
// Rank 0 listens on the port, accepts size-1 connections and sends each a 4-byte length and
// the bytes; the others connect (retrying while rank 0 is not yet listening) and read them.
// Every socket call is bounded by the timeout, so a missing rank is an error, not a hang.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "src/distributed/internal.hpp"

namespace dltrain::distributed {

namespace {

using Clock = std::chrono::steady_clock;

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

int remaining_ms(Clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms > 0 ? static_cast<int>(std::min<int64_t>(ms, 1 << 30)) : 0;
}

void wait_fd(int fd, short events, Clock::time_point deadline, const std::string& what) {
  pollfd p{fd, events, 0};
  int r = poll(&p, 1, remaining_ms(deadline));
  DLTRAIN_CHECK(r > 0, "tcp rendezvous: timed out ", what);
}

void send_all(int fd, const char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    wait_fd(fd, POLLOUT, deadline, "sending to a rank");
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    DLTRAIN_CHECK(k > 0, "tcp rendezvous: send failed: ", std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void recv_all(int fd, char* p, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    wait_fd(fd, POLLIN, deadline, "waiting for rank 0's data");
    ssize_t k = recv(fd, p, n, 0);
    DLTRAIN_CHECK(k > 0, "tcp rendezvous: connection to rank 0 closed early (",
                  k == 0 ? "end of stream" : std::strerror(errno), ")");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

}  // namespace

std::string tcp_broadcast_bytes(const std::string& addr, int port, int rank, int size,
                                const std::string& bytes, std::chrono::milliseconds timeout) {
  DLTRAIN_CHECK(port > 0 && port <= 65535, "tcp rendezvous: port ", port,
                " is not a TCP port; set MASTER_PORT to a free port such as 29500");
  DLTRAIN_CHECK(rank >= 0 && rank < size, "tcp rendezvous: rank ", rank, " of ", size);
  const auto deadline = Clock::now() + timeout;
  if (size == 1) return bytes;
  if (rank == 0) {
    Fd s(socket(AF_INET, SOCK_STREAM, 0));
    DLTRAIN_CHECK(s.fd >= 0, "tcp rendezvous: socket(): ", std::strerror(errno));
    int one = 1;
    setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    DLTRAIN_CHECK(bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0,
                  "tcp rendezvous: rank 0 cannot listen on port ", port, ": ", std::strerror(errno),
                  "; choose another MASTER_PORT");
    DLTRAIN_CHECK(listen(s.fd, size) == 0, "tcp rendezvous: listen(): ", std::strerror(errno));
    const uint32_t len = htonl(static_cast<uint32_t>(bytes.size()));
    for (int served = 1; served < size; ++served) {
      wait_fd(s.fd, POLLIN, deadline,
              "waiting for rank connections (" + std::to_string(served - 1) + " of " +
                  std::to_string(size - 1) + " arrived)");
      Fd c(accept(s.fd, nullptr, nullptr));
      DLTRAIN_CHECK(c.fd >= 0, "tcp rendezvous: accept(): ", std::strerror(errno));
      send_all(c.fd, reinterpret_cast<const char*>(&len), 4, deadline);
      send_all(c.fd, bytes.data(), bytes.size(), deadline);
    }
    return bytes;
  }
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  int gai = getaddrinfo(addr.c_str(), port_s.c_str(), &hints, &res);
  DLTRAIN_CHECK(gai == 0 && res, "tcp rendezvous: cannot resolve MASTER_ADDR='", addr,
                "': ", gai_strerror(gai));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(res, freeaddrinfo);
  for (;;) {
    Fd c(socket(AF_INET, SOCK_STREAM, 0));
    DLTRAIN_CHECK(c.fd >= 0, "tcp rendezvous: socket(): ", std::strerror(errno));
    if (connect(c.fd, res->ai_addr, res->ai_addrlen) == 0) {
      uint32_t len = 0;
      recv_all(c.fd, reinterpret_cast<char*>(&len), 4, deadline);
      std::string out(ntohl(len), '\0');
      recv_all(c.fd, out.data(), out.size(), deadline);
      return out;
    }
    DLTRAIN_CHECK(Clock::now() < deadline, "tcp rendezvous: rank ", rank,
                  " could not reach rank 0 at ", addr, ":", port, " (", std::strerror(errno),
                  ") within the timeout; check MASTER_ADDR/MASTER_PORT and that rank 0 runs");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace dltrain::distributed
