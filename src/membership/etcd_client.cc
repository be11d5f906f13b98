#include "membership/etcd_client.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/clock.h"
#include "common/error.h"
#include "common/socket.h"

namespace eccl::membership {
namespace {

using nlohmann::json;

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// The gateway answers with these (gRPC codes) when the node it reached
// cannot serve right now (no raft leader, a leader change, its own
// timeout); another node may.
bool retryableCode(int code) { return code == 4 || code == 10 || code == 14; }

// An answer the gateway gave, or why there was none.
struct HttpAnswer {
  int status = 0;
  std::string body;
};

std::string dechunk(const std::string& chunked, const std::string& where) {
  std::string out;
  size_t at = 0;
  for (;;) {
    size_t eol = chunked.find("\r\n", at);
    if (eol == std::string::npos) fail(ecclSystemError, "etcd at {}: truncated chunked answer", where);
    size_t length = std::stoul(chunked.substr(at, eol - at), nullptr, 16);
    if (length == 0) return out;
    if (eol + 2 + length > chunked.size()) fail(ecclSystemError, "etcd at {}: truncated chunk", where);
    out.append(chunked, eol + 2, length);
    at = eol + 2 + length + 2;
  }
}

// One POST on a fresh connection, read to its end (Connection: close).
HttpAnswer post(const std::string& endpoint, const std::string& path, const std::string& body, Deadline deadline) {
  SockAddr addr = SockAddr::parse(endpoint);
  // A refused connection is a node that is down: no retrying it here, the
  // caller moves on to the next endpoint.
  Fd fd = connectTo(addr, deadline, "etcd " + endpoint, [] { return true; });
  std::string request = "POST " + path + " HTTP/1.1\r\nHost: " + endpoint +
                        "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body;
  sendAll(fd.get(), request.data(), request.size(), deadline, "etcd " + endpoint);
  std::string raw;
  char buf[16384];
  for (;;) {
    pollfd p{fd.get(), POLLIN, 0};
    int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(msUntil(deadline), 60000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) fail(ecclSystemError, "etcd at {}: no answer to {} in time", endpoint, path);
    ssize_t got = ::recv(fd.get(), buf, sizeof buf, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) fail(ecclSystemError, "etcd at {}: {}", endpoint, strerror(errno));
    if (got == 0) break;
    raw.append(buf, static_cast<size_t>(got));
    if (raw.size() > (64u << 20)) fail(ecclSystemError, "etcd at {}: answer to {} over 64 MiB", endpoint, path);
  }
  size_t headEnd = raw.find("\r\n\r\n");
  if (raw.compare(0, 9, "HTTP/1.1 ") != 0 || headEnd == std::string::npos)
    fail(ecclSystemError, "etcd at {}: not an HTTP answer to {}", endpoint, path);
  HttpAnswer answer;
  answer.status = std::atoi(raw.c_str() + 9);
  std::string head = raw.substr(0, headEnd);
  std::transform(head.begin(), head.end(), head.begin(), [](unsigned char c) { return std::tolower(c); });
  answer.body = raw.substr(headEnd + 4);
  if (head.find("transfer-encoding: chunked") != std::string::npos) answer.body = dechunk(answer.body, endpoint);
  return answer;
}

std::string number(int64_t v) { return std::to_string(v); }

int64_t numberField(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return 0;  // proto3 JSON leaves zeros out
  return it->is_string() ? std::stoll(it->get<std::string>()) : it->get<int64_t>();
}

EtcdKeyValue keyValueFrom(const json& j) {
  EtcdKeyValue kv;
  kv.key = base64Decode(j.value("key", ""));
  kv.value = base64Decode(j.value("value", ""));
  kv.createRevision = numberField(j, "create_revision");
  kv.modRevision = numberField(j, "mod_revision");
  kv.version = numberField(j, "version");
  kv.lease = numberField(j, "lease");
  return kv;
}

// etcd's range end for "every key starting with prefix": the prefix with
// its last byte that is not 0xff incremented.
std::string prefixEnd(std::string prefix) {
  while (!prefix.empty() && static_cast<unsigned char>(prefix.back()) == 0xff) prefix.pop_back();
  if (prefix.empty()) return std::string(1, '\0');
  prefix.back() = static_cast<char>(static_cast<unsigned char>(prefix.back()) + 1);
  return prefix;
}

json writeJson(const EtcdWrite& w) {
  if (w.erase) {
    json d = {{"key", base64Encode(w.key)}};
    if (w.prefix) d["range_end"] = base64Encode(prefixEnd(w.key));
    return {{"request_delete_range", d}};
  }
  json p = {{"key", base64Encode(w.key)}, {"value", base64Encode(w.value)}};
  if (w.lease) p["lease"] = number(w.lease);
  return {{"request_put", p}};
}

json compareJson(const EtcdCompare& c) {
  json j = {{"key", base64Encode(c.key)}, {"result", c.result == EtcdCompare::Result::kEqual ? "EQUAL" : "NOT_EQUAL"}};
  switch (c.target) {
    case EtcdCompare::Target::kValue: j["target"] = "VALUE"; j["value"] = base64Encode(c.value); break;
    case EtcdCompare::Target::kCreateRevision: j["target"] = "CREATE"; j["create_revision"] = number(c.number); break;
    case EtcdCompare::Target::kVersion: j["target"] = "VERSION"; j["version"] = number(c.number); break;
    case EtcdCompare::Target::kLease: j["target"] = "LEASE"; j["lease"] = number(c.number); break;
  }
  return j;
}

json parsed(const std::string& text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    fail(ecclSystemError, "etcd: the answer to {} is not JSON ({})", path, e.what());
  }
}

}  // namespace

EtcdCompare EtcdCompare::valueIs(std::string key, std::string value) {
  EtcdCompare c;
  c.key = std::move(key);
  c.value = std::move(value);
  return c;
}

EtcdCompare EtcdCompare::absent(std::string key) {
  EtcdCompare c;
  c.key = std::move(key);
  c.target = Target::kCreateRevision;
  return c;
}

EtcdCompare EtcdCompare::leaseIs(std::string key, int64_t lease) {
  EtcdCompare c;
  c.key = std::move(key);
  c.target = Target::kLease;
  c.number = lease;
  return c;
}

EtcdWrite EtcdWrite::put(std::string key, std::string value, int64_t lease) {
  return EtcdWrite{std::move(key), std::move(value), lease, false, false};
}
EtcdWrite EtcdWrite::remove(std::string key) { return EtcdWrite{std::move(key), "", 0, true, false}; }
EtcdWrite EtcdWrite::removePrefix(std::string prefix) { return EtcdWrite{std::move(prefix), "", 0, true, true}; }

EtcdClient::EtcdClient(const std::string& endpoints, std::chrono::milliseconds timeout) : timeout_(timeout) {
  size_t at = 0;
  while (at <= endpoints.size()) {
    size_t comma = endpoints.find(',', at);
    std::string e = endpoints.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (e.rfind("http://", 0) == 0) e = e.substr(7);
    while (!e.empty() && e.back() == '/') e.pop_back();
    if (!e.empty()) {
      try {
        SockAddr::parse(e);
      } catch (const Error&) {
        fail(ecclInvalidArgument, "etcd endpoint '{}' is not IP:port (from '{}')", e, endpoints);
      }
      endpoints_.push_back(e);
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  ECCL_CHECK_ARG(!endpoints_.empty(), "no etcd endpoint in '{}'", endpoints);
  ECCL_CHECK_ARG(timeout.count() > 0, "etcd timeout must be positive");
}

std::string EtcdClient::call(const std::string& path, const std::string& body) {
  const Deadline deadline = Clock::now() + timeout_;
  // Each node gets a slice of the budget, so one that hangs (stopped, or
  // cut off) leaves time for the others; the last try gets what is left.
  const auto slice = std::max<std::chrono::milliseconds>(std::chrono::milliseconds(200),
                                                         timeout_ / (2 * static_cast<int64_t>(endpoints_.size())));
  // What each node said, each distinct answer once (a node tried many times
  // says the same thing many times).
  std::vector<std::vector<std::string>> said(endpoints_.size());
  auto note = [&](size_t index, std::string what) {
    if (std::find(said[index].begin(), said[index].end(), what) == said[index].end())
      said[index].push_back(std::move(what));
  };
  const size_t first = preferred_.load();
  for (size_t tried = 0; Clock::now() < deadline; ++tried) {
    const size_t index = (first + tried) % endpoints_.size();
    const std::string& endpoint = endpoints_[index];
    const Deadline attempt = std::min<Deadline>(deadline, Clock::now() + slice);
    std::optional<std::string> refusal;  // a definite answer: no other node would say otherwise
    try {
      HttpAnswer answer = post(endpoint, path, body, attempt);
      if (answer.status == 200) {
        preferred_.store(index);
        return answer.body;
      }
      json error = json::parse(answer.body, nullptr, false);
      int code = error.is_object() ? error.value("code", 0) : 0;
      std::string message = error.is_object() ? error.value("message", error.value("error", answer.body)) : answer.body;
      if (retryableCode(code))
        note(index, message);
      else
        refusal = fmt::format("etcd at {} refused {}: {} (HTTP {}, code {})", endpoint, path, message, answer.status,
                              code);
    } catch (const Error& e) {
      note(index, e.what());
    }
    if (refusal) throw Error(ecclSystemError, *refusal);
    if ((tried + 1) % endpoints_.size() == 0) {
      // Every node tried once: pause before the next round (an election
      // takes a few hundred milliseconds).
      std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(std::chrono::milliseconds(100),
                                                                      std::chrono::milliseconds(msUntil(deadline))));
    }
  }
  std::string list, why;
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    list += (list.empty() ? "" : ",") + endpoints_[i];
    std::string all;
    for (const auto& w : said[i]) all += (all.empty() ? "" : ", then ") + w;
    why += fmt::format("; {}: {}", endpoints_[i], all.empty() ? "not tried in time" : all);
  }
  fail(ecclSystemError, "etcd unreachable within {} ms for {} (endpoints {}){}", timeout_.count(), path, list, why);
}

int64_t EtcdClient::grantLease(int64_t ttlSeconds) {
  ECCL_CHECK_ARG(ttlSeconds > 0, "etcd lease TTL must be positive (got {})", ttlSeconds);
  json answer = parsed(call("/v3/lease/grant", json{{"TTL", number(ttlSeconds)}}.dump()), "lease grant");
  int64_t id = numberField(answer, "ID");
  if (id == 0) fail(ecclSystemError, "etcd granted no lease: {}", answer.dump());
  return id;
}

int64_t EtcdClient::keepAlive(int64_t lease) {
  // The gateway streams keep-alive answers; one request gets one line.
  std::string text = call("/v3/lease/keepalive", json{{"ID", number(lease)}}.dump());
  json answer = parsed(text.substr(0, text.find('\n')), "lease keepalive");
  return numberField(answer.contains("result") ? answer["result"] : answer, "TTL");
}

void EtcdClient::revokeLease(int64_t lease) {
  try {
    call("/v3/lease/revoke", json{{"ID", number(lease)}}.dump());
  } catch (const Error& e) {
    if (std::string(e.what()).find("lease not found") == std::string::npos) throw;
  }
}

std::optional<EtcdKeyValue> EtcdClient::get(const std::string& key) {
  json answer = parsed(call("/v3/kv/range", json{{"key", base64Encode(key)}}.dump()), "range");
  if (!answer.contains("kvs") || answer["kvs"].empty()) return std::nullopt;
  return keyValueFrom(answer["kvs"][0]);
}

std::vector<EtcdKeyValue> EtcdClient::getPrefix(const std::string& prefix) {
  json body = {{"key", base64Encode(prefix)}, {"range_end", base64Encode(prefixEnd(prefix))}};
  json answer = parsed(call("/v3/kv/range", body.dump()), "range");
  std::vector<EtcdKeyValue> out;
  if (answer.contains("kvs"))
    for (const auto& kv : answer["kvs"]) out.push_back(keyValueFrom(kv));
  return out;
}

void EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  json body = {{"key", base64Encode(key)}, {"value", base64Encode(value)}};
  if (lease) body["lease"] = number(lease);
  call("/v3/kv/put", body.dump());
}

bool EtcdClient::transaction(const std::vector<EtcdCompare>& compares, const std::vector<EtcdWrite>& onSuccess,
                             const std::vector<EtcdWrite>& onFailure) {
  json body = {{"compare", json::array()}, {"success", json::array()}, {"failure", json::array()}};
  for (const auto& c : compares) body["compare"].push_back(compareJson(c));
  for (const auto& w : onSuccess) body["success"].push_back(writeJson(w));
  for (const auto& w : onFailure) body["failure"].push_back(writeJson(w));
  json answer = parsed(call("/v3/kv/txn", body.dump()), "txn");
  return answer.value("succeeded", false);
}

std::string base64Encode(const std::string& bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t v = static_cast<unsigned char>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) v |= static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

std::string base64Decode(const std::string& text) {
  auto digit = [&](char c) -> uint32_t {
    const char* at = std::strchr(kAlphabet, c);
    if (c == '\0' || !at) fail(ecclSystemError, "etcd: malformed base64 '{}'", text.substr(0, 64));
    return static_cast<uint32_t>(at - kAlphabet);
  };
  if (text.size() % 4 != 0) fail(ecclSystemError, "etcd: base64 of length {} is malformed", text.size());
  std::string out;
  for (size_t i = 0; i < text.size(); i += 4) {
    uint32_t v = digit(text[i]) << 18 | digit(text[i + 1]) << 12;
    out += static_cast<char>((v >> 16) & 0xff);
    if (text[i + 2] == '=') break;
    v |= digit(text[i + 2]) << 6;
    out += static_cast<char>((v >> 8) & 0xff);
    if (text[i + 3] == '=') break;
    v |= digit(text[i + 3]);
    out += static_cast<char>(v & 0xff);
  }
  return out;
}

}  // namespace eccl::membership
