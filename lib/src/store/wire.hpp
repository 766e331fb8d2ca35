#pragma once
// The store's wire format. Every message is a frame: a 4-byte little-endian payload length,
// then the payload. A request payload is an opcode byte and its fields; strings and byte
// strings are a 4-byte length and the bytes. Replies echo nothing: the client is synchronous,
// one request in flight per connection, so a reply always answers the last request.
//
//   HELLO token          -> OK | ERROR message (then the server closes)   first frame, always
//                           | BUSY message: the store closed this connection to make room
//                             (at its connection limit, or out of descriptors), and the
//                             client may try again (sent at once, even before the hello
//                             arrives)
//                           ERROR is final: a wrong token, or a store that can make no room
//                           (every connection it holds is the job's own) names its cause, and
//                           the client gives up at once with it rather than retry until its
//                           deadline (also sent before the hello arrives).
//   SET key value        -> OK
//   GET key              -> VALUE bytes        (the server holds the reply until the key exists)
//   ADD key i64          -> VALUE i64
//   WAIT n key...        -> OK                 (held until every key exists)
//   CHECK n key...       -> VALUE bytes        (now: one '1' or '0' per key, present or not)
//
// Any request may instead be answered ERROR message when it is well formed but refused (too
// many keys, the store is full, add on a non-integer); the connection stays usable. A frame
// whose length is out of bounds, or whose payload does not parse, is not answered: the server
// drops the connection.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idist::detail::wire {

enum class Op : std::uint8_t { hello = 1, set = 2, get = 3, add = 4, wait = 5, check = 6 };
enum class Reply : std::uint8_t { ok = 0x80, value = 0x81, error = 0x82, busy = 0x83 };

// Bounds that keep one misbehaving client from bloating the store.
inline constexpr std::uint32_t kMaxFrame = 64u << 20;
inline constexpr std::uint32_t kMaxKeys = 1u << 16;
// Until a client has presented the token it is a stranger: it may make us buffer no more than
// a hello needs.
inline constexpr std::uint32_t kMaxHelloFrame = 4096;
// The ERROR message that answers a hello with the wrong token; the client words it for the user.
inline constexpr std::string_view kWrongToken = "wrong job token";

class Writer {
 public:
  explicit Writer(std::uint8_t code) { buf_.resize(4); buf_.push_back(static_cast<char>(code)); }
  Writer& u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& i64(std::int64_t v) {
    auto u = static_cast<std::uint64_t>(v);
    for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& bytes(std::string_view s) {
    u32(static_cast<std::uint32_t>(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
    return *this;
  }
  // The finished frame, length header filled in; the writer is spent afterwards.
  std::vector<char> frame() {
    const auto n = static_cast<std::uint32_t>(buf_.size() - 4);
    for (int i = 0; i < 4; ++i) buf_[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return std::move(buf_);
  }

 private:
  std::vector<char> buf_;
};

inline std::uint32_t read_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// Reads fields out of one payload; every accessor returns nullopt on a short or bad payload
// rather than reading past the end.
class Reader {
 public:
  explicit Reader(std::string_view payload) : rest_(payload) {}
  std::optional<std::uint8_t> code() {
    if (rest_.empty()) return std::nullopt;
    auto c = static_cast<std::uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return c;
  }
  std::optional<std::uint32_t> u32() {
    if (rest_.size() < 4) return std::nullopt;
    auto v = read_u32(rest_.data());
    rest_.remove_prefix(4);
    return v;
  }
  std::optional<std::int64_t> i64() {
    if (rest_.size() < 8) return std::nullopt;
    std::uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u |= static_cast<std::uint64_t>(static_cast<unsigned char>(rest_[i])) << (8 * i);
    rest_.remove_prefix(8);
    return static_cast<std::int64_t>(u);
  }
  std::optional<std::string_view> bytes() {
    auto n = u32();
    if (!n || rest_.size() < *n) return std::nullopt;
    auto s = rest_.substr(0, *n);
    rest_.remove_prefix(*n);
    return s;
  }
  bool done() const { return rest_.empty(); }

 private:
  std::string_view rest_;
};

// Why a frame header announcing `length` payload bytes must be refused, or nullptr when the
// payload may be read. `limit` is kMaxFrame, or kMaxHelloFrame before the hello.
inline const char* check_frame_length(std::uint32_t length, std::uint32_t limit) {
  if (length == 0) return "empty frame";
  if (length > limit) return "frame length out of bounds";
  return nullptr;
}

// One decoded request. The views point into the payload it was parsed from.
struct Request {
  Op op = Op::hello;
  std::string_view token;  // hello
  std::string_view key;    // set, get, add
  std::string_view value;  // set
  std::int64_t delta = 0;  // add
  std::vector<std::string_view> keys;  // wait, check
};

struct ParseResult {
  std::optional<Request> request;
  const char* error = nullptr;  // why there is no request
  // The whole frame has been read either way, so the connection is still in step. False: a
  // request a correct client may send, refused with an ERROR reply. True: garbage, which only
  // a broken or hostile peer sends, so the server drops it.
  bool fatal = true;
};

// Decodes one request payload (the frame without its length header). Pure, so that the server
// and the fuzzer run the very same code; never reads past the payload, and allocates at most
// in proportion to it.
inline ParseResult parse_request(std::string_view payload) {
  auto malformed = [](const char* why) { return ParseResult{std::nullopt, why, true}; };
  Reader in(payload);
  const auto code = in.code();
  if (!code) return malformed("empty request");
  Request r;
  r.op = static_cast<Op>(*code);
  switch (r.op) {
    case Op::hello: {
      auto token = in.bytes();
      if (!token || !in.done()) return malformed("malformed hello");
      r.token = *token;
      return {std::move(r)};
    }
    case Op::set: {
      auto key = in.bytes();
      auto value = in.bytes();
      if (!key || !value || !in.done()) return malformed("malformed set");
      r.key = *key;
      r.value = *value;
      return {std::move(r)};
    }
    case Op::get: {
      auto key = in.bytes();
      if (!key || !in.done()) return malformed("malformed get");
      r.key = *key;
      return {std::move(r)};
    }
    case Op::add: {
      auto key = in.bytes();
      auto delta = in.i64();
      if (!key || !delta || !in.done()) return malformed("malformed add");
      r.key = *key;
      r.delta = *delta;
      return {std::move(r)};
    }
    case Op::wait:
    case Op::check: {
      auto n = in.u32();
      if (!n) return malformed("malformed wait or check");
      if (*n > kMaxKeys) return {std::nullopt, "too many keys in one request", false};
      for (std::uint32_t i = 0; i < *n; ++i) {
        auto key = in.bytes();
        if (!key) return malformed("malformed wait or check");
        r.keys.push_back(*key);
      }
      if (!in.done()) return malformed("malformed wait or check");
      return {std::move(r)};
    }
  }
  return malformed("unknown request");
}

}  // namespace idist::detail::wire
