#pragma once
// The store's wire format. Every message is a frame: a 4-byte little-endian payload length,
// then the payload. A request payload is an opcode byte and its fields; strings and byte
// strings are a 4-byte length and the bytes. Replies echo nothing: the client is synchronous,
// one request in flight per connection, so a reply always answers the last request.
//
//   HELLO token          -> OK | ERROR message (then the server closes)   first frame, always
//   SET key value        -> OK
//   GET key              -> VALUE bytes        (the server holds the reply until the key exists)
//   ADD key i64          -> VALUE i64
//   WAIT n key...        -> OK                 (held until every key exists)
//   CHECK n key...       -> VALUE bytes        (now: one '1' or '0' per key, present or not)

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idist::detail::wire {

enum class Op : std::uint8_t { hello = 1, set = 2, get = 3, add = 4, wait = 5, check = 6 };
enum class Reply : std::uint8_t { ok = 0x80, value = 0x81, error = 0x82 };

// Bounds that keep one misbehaving client from bloating the store.
inline constexpr std::uint32_t kMaxFrame = 64u << 20;
inline constexpr std::uint32_t kMaxKeys = 1u << 16;

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

}  // namespace idist::detail::wire
