// HTTP side of the server: the connection layer (accept loop, request deadlines and size limits, worker pools),
// endpoint handlers on cpp-httplib, streaming (SSE), disconnect detection, lifecycle.
#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <random>
#include <system_error>

#include "elastic/server.h"
#include "server/server_internal.h"

namespace fs = std::filesystem;

namespace elastic {

using namespace server;

namespace {
// httplib's request handling, driven by our own connection layer (below) instead of httplib's accept loop.
// httplib 0.11 listens with a backlog of 5: a burst of clients connecting at once overflows it and their
// connects stall in SYN retries. Access to the listening socket lets bind() raise the backlog.
struct HttpServer : httplib::Server {
  socket_t listening_socket() const { return svr_sock_; }
  // Reads one request from strm, runs its handler and writes the response (httplib's own per-request step).
  bool serve_request(httplib::Stream& strm, bool close_connection, bool& connection_closed) {
    return process_request(strm, close_connection, connection_closed, nullptr);
  }
  // Closing it also tells httplib's streaming responses that the server stops (their is_shutting_down).
  void close_listener() {
    const socket_t s = svr_sock_.exchange(INVALID_SOCKET);
    if (s != INVALID_SOCKET) {
      ::shutdown(s, SHUT_RDWR);
      ::close(s);
    }
  }
};
}  // namespace

// ---------------------------------------------------------------- the connection layer
// httplib 0.11 gives each accepted connection a worker thread for the connection's whole life: a client that sends
// its head one byte every few seconds (each recv has its own 5 s timeout), or sends nothing, holds that worker, and
// twenty such clients stop the server; a chunked body is read without any size limit. So httplib's accept loop is
// not used. One thread, the front, accepts every connection and owns it while its request arrives: it reads into the
// connection's buffer until the whole request is there (the head, then the body framed by Content-Length or by
// chunked encoding, whose decoded size it counts), within a deadline for the head and one for the body and under the
// body limit. Only a complete request goes to a worker, which runs httplib's request handling (process_request) on a
// Stream that reads the buffered bytes and writes the socket. After the response a keep-alive connection goes back to
// the front, so a slow or idle client costs a file descriptor and a little buffer, never a worker. Open connections
// are capped; at the cap the one that has waited longest for its request is closed. GET requests (/health,
// /metrics, /v1/models) have their own small pool so they never queue behind generation requests.
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxHeadBytes = 64 * 1024;     // request line + headers
constexpr size_t kMaxChunkLine = 1024;          // one chunk-size line (hex size + extensions)
// How long a refused connection is drained before it closes (Conn::draining).
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr size_t kChunkFramingSlack = 64 * 1024;
constexpr int kWriteTimeoutMs = 5000;           // per write, as httplib's default
constexpr int kMaxRequestsPerConnection = 1000;
constexpr int kLightWorkers = 2;

const char* status_text(int s) {
  switch (s) {
    case 100: return "Continue";
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
  }
  return "Error";
}

// A response the front writes itself (the request never reached httplib), always closing the connection.
std::string front_response(int status, const std::string& code, const std::string& message) {
  const std::string body =
      dump(error_json(message, status >= 500 ? "server_error" : "invalid_request_error", "", code));
  char head[256];
  std::snprintf(head, sizeof head,
                "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                status, status_text(status), body.size());
  return head + body;
}

// Best effort on a non-blocking socket: the few hundred bytes fit the send buffer of any live connection.
void send_now(int fd, const std::string& s) { (void)::send(fd, s.data(), s.size(), MSG_NOSIGNAL | MSG_DONTWAIT); }

// True when the peer has closed (or reset) the connection: readable with nothing to read, or an error.
bool peer_closed(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLNVAL)) return true;
  char c;
  const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim_ows(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// One client connection and the request arriving on it.
struct Conn {
  int fd = -1;
  std::string buf;             // bytes received and not yet handed to httplib (a pipelined request may follow)
  Clock::time_point since;     // began waiting for this request (accepted, or the previous response written)
  Clock::time_point head_at;   // the head became complete
  size_t head_len = 0;         // 0 until the head is complete
  size_t head_scanned = 0;     // bytes searched for the end of the head
  bool chunked = false;
  size_t content_length = 0;
  size_t chunk_pos = 0;        // chunked: where the next chunk-size line starts
  size_t chunk_body = 0;       // chunked: decoded body bytes so far
  size_t request_len = 0;      // > 0 once the whole request is buffered
  bool want_continue = false;  // the client waits for "100 Continue" before sending its body
  bool continue_sent = false;
  bool light = false;          // a GET: served by the light pool
  int served = 0;              // requests answered on this connection
  // Refused while the client may still be sending (413, 408, 400): the response is out and our side shut for
  // writing; what still arrives is read and dropped until drain_until, then the socket closes. Closing at once with
  // unread bytes makes the kernel send a reset, which can destroy the response before the client reads it.
  bool draining = false;
  Clock::time_point drain_until;

  ~Conn() {
    if (fd >= 0) ::close(fd);
  }
  // The answered request's bytes leave the buffer (a pipelined one stays) and the parse starts over.
  void next_request() {
    buf.erase(0, request_len);
    head_len = head_scanned = content_length = chunk_pos = chunk_body = request_len = 0;
    chunked = want_continue = continue_sent = light = false;
    ++served;
    since = Clock::now();
  }
};

// Why a request is refused before it reaches httplib.
struct Refusal {
  int status = 0;
  std::string code, message;
};

struct Limits {
  size_t max_body = 0;
  size_t raw_body() const { return 2 * max_body + kChunkFramingSlack; }  // chunked: body + chunk framing
};

// Reads the head's framing headers. Only what decides where the request ends, and what httplib would mishandle,
// is checked here; the rest is httplib's.
std::optional<Refusal> parse_head(Conn& c, const Limits& lim) {
  const std::string head = c.buf.substr(0, c.head_len);
  c.light = head.rfind("GET ", 0) == 0 || head.rfind("HEAD ", 0) == 0;
  bool have_length = false;
  size_t expect_line = std::string::npos, expect_len = 0;
  for (size_t p = head.find("\r\n") + 2; p + 2 < head.size();) {
    const size_t e = head.find("\r\n", p);
    const std::string line = head.substr(p, e - p);
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      const std::string name = lower(trim_ows(line.substr(0, colon))), value = trim_ows(line.substr(colon + 1));
      if (name == "transfer-encoding") {
        if (lower(value) != "chunked")
          return Refusal{501, "not_implemented",
                         "Transfer-Encoding '" + value + "' is not supported (only 'chunked')"};
        c.chunked = true;
      } else if (name == "content-length") {
        if (value.empty() || value.size() > 18 || value.find_first_not_of("0123456789") != std::string::npos)
          return Refusal{400, "bad_request", "Content-Length '" + value + "' is not a byte count"};
        const size_t n = std::stoull(value);
        if (have_length && n != c.content_length)
          return Refusal{400, "bad_request", "conflicting Content-Length headers"};
        have_length = true;
        c.content_length = n;
      } else if (name == "content-encoding") {
        if (lower(value) != "identity")
          return Refusal{415, "unsupported_media_type",
                         "Content-Encoding '" + value + "' is not supported: send the body uncompressed"};
      } else if (name == "expect" && lower(value) == "100-continue") {
        expect_line = p;
        expect_len = e + 2 - p;
      }
    }
    p = e + 2;
  }
  if (c.chunked) c.content_length = 0;  // chunked framing wins over a Content-Length (RFC 9112 6.3), as in httplib
  if (c.content_length > lim.max_body)
    return Refusal{413, "payload_too_large",
                   "request body of " + std::to_string(c.content_length) + " bytes exceeds the limit of " +
                       std::to_string(lim.max_body) + " bytes"};
  if (expect_line != std::string::npos) {
    // Answered here, while the body is awaited; the header is dropped so httplib does not answer it again.
    c.buf.erase(expect_line, expect_len);
    c.head_len -= expect_len;
    c.want_continue = true;
  }
  c.chunk_pos = c.head_len;
  return std::nullopt;
}

// Walks the chunks received so far; sets request_len when the last chunk (and the empty trailer) is in.
std::optional<Refusal> scan_chunks(Conn& c, const Limits& lim) {
  for (;;) {
    const size_t eol = c.buf.find("\r\n", c.chunk_pos);
    if (eol == std::string::npos) {
      if (c.buf.size() - c.chunk_pos > kMaxChunkLine)
        return Refusal{400, "bad_request", "chunk-size line longer than " + std::to_string(kMaxChunkLine) + " bytes"};
      return std::nullopt;
    }
    if (eol - c.chunk_pos > kMaxChunkLine)
      return Refusal{400, "bad_request", "chunk-size line longer than " + std::to_string(kMaxChunkLine) + " bytes"};
    const std::string line = c.buf.substr(c.chunk_pos, eol - c.chunk_pos);
    const size_t digits = line.find_first_not_of("0123456789abcdefABCDEF");
    const size_t nd = digits == std::string::npos ? line.size() : digits;
    if (nd == 0 || nd > 15 || (digits != std::string::npos && line[digits] != ';' && line[digits] != ' ' &&
                               line[digits] != '\t'))
      return Refusal{400, "bad_request", "malformed chunk-size line in a chunked body"};
    const size_t size = std::stoull(line.substr(0, nd), nullptr, 16);
    if (size > lim.max_body || c.chunk_body + size > lim.max_body)
      return Refusal{413, "payload_too_large",
                     "chunked request body exceeds the limit of " + std::to_string(lim.max_body) + " bytes"};
    const size_t data = eol + 2;
    if (size == 0) {  // the last chunk: no trailer fields (httplib does not read them), just the empty line
      if (c.buf.size() < data + 2) return std::nullopt;
      if (c.buf.compare(data, 2, "\r\n") != 0)
        return Refusal{400, "bad_request", "trailer fields after a chunked body are not supported"};
      c.request_len = data + 2;
      return std::nullopt;
    }
    if (data + size + 2 - c.head_len > lim.raw_body())
      return Refusal{413, "payload_too_large",
                     "chunked request body with its chunk framing exceeds " + std::to_string(lim.raw_body()) +
                         " bytes"};
    if (c.buf.size() < data + size + 2) return std::nullopt;
    if (c.buf.compare(data + size, 2, "\r\n") != 0)
      return Refusal{400, "bad_request", "a chunk of a chunked body does not end with CRLF"};
    c.chunk_body += size;
    c.chunk_pos = data + size + 2;
  }
}

// Advances the parse over the bytes received: the head, then the body. request_len > 0 when the request is whole.
std::optional<Refusal> scan(Conn& c, const Limits& lim) {
  if (c.head_len == 0) {
    const size_t from = c.head_scanned >= 3 ? c.head_scanned - 3 : 0;
    const size_t end = c.buf.find("\r\n\r\n", from);
    if (end == std::string::npos) {
      c.head_scanned = c.buf.size();
      if (c.buf.size() > kMaxHeadBytes)
        return Refusal{431, "header_too_large",
                       "request head (request line and headers) exceeds " + std::to_string(kMaxHeadBytes) + " bytes"};
      return std::nullopt;
    }
    if (end + 4 > kMaxHeadBytes)
      return Refusal{431, "header_too_large",
                     "request head (request line and headers) exceeds " + std::to_string(kMaxHeadBytes) + " bytes"};
    c.head_len = end + 4;
    c.head_at = Clock::now();
    if (auto r = parse_head(c, lim)) return r;
  }
  if (c.chunked) return scan_chunks(c, lim);
  if (c.buf.size() >= c.head_len + c.content_length) c.request_len = c.head_len + c.content_length;
  return std::nullopt;
}

// What httplib reads and writes for one request: reads come from the request's buffered bytes (the front received
// all of them), writes go to the socket, each waiting at most kWriteTimeoutMs for room.
class BufferedStream : public httplib::Stream {
 public:
  BufferedStream(int fd, const char* data, size_t n) : fd_(fd), data_(data), n_(n) {}
  bool is_readable() const override { return pos_ < n_; }
  // Room to write within the timeout, and the peer still there (what a content provider checks between pieces).
  bool is_writable() const override {
    pollfd p{fd_, POLLOUT, 0};
    return ::poll(&p, 1, kWriteTimeoutMs) > 0 && (p.revents & POLLOUT) && !peer_closed(fd_);
  }
  ssize_t read(char* ptr, size_t size) override {
    const size_t k = std::min(size, n_ - pos_);
    std::memcpy(ptr, data_ + pos_, k);
    pos_ += k;
    return static_cast<ssize_t>(k);
  }
  ssize_t write(const char* ptr, size_t size) override {
    const auto deadline = Clock::now() + std::chrono::milliseconds(kWriteTimeoutMs);
    for (;;) {
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) return n;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      pollfd p{fd_, POLLOUT, 0};
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return -1;  // a client that stopped reading
    }
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { address(false, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address(true, ip, port); }
  socket_t socket() const override { return fd_; }

 private:
  void address(bool local, std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    if ((local ? ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len)
               : ::getpeername(fd_, reinterpret_cast<sockaddr*>(&a), &len)) != 0)
      return;
    if (a.ss_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
    else if (a.ss_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
    else return;
    char host[NI_MAXHOST] = {};
    if (::getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) == 0)
      ip = host;
  }
  int fd_;
  const char* data_;
  size_t n_, pos_ = 0;
};

// The client of the request a worker thread is answering: handlers that wait for the engine poll it to notice a
// client that went away (httplib runs the handler on the worker's thread), and can ask for the connection to close.
thread_local int tl_client_fd = -1;
thread_local bool tl_close_after = false;

bool client_gone() { return tl_client_fd >= 0 && peer_closed(tl_client_fd); }

}  // namespace

// Owns the listening socket's accept loop, the connections waiting for their request, and the worker pools.
class Connections {
 public:
  struct Options {
    int max_connections = 512;
    double header_timeout_s = 10, body_timeout_s = 30;
    size_t max_body = 1 << 20;
    int workers = 20;
    bool log = false;
  };
  Connections(HttpServer& http, Options o, Metrics& met) : http_(http), o_(o), met_(met) {
    lim_.max_body = o_.max_body;
    if (::pipe2(wake_, O_NONBLOCK | O_CLOEXEC) != 0) throw std::runtime_error("server: cannot create a pipe");
  }
  ~Connections() {
    stop();
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  void run();  // blocks until stop()
  void stop() {
    stopping_ = true;
    wake();
  }
  bool running() const { return running_; }

 private:
  class Pool;
  void wake() { (void)!::write(wake_[1], "x", 1); }
  void accept_all(int lfd);
  void admit(std::unique_ptr<Conn> c);
  void on_readable(std::unique_ptr<Conn>& c);
  void progress(std::unique_ptr<Conn>& c);
  void expire(std::unique_ptr<Conn>& c, Clock::time_point now);
  // linger: c is in pending_ and is drained before it closes (Conn::draining); else it closes at once.
  void refuse(std::unique_ptr<Conn>& c, const Refusal& r, bool linger = true);
  void shed_oldest();
  void dispatch(std::unique_ptr<Conn>& c);
  void serve(std::unique_ptr<Conn> c);  // on a worker
  void give_back(std::unique_ptr<Conn> c);
  void close_conn(std::unique_ptr<Conn>& c);
  Clock::time_point deadline(const Conn& c) const;
  void count(int status) {
    std::lock_guard g(met_.mu);
    if (status >= 500) ++met_.http_5xx;
    else ++met_.http_4xx;
  }
  void publish_open() {
    std::lock_guard g(met_.mu);
    met_.connections_open = open_;
  }

  HttpServer& http_;
  Options o_;
  Metrics& met_;
  Limits lim_;
  int wake_[2] = {-1, -1};
  std::atomic<bool> stopping_{false}, running_{false};
  std::atomic<int> open_{0};                    // every open client connection, wherever it is
  std::vector<std::unique_ptr<Conn>> pending_;  // front thread only: waiting for (the rest of) a request
  std::mutex back_mu_;
  std::vector<std::unique_ptr<Conn>> back_;     // answered keep-alive connections, returned by the workers
  std::unique_ptr<Pool> light_, heavy_;
};

// Worker threads taking complete requests from a queue.
class Connections::Pool {
 public:
  Pool(Connections& owner, int n) : owner_(owner) {
    try {
      for (int i = 0; i < n; ++i) th_.emplace_back([this] { loop(); });
    } catch (const std::system_error& e) {
      // A thread the system will not make (a process or memory limit): the ones started must be joined here, as no
      // destructor runs for a constructor that throws, and a joinable std::thread's destructor ends the process.
      stop_and_join();
      throw std::runtime_error("server: the system started only " + std::to_string(th_.size()) + " of " +
                               std::to_string(n) + " worker threads (" + e.what() + "): lower --parallel");
    }
  }
  ~Pool() {
    stop_and_join();
    for (auto& c : q_) owner_.close_conn(c);
  }
  void push(std::unique_ptr<Conn> c) {
    {
      std::lock_guard g(mu_);
      q_.push_back(std::move(c));
    }
    cv_.notify_one();
  }

 private:
  void stop_and_join() {
    {
      std::lock_guard g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : th_) t.join();
  }
  void loop() {
    for (;;) {
      std::unique_ptr<Conn> c;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (stop_) return;
        c = std::move(q_.front());
        q_.pop_front();
      }
      owner_.serve(std::move(c));
    }
  }
  Connections& owner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Conn>> q_;
  bool stop_ = false;
  std::vector<std::thread> th_;
};

Clock::time_point Connections::deadline(const Conn& c) const {
  using std::chrono::duration_cast;
  auto secs = [](double s) { return duration_cast<Clock::duration>(std::chrono::duration<double>(s)); };
  if (c.draining) return c.drain_until;
  return c.head_len ? c.head_at + secs(o_.body_timeout_s) : c.since + secs(o_.header_timeout_s);
}

void Connections::close_conn(std::unique_ptr<Conn>& c) {
  if (!c) return;
  c.reset();  // closes the socket
  --open_;
  publish_open();
}

void Connections::refuse(std::unique_ptr<Conn>& c, const Refusal& r, bool linger) {
  send_now(c->fd, front_response(r.status, r.code, r.message));
  count(r.status);
  if (o_.log) std::fprintf(stderr, "http: refused %d %s: %s\n", r.status, r.code.c_str(), r.message.c_str());
  if (!linger) return close_conn(c);
  ::shutdown(c->fd, SHUT_WR);
  c->draining = true;
  c->drain_until = Clock::now() + kLingerTime;
}

void Connections::shed_oldest() {
  auto oldest = pending_.end();
  for (auto it = pending_.begin(); it != pending_.end(); ++it)
    if (*it && (oldest == pending_.end() || (*it)->since < (*oldest)->since)) oldest = it;
  if (oldest == pending_.end()) return;
  {
    std::lock_guard g(met_.mu);
    ++met_.connections_shed;
  }
  close_conn(*oldest);
}

void Connections::admit(std::unique_ptr<Conn> c) {
  c->since = Clock::now();
  pending_.push_back(std::move(c));
  progress(pending_.back());  // a returned connection may already hold a pipelined request
}

void Connections::accept_all(int lfd) {
  for (int i = 0; i < 256; ++i) {
    const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of file descriptors: free the oldest waiting connection so the next accept can succeed.
      if (errno == EMFILE || errno == ENFILE) {
        if (!pending_.empty()) shed_oldest();
        else std::this_thread::sleep_for(std::chrono::milliseconds(10));  // wait for a worker to close one
      }
      return;
    }
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    ++open_;
    if (fd >= FD_SETSIZE) {  // httplib's request handling answers 500 past FD_SETSIZE (it uses select)
      refuse(c, {503, "unavailable", "too many open connections"}, false);
      continue;
    }
    if (open_ > o_.max_connections) shed_oldest();
    if (open_ > o_.max_connections) {  // every other connection is being answered: this one cannot wait
      refuse(c, {503, "unavailable", "too many open connections (" + std::to_string(o_.max_connections) + ")"},
             false);
      continue;
    }
    publish_open();
    admit(std::move(c));
  }
}

void Connections::progress(std::unique_ptr<Conn>& c) {
  if (auto r = scan(*c, lim_)) return refuse(c, *r);
  if (c->request_len) return dispatch(c);
  if (c->want_continue && !c->continue_sent) {
    send_now(c->fd, "HTTP/1.1 100 Continue\r\n\r\n");
    c->continue_sent = true;
  }
}

void Connections::on_readable(std::unique_ptr<Conn>& c) {
  // Never more than the largest request could need: the head limit plus the raw body limit.
  const size_t cap = kMaxHeadBytes + lim_.raw_body() + 1;
  char tmp[16384];
  if (c->draining) {  // dropped unread, a bounded number of reads per wake-up
    for (int i = 0; i < 64; ++i) {
      const ssize_t n = ::recv(c->fd, tmp, sizeof tmp, MSG_DONTWAIT);
      if (n > 0) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      return close_conn(c);  // the client read the response and closed
    }
    return;
  }
  while (c->buf.size() < cap) {
    const ssize_t n = ::recv(c->fd, tmp, std::min(sizeof tmp, cap - c->buf.size()), MSG_DONTWAIT);
    if (n > 0) {
      c->buf.append(tmp, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof tmp) break;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) break;
    return close_conn(c);  // the client closed (or reset) before its request was whole
  }
  progress(c);
}

void Connections::expire(std::unique_ptr<Conn>& c, Clock::time_point now) {
  if (now < deadline(*c)) return;
  if (c->draining) return close_conn(c);
  if (c->buf.empty()) return close_conn(c);  // an idle connection: closed silently, as a keep-alive timeout
  {
    std::lock_guard g(met_.mu);
    ++met_.connections_timed_out;
  }
  const bool head = c->head_len == 0;
  char msg[160];
  std::snprintf(msg, sizeof msg, "the request %s did not arrive within %g s", head ? "head (request line and headers)"
                                                                                   : "body",
                head ? o_.header_timeout_s : o_.body_timeout_s);
  refuse(c, {408, "request_timeout", msg});
}

void Connections::dispatch(std::unique_ptr<Conn>& c) {
  Pool& p = c->light ? *light_ : *heavy_;
  p.push(std::move(c));  // leaves a null in pending_, swept after the poll round
}

void Connections::serve(std::unique_ptr<Conn> c) {
  BufferedStream strm(c->fd, c->buf.data(), c->request_len);
  tl_client_fd = c->fd;
  tl_close_after = false;
  bool closed = false;
  const bool last = c->served + 1 >= kMaxRequestsPerConnection;
  bool ok = false;
  try {
    ok = http_.serve_request(strm, last, closed);
  } catch (...) {  // httplib catches handler exceptions; this is for its own failures (e.g. bad_alloc)
    ok = false;
  }
  tl_client_fd = -1;
  if (!ok || closed || last || tl_close_after || stopping_) return close_conn(c);
  c->next_request();
  give_back(std::move(c));
}

void Connections::give_back(std::unique_ptr<Conn> c) {
  {
    std::lock_guard g(back_mu_);
    back_.push_back(std::move(c));
  }
  wake();
}

void Connections::run() {
  const int lfd = http_.listening_socket();
  if (lfd < 0) throw std::runtime_error("server: run before bind");
  ::fcntl(lfd, F_SETFL, ::fcntl(lfd, F_GETFL) | O_NONBLOCK);
  light_ = std::make_unique<Pool>(*this, kLightWorkers);
  heavy_ = std::make_unique<Pool>(*this, o_.workers);
  running_ = true;
  std::vector<pollfd> fds;
  while (!stopping_) {
    {
      std::vector<std::unique_ptr<Conn>> back;
      {
        std::lock_guard g(back_mu_);
        back.swap(back_);
      }
      for (auto& c : back) admit(std::move(c));
    }
    std::erase(pending_, nullptr);
    // Sleep until a socket is ready or the earliest deadline (at most 1 s, to notice stop()).
    const auto now = Clock::now();
    auto wake_at = now + std::chrono::seconds(1);
    for (auto& c : pending_) wake_at = std::min(wake_at, deadline(*c));
    const int timeout_ms = static_cast<int>(
        std::max<long long>(0, std::chrono::duration_cast<std::chrono::milliseconds>(wake_at - now).count() + 1));
    fds.assign({{wake_[0], POLLIN, 0}, {lfd, POLLIN, 0}});
    for (auto& c : pending_) fds.push_back({c->fd, POLLIN, 0});
    const int n = ::poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      char drain[256];
      while (::read(wake_[0], drain, sizeof drain) > 0) {
      }
    }
    const size_t polled = fds.size() - 2;  // admit() below appends; those were not polled
    for (size_t i = 0; i < polled; ++i)
      if (pending_[i] && fds[i + 2].revents) on_readable(pending_[i]);
    if (fds[1].revents & POLLIN) accept_all(lfd);
    const auto t = Clock::now();
    for (auto& c : pending_)
      if (c) expire(c, t);
  }
  // Stop: no more accepts; streaming responses see the listener gone (httplib's is_shutting_down) and end.
  running_ = false;
  http_.close_listener();
  for (auto& c : pending_) close_conn(c);
  pending_.clear();
  light_.reset();
  heavy_.reset();
  std::lock_guard g(back_mu_);
  for (auto& c : back_) close_conn(c);
  back_.clear();
}

struct Server::Impl {
  ServerOptions opts;
  Model model;
  std::unique_ptr<Tokenizer> tok;
  ChatTemplate tmpl;
  std::string name;
  int ctx = 0;
  Metrics metrics;
  std::unique_ptr<Scheduler> sched;
  HttpServer http;
  std::unique_ptr<Connections> conns;  // after http: destroyed (joined) before it
  int bound_port = -1;
  std::thread th;
  std::atomic<uint64_t> next_id{1};
  long started_at = std::time(nullptr);

  Impl(Model m, const std::string& dir, ServerOptions o);
  void routes();
  const Tokenizer& need_tok(const std::string& param) const;
  std::vector<int32_t> chat_ids(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  void check_vocab(const std::vector<int32_t>& ids, const std::string& param) const;
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
};

namespace {

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  // A full queue or a temporary state (memory, shutdown): say when to come back.
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  send_json(res, e.status, error_json(e));
}

// Runs a handler; ApiError -> its status, anything else -> 500 with the message.
template <class F>
void guarded(httplib::Response& res, F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    send_error(res, e);
  } catch (const std::exception& e) {
    send_error(res, ApiError(500, e.what(), "", "internal_error", "server_error"));
  }
}

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

// An engine failure as the error the client gets: its status (500, or 503 for memory / shutdown) and code.
ApiError job_error(const Job& j) {
  return ApiError(j.error_status, j.error, "", j.error_code.empty() ? "generation_failed" : j.error_code,
                  j.error_status >= 500 ? "server_error" : "invalid_request_error");
}

// The client left while its request waited or ran: the request is cancelled (its slot and KV memory freed) and
// the connection closed after this (empty) response.
void abandon(Job& job, httplib::Response& res) {
  job.cancelled = true;
  tl_close_after = true;
  res.status = 200;
}

// Range checks of the options a caller (serve's flags, a test) can get wrong, naming the option.
void check_options(const ServerOptions& o) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("server: " + what); };
  if (o.max_slots < 1 || o.max_slots > 1024) bad("max slots must be in [1, 1024], got " + std::to_string(o.max_slots));
  if (o.http_threads < 0 || o.http_threads > 1024)
    bad("HTTP threads must be in [0, 1024], got " + std::to_string(o.http_threads));
  if (o.threads < 0 || o.threads > 1024) bad("threads must be in [0, 1024], got " + std::to_string(o.threads));
  if (o.max_context < 0) bad("max context must be >= 0, got " + std::to_string(o.max_context));
  if (o.kv_budget_bytes == 0) bad("the KV budget must be > 0 bytes");
  if (o.max_body_bytes < 64 || o.max_body_bytes > kServerMaxBodyBytes)
    bad("max body bytes must be in [64, " + std::to_string(kServerMaxBodyBytes) + "], got " +
        std::to_string(o.max_body_bytes));
  if (o.max_connections < 1 || o.max_connections > kServerMaxConnections)
    bad("max connections must be in [1, " + std::to_string(kServerMaxConnections) + "], got " +
        std::to_string(o.max_connections));
  for (auto [name, v] : {std::pair{"header timeout", o.header_timeout_s}, std::pair{"body timeout", o.body_timeout_s}})
    if (!std::isfinite(v) || v <= 0 || v > kServerMaxTimeoutSeconds)
      bad(std::string(name) + " must be in (0, " + std::to_string(int(kServerMaxTimeoutSeconds)) + "] seconds, got " +
          std::to_string(v));
}

}  // namespace

Server::Impl::Impl(Model m, const std::string& dir, ServerOptions o) : opts(std::move(o)), model(std::move(m)) {
  const fs::path d(dir);
  name = !opts.model_name.empty() ? opts.model_name : d.filename().empty() ? d.parent_path().filename().string()
                                                                            : d.filename().string();
  const std::string tp = model_tokenizer_path(dir, opts.tokenizer_path);  // a GGUF model carries its own
  if (!tp.empty()) tok = std::make_unique<Tokenizer>(Tokenizer::from_file(tp));
  tmpl = ChatTemplate::from_model_dir(dir);
  check_options(opts);
  // Past the model's positions RoPE runs on angles it never trained on, and generate refuses it: so does the server
  // (it served a 300-token prompt on a 128-position model before).
  if (opts.max_context > 0)
    check_within_context(model.config, opts.max_context, "server: the context " + std::to_string(opts.max_context));
  ctx = opts.max_context > 0 ? opts.max_context : model.config.max_positions;
  if (ctx < 2) throw std::runtime_error("server: the context must hold at least 2 tokens, got " + std::to_string(ctx));
  std::vector<int32_t> eos = model.config.eos_ids;
  // Chat models end a turn with tokenizer_config's eos_token (e.g. <|im_end|>), which config.json may not list.
  if (tok && !tmpl.eos_token().empty())
    if (int32_t id = tok->token_id(tmpl.eos_token()); id >= 0 && id < model.config.vocab &&
                                                       std::find(eos.begin(), eos.end(), id) == eos.end())
      eos.push_back(id);
  if (opts.backend) {
    if (opts.max_slots != 1)
      throw std::runtime_error("server: the " + opts.backend->name() +
                               " backend runs one request at a time: max slots must be 1, got " +
                               std::to_string(opts.max_slots));
    if (ctx > opts.backend->capacity())
      throw std::runtime_error("server: the context of " + std::to_string(ctx) + " tokens exceeds the " +
                               opts.backend->name() + " backend's capacity of " +
                               std::to_string(opts.backend->capacity()));
  }
  SchedulerOptions so;
  so.backend = opts.backend;
  so.batch_backend = opts.batch_backend;
  so.max_slots = opts.max_slots;
  so.max_queue = opts.max_queue;
  if (opts.prefill_chunk < 1)
    throw std::runtime_error("server: the prefill chunk must be >= 1 token, got " + std::to_string(opts.prefill_chunk));
  so.prefill_chunk = opts.prefill_chunk;
  so.kv_budget_bytes = opts.kv_budget_bytes;
  so.threads = opts.threads;
  so.log = opts.log_requests;
  sched = std::make_unique<Scheduler>(model, tok.get(), eos, so, metrics);
  routes();
}

const Tokenizer& Server::Impl::need_tok(const std::string& param) const {
  if (!tok)
    throw ApiError(400, "the model has no tokenizer (no tokenizer.json in its folder, none in its GGUF metadata): "
                   "send 'prompt' as a list of token ids", param,
                   "no_tokenizer");
  return *tok;
}

std::vector<int32_t> Server::Impl::chat_ids(const std::vector<ChatMessage>& messages, bool add_gen) const {
  const Tokenizer& t = need_tok("messages");
  try {
    return tmpl.encode(t, messages, add_gen, opts.allow_special_in_content);
  } catch (const ChatTemplateError& e) {
    throw ApiError(400, e.what(), "messages", "chat_template_unavailable");
  }
}

// A tokenizer may know ids the model has no embedding for (added tokens past the model's vocab_size): such a
// prompt is the client's to change, and must not reach the engine, where it would fail mid-request.
void Server::Impl::check_vocab(const std::vector<int32_t>& ids, const std::string& param) const {
  for (int32_t id : ids)
    if (id < 0 || id >= model.config.vocab) {
      const std::string text = tok && id >= 0 ? " ('" + tok->token_text(id) + "')" : "";
      throw ApiError(400, "token id " + std::to_string(id) + text + " in '" + param +
                              "' is outside the model's vocabulary [0, " + std::to_string(model.config.vocab) + ")",
                     param, "invalid_value");
    }
}

void Server::Impl::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  const json body = parse_json_body(req.body);
  GenSpec spec = chat ? parse_chat_request(body) : parse_completion_request(body);
  if (!spec.model.empty() && spec.model != name)
    throw ApiError(404, "the model '" + spec.model + "' does not exist (this server serves '" + name + "')", "model",
                   "model_not_found");
  std::vector<int32_t> prompt;
  if (chat) prompt = chat_ids(spec.messages, true);
  else if (spec.prompt_is_ids) prompt = spec.prompt_ids;
  else prompt = need_tok("prompt").encode(spec.prompt_text);
  check_vocab(prompt, chat ? "messages" : "prompt");
  if (prompt.empty()) throw ApiError(400, "the prompt is empty", chat ? "messages" : "prompt", "invalid_value");
  const int n = static_cast<int>(prompt.size());
  if (n >= ctx)
    throw ApiError(400, "the prompt has " + std::to_string(n) + " tokens; this server's context is " +
                            std::to_string(ctx) + " tokens (prompt + max_tokens)",
                   chat ? "messages" : "prompt", "context_length_exceeded");
  const int max_tokens = spec.max_tokens < 0 ? ctx - n : spec.max_tokens;
  if (static_cast<int64_t>(n) + max_tokens > ctx)
    throw ApiError(400, "prompt (" + std::to_string(n) + " tokens) + max_tokens (" + std::to_string(max_tokens) +
                            ") exceeds this server's context of " + std::to_string(ctx) + " tokens",
                   "max_tokens", "context_length_exceeded");

  auto job = std::make_shared<Job>();
  const ModelConfig& c = model.config;
  if (opts.route) {
    try {
      job->routing = opts.route(prompt);
    } catch (const std::exception& e) {
      throw ApiError(500, std::string("router failed: ") + e.what(), "", "router_error", "server_error");
    }
  } else if (opts.policy.router) {
    job->router = opts.policy.router.get();  // decided layer by layer in prefill; reserve the all-full size until then
    job->routing = RoutingTable::all_full(c.n_layers, c.n_kv_heads);
  } else {
    const RoutingTable* fixed = opts.policy.fixed_table();  // null for an empty table: every head full
    job->routing = fixed ? *fixed : RoutingTable::all_full(c.n_layers, c.n_kv_heads);
  }
  if (job->routing.n_layers != c.n_layers || job->routing.n_kv_heads != c.n_kv_heads ||
      job->routing.mode.size() != static_cast<size_t>(c.n_layers) * c.n_kv_heads)
    throw ApiError(500, "router returned a " + std::to_string(job->routing.n_layers) + " x " +
                            std::to_string(job->routing.n_kv_heads) + " routing for a model with " +
                            std::to_string(c.n_layers) + " layers x " + std::to_string(c.n_kv_heads) + " KV heads",
                   "", "router_error", "server_error");
  job->prompt = std::move(prompt);
  job->max_tokens = max_tokens;
  job->sampler = spec.sampler;
  if (!spec.seed_given) job->sampler.seed = std::random_device{}();
  job->stop = spec.stop;
  job->stop_at_eos = !spec.ignore_eos;
  job->return_ids = spec.return_token_ids;
  job->capacity = n + max_tokens;
  sched->submit(job);  // reserves job->kv_bytes by its backend's rule

  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
  const long created = std::time(nullptr);
  const std::string model_name = name;
  // While the request waits or runs, the handler polls the connection: a client that went away cancels its request
  // (its slot and KV memory are freed). A non-streaming answer is sent whole when the request ends, with the status
  // of its outcome; a stream starts once the prompt is prefilled, so a failure up to there (the common case: the
  // router, memory) also gets its own status, and only a failure after that arrives as an error event.
  if (!spec.stream) {
    std::string text;
    for (;;) {
      Job::Taken t = job->take(std::chrono::milliseconds(50));
      text += t.text;
      if (t.done) break;
      if (client_gone()) return abandon(*job, res);
    }
    std::lock_guard g(job->mu);
    if (!job->error.empty()) throw job_error(*job);
    send_json(res, 200, completion_json(id, created, model_name, chat, text, job->finish_reason, job->summary));
    return;
  }
  while (!job->wait_prefilled(std::chrono::milliseconds(50)))
    if (client_gone()) return abandon(*job, res);
  {
    std::lock_guard g(job->mu);
    if (job->done && !job->error.empty()) throw job_error(*job);
  }
  auto on_release = [job](bool success) {
    if (!success) job->cancelled = true;
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [job, id, created, model_name, chat](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) {
          if (sink.write(s.data(), s.size())) return true;
          job->cancelled = true;
          return false;
        };
        if (chat && !write(sse(chunk_json(id, created, model_name, true, "", true, nullptr, nullptr)))) return false;
        for (;;) {
          Job::Taken t = job->take(std::chrono::milliseconds(50));
          if (!t.text.empty() && !write(sse(chunk_json(id, created, model_name, chat, t.text, false, nullptr, nullptr))))
            return false;
          if (t.done) break;
          if (!sink.is_writable()) {
            job->cancelled = true;
            return false;
          }
        }
        std::string fin;
        json err;  // the headers (200) are out: a failure from here on is the stream's last event
        JobSummary s;
        {
          std::lock_guard g(job->mu);
          fin = job->finish_reason;
          if (!job->error.empty()) err = error_json(job_error(*job));
          s = job->summary;
        }
        if (!err.is_null()) {
          if (!write(sse(err))) return false;
        } else if (!write(sse(chunk_json(id, created, model_name, chat, "", false, &fin, &s)))) {
          return false;
        }
        if (!write("data: [DONE]\n\n")) return false;
        sink.done();
        return true;
      },
      on_release);
}

void Server::Impl::routes() {
  http.set_payload_max_length(opts.max_body_bytes);
  // httplib's default sets SO_REUSEPORT, which lets a second server bind the same port and take half the
  // connections; SO_REUSEADDR alone keeps restarts quick and makes a taken port an error.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Only the Keep-Alive response header reads these: the connection layer enforces them.
  http.set_keep_alive_timeout(static_cast<time_t>(std::ceil(opts.header_timeout_s)));
  http.set_keep_alive_max_count(kMaxRequestsPerConnection);
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    {
      // Counted here, before the response is written (the logger runs after), so clients see it in /metrics.
      std::lock_guard g(metrics.mu);
      if (res.status >= 500) ++metrics.http_5xx;
      else ++metrics.http_4xx;
    }
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // a handler's own error object
    std::string msg = "HTTP " + std::to_string(res.status);
    std::string code = "http_error";
    if (res.status == 404) msg = "no such endpoint: " + req.method + " " + req.path, code = "not_found";
    if (res.status == 413)
      msg = "request body exceeds " + std::to_string(opts.max_body_bytes) + " bytes", code = "payload_too_large";
    if (res.status == 400) msg = "malformed HTTP request", code = "bad_request";
    res.set_content(dump(error_json(msg, res.status >= 500 ? "server_error" : "invalid_request_error", "", code)),
                    "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string msg = "unknown error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      msg = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, msg, "", "internal_error", "server_error"));
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    // Generation requests that were accepted get their line from the scheduler when they finish.
    const bool generation = req.path == "/v1/completions" || req.path == "/v1/chat/completions";
    if (opts.log_requests && !(generation && res.status == 200))
      std::fprintf(stderr, "http: %s %s %d (%s:%d)\n", req.method.c_str(), req.path.c_str(), res.status,
                   req.remote_addr.c_str(), req.remote_port);
  });

  http.Get("/health", [](const httplib::Request&, httplib::Response& res) { send_json(res, 200, {{"status", "ok"}}); });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200,
              {{"object", "list"},
               {"data", json::array({{{"id", name},
                                      {"object", "model"},
                                      {"created", started_at},
                                      {"owned_by", "elastic"},
                                      {"max_model_len", ctx}}})}});
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { generate(req, res, false); });
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { generate(req, res, true); });
  });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const json b = parse_json_body(req.body);
      std::vector<int32_t> ids;
      if (b.contains("messages")) {
        GenSpec s = parse_chat_request(b);
        const auto ag = b.find("add_generation_prompt");
        if (ag != b.end() && !ag->is_boolean())
          throw ApiError(400, "'add_generation_prompt' must be a boolean", "add_generation_prompt", "invalid_type");
        const bool add_gen = ag == b.end() || ag->get<bool>();
        ids = chat_ids(s.messages, add_gen);
      } else {
        auto it = b.find("prompt");
        if (it == b.end()) throw ApiError(400, "missing required field 'prompt' (or 'messages')", "prompt", "missing_field");
        if (!it->is_string())
          throw ApiError(400, std::string("'prompt' must be a string, got ") + it->type_name(), "prompt", "invalid_type");
        ids = need_tok("prompt").encode(it->get<std::string>());
      }
      send_json(res, 200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", ctx}});
    });
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const json b = parse_json_body(req.body);
      auto it = b.find("tokens");
      if (it == b.end()) throw ApiError(400, "missing required field 'tokens'", "tokens", "missing_field");
      if (!it->is_array()) throw ApiError(400, "'tokens' must be a list of token ids", "tokens", "invalid_type");
      std::vector<int32_t> ids;
      for (const json& e : *it) {
        if (!e.is_number_integer()) throw ApiError(400, "'tokens' must be a list of integers", "tokens", "invalid_type");
        const long long v = e.get<long long>();
        if (v < 0 || v >= model.config.vocab)
          throw ApiError(400, "token id " + e.dump() + " is outside the vocabulary [0, " +
                                  std::to_string(model.config.vocab) + ")", "tokens", "invalid_value");
        ids.push_back(static_cast<int32_t>(v));
      }
      send_json(res, 200, {{"prompt", need_tok("tokens").decode(ids)}});
    });
  });
}

Server::Server(const std::string& model_dir, ServerOptions opts)
    : Server(Model::load(model_dir), model_dir, std::move(opts)) {}

Server::Server(Model model, const std::string& model_dir, ServerOptions opts)
    : impl_(std::make_unique<Impl>(std::move(model), model_dir, std::move(opts))) {}

Server::~Server() { stop(); }

int Server::bind() {
  if (impl_->bound_port > 0) return impl_->bound_port;
  const ServerOptions& o = impl_->opts;
  int p = -1;
  if (o.port == 0) p = impl_->http.bind_to_any_port(o.host);
  else if (impl_->http.bind_to_port(o.host, o.port)) p = o.port;
  if (p <= 0) throw std::runtime_error("server: cannot listen on " + o.host + ":" + std::to_string(o.port));
  ::listen(impl_->http.listening_socket(), SOMAXCONN);  // same socket, longer accept queue
  Connections::Options co;
  co.max_connections = o.max_connections;
  co.header_timeout_s = o.header_timeout_s;
  co.body_timeout_s = o.body_timeout_s;
  co.max_body = o.max_body_bytes;
  co.workers = o.http_threads > 0 ? o.http_threads : o.max_slots + 16;
  co.log = o.log_requests;
  impl_->conns = std::make_unique<Connections>(impl_->http, co, impl_->metrics);
  return impl_->bound_port = p;
}

void Server::serve() {
  bind();
  impl_->conns->run();
}

void Server::start() {
  bind();
  impl_->th = std::thread([this] { impl_->conns->run(); });
  for (int i = 0; !impl_->conns->running(); ++i) {
    if (i == 5000) throw std::runtime_error("server: did not start listening within 5 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void Server::stop() {
  if (!impl_) return;
  impl_->sched->stop();  // fails waiting / running requests so no HTTP worker stays blocked on one
  if (impl_->conns) impl_->conns->stop();
  if (impl_->th.joinable()) impl_->th.join();
  impl_->http.close_listener();  // bound but never served
}

int Server::port() const { return impl_->bound_port; }
const Model& Server::model() const { return impl_->model; }

}  // namespace elastic
