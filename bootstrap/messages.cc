#include "bootstrap/messages.h"

#include <cstring>

#include "common/error.h"
#include "common/socket.h"

namespace eccl::bootstrap {
namespace {

class Writer {
 public:
  void u32(uint32_t v) { raw(&v, 4); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  void raw(const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool u32(uint32_t* v) {
    if (n_ - pos_ < 4) return false;
    std::memcpy(v, p_ + pos_, 4);
    pos_ += 4;
    return true;
  }
  bool str(std::string* s, size_t max) {
    uint32_t len;
    if (!u32(&len) || len > max || n_ - pos_ < len) return false;
    s->assign(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return true;
  }
  bool atEnd() const { return pos_ == n_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

constexpr uint32_t kRegistrationKind = 1;
constexpr uint32_t kTableKind = 2;

}  // namespace

std::vector<uint8_t> encodeRegistration(const Registration& r) {
  Writer w;
  w.u32(kRegistrationKind);
  w.u32(r.rank);
  w.u32(r.nranks);
  w.str(r.dataAddress);
  return w.take();
}

std::optional<Registration> decodeRegistration(const uint8_t* p, size_t n, std::string* why) {
  Reader r(p, n);
  Registration out;
  uint32_t kind;
  if (!r.u32(&kind) || kind != kRegistrationKind) {
    *why = "not a registration message";
    return std::nullopt;
  }
  if (!r.u32(&out.rank) || !r.u32(&out.nranks) || !r.str(&out.dataAddress, kMaxAddressBytes) ||
      !r.atEnd()) {
    *why = "registration message is truncated or has trailing bytes";
    return std::nullopt;
  }
  if (out.nranks == 0 || out.rank >= out.nranks) {
    *why = fmt::format("registration names rank {} of {}", out.rank, out.nranks);
    return std::nullopt;
  }
  return out;
}

std::vector<uint8_t> encodeAddressTable(const AddressTable& t) {
  Writer w;
  w.u32(kTableKind);
  w.str(t.error);
  w.u32(static_cast<uint32_t>(t.addresses.size()));
  for (const auto& a : t.addresses) w.str(a);
  return w.take();
}

std::optional<AddressTable> decodeAddressTable(const uint8_t* p, size_t n, std::string* why) {
  Reader r(p, n);
  AddressTable out;
  uint32_t kind, count;
  if (!r.u32(&kind) || kind != kTableKind) {
    *why = "not an address table";
    return std::nullopt;
  }
  if (!r.str(&out.error, 4096) || !r.u32(&count) || count > kMaxMessageBytes / 4) {
    *why = "address table header is malformed";
    return std::nullopt;
  }
  for (uint32_t i = 0; i < count; ++i) {
    std::string a;
    if (!r.str(&a, kMaxAddressBytes)) {
      *why = fmt::format("address table entry {} is malformed", i);
      return std::nullopt;
    }
    out.addresses.push_back(std::move(a));
  }
  if (!r.atEnd()) {
    *why = "address table has trailing bytes";
    return std::nullopt;
  }
  return out;
}

void sendMessage(int fd, const std::vector<uint8_t>& body, Deadline deadline, const std::string& what) {
  uint32_t len = static_cast<uint32_t>(body.size());
  sendAll(fd, &len, 4, deadline, what);
  sendAll(fd, body.data(), body.size(), deadline, what);
}

std::vector<uint8_t> recvMessage(int fd, Deadline deadline, const std::string& what) {
  uint32_t len = 0;
  recvAll(fd, &len, 4, deadline, what);
  if (len > kMaxMessageBytes)
    fail(ecclRemoteError, "{}: message of {} bytes exceeds the limit {}", what, len, kMaxMessageBytes);
  std::vector<uint8_t> body(len);
  recvAll(fd, body.data(), len, deadline, what);
  return body;
}

}  // namespace eccl::bootstrap
