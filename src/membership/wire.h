// Little-endian field codec shared by the bootstrap and coordinator
// messages. The reader never reads past its buffer: every getter reports
// whether the field was whole, so decoders turn truncation into a reason.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace eccl::membership {

class WireWriter {
 public:
  void u8(uint8_t v) { raw(&v, 1); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void i64(int64_t v) { raw(&v, 8); }
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

class WireReader {
 public:
  WireReader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool u8(uint8_t* v) { return raw(v, 1); }
  bool u32(uint32_t* v) { return raw(v, 4); }
  bool u64(uint64_t* v) { return raw(v, 8); }
  bool i64(int64_t* v) { return raw(v, 8); }
  bool str(std::string* s, size_t max) {
    uint32_t len;
    if (!u32(&len) || len > max || n_ - pos_ < len) return false;
    s->assign(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return true;
  }
  bool atEnd() const { return pos_ == n_; }

 private:
  bool raw(void* out, size_t n) {
    if (n_ - pos_ < n) return false;
    std::memcpy(out, p_ + pos_, n);
    pos_ += n;
    return true;
  }
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

}  // namespace eccl::membership
