// Bootstrap messages: length-prefixed, little-endian, validated on decode.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"

namespace eccl::bootstrap {

constexpr size_t kMaxMessageBytes = 1 << 20;
constexpr size_t kMaxAddressBytes = 128;

// A rank tells the root where its data listener is.
struct Registration {
  uint32_t rank = 0;
  uint32_t nranks = 0;
  std::string dataAddress;
};

// The root answers with every rank's address, or with an error.
struct AddressTable {
  std::string error;
  std::vector<std::string> addresses;
};

std::vector<uint8_t> encodeRegistration(const Registration& r);
std::optional<Registration> decodeRegistration(const uint8_t* p, size_t n, std::string* why);
std::vector<uint8_t> encodeAddressTable(const AddressTable& t);
std::optional<AddressTable> decodeAddressTable(const uint8_t* p, size_t n, std::string* why);

void sendMessage(int fd, const std::vector<uint8_t>& body, Deadline deadline, const std::string& what);
std::vector<uint8_t> recvMessage(int fd, Deadline deadline, const std::string& what);

}  // namespace eccl::bootstrap
