// The LibTorch-free safetensors parser (see safetensors_format.h for the rules enforced).
#include "harness/checkpoint/safetensors_format.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/checked_io.h"

namespace rh::ckpt {

namespace {

struct DtypeRow {
  StDtype d;
  const char* name;
  int64_t size;
};
const DtypeRow kDtypes[] = {
    {StDtype::F32, "F32", 4},         {StDtype::F16, "F16", 2}, {StDtype::BF16, "BF16", 2},
    {StDtype::F8_E4M3, "F8_E4M3", 1}, {StDtype::I16, "I16", 2}, {StDtype::U8, "U8", 1},
    {StDtype::I32, "I32", 4},         {StDtype::I64, "I64", 8}, {StDtype::F64, "F64", 8},
};
const DtypeRow& row(StDtype d) {
  for (const auto& r : kDtypes)
    if (r.d == d) return r;
  throw std::logic_error("unknown StDtype");
}


// Parses the header, rejecting duplicate keys at any depth (nlohmann keeps the last silently),
// nesting beyond kMaxJsonDepth and NUL bytes (nlohmann stops at the first NUL).
nlohmann::json parse_header(const std::string& path, const char* p, size_t n) {
  try {
    return parse_json_bounded(p, n, "header", unique_keys_callback([&path](const std::string& key) {
                                bad_safetensors(path, "duplicate key '" + quote_text(key) + "' in the header");
                              }));
  } catch (const std::invalid_argument& e) {
    bad_safetensors(path, e.what());
  }
}

}   // namespace

std::string st_name(StDtype d) { return row(d).name; }
int64_t st_itemsize(StDtype d) { return row(d).size; }
bool st_parse(const std::string& s, StDtype* out) {
  for (const auto& r : kDtypes)
    if (s == r.name) {
      *out = r.d;
      return true;
    }
  return false;
}

uint64_t TensorInfo::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

ParsedSafetensors parse_safetensors(const std::string& path, const uint8_t* data, uint64_t size) {
  ParsedSafetensors f;
  if (size < 8)
    bad_safetensors(path, "file has " + std::to_string(size) + " bytes, fewer than the 8-byte header length");
  uint64_t n;
  std::memcpy(&n, data, 8);
  if (n < 2) bad_safetensors(path, "header length " + std::to_string(n) + " < 2");
  if (n > kMaxHeaderBytes) bad_safetensors(path, "header length " + std::to_string(n) + " exceeds the 100 MB cap");
  if (n > size - 8)
    bad_safetensors(path, "header length " + std::to_string(n) + " runs past the end of the file (" +
                              std::to_string(size) + " bytes)");
  f.header_len = n;
  const char* h = reinterpret_cast<const char*>(data + 8);
  if (h[0] != '{') bad_safetensors(path, "header does not start with '{'");
  nlohmann::json j = parse_header(path, h, n);
  if (!j.is_object()) bad_safetensors(path, "header is not a JSON object");
  const uint64_t buffer = size - 8 - n;

  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& e = it.value();
    if (key == "__metadata__") {
      if (!e.is_object()) bad_safetensors(path, "__metadata__ is not an object");
      for (auto m = e.begin(); m != e.end(); ++m) {
        if (!m.value().is_string())
          bad_safetensors(path, "__metadata__ value of '" + quote_text(m.key()) + "' is not a string");
        f.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto tb = [&](const std::string& what) { bad_safetensors(path, "tensor '" + quote_text(key) + "': " + what); };
    if (key.empty()) bad_safetensors(path, "empty tensor key");
    if (!e.is_object()) tb("entry is not an object");
    for (auto m = e.begin(); m != e.end(); ++m)
      if (m.key() != "dtype" && m.key() != "shape" && m.key() != "data_offsets")
        tb("unexpected field '" + quote_text(m.key()) + "'");
    if (!e.contains("dtype") || !e["dtype"].is_string()) tb("missing or non-string dtype");
    TensorInfo ti;
    ti.key = key;
    if (!st_parse(e["dtype"].get<std::string>(), &ti.dtype))
      tb("unknown dtype '" + quote_text(e["dtype"].get<std::string>()) + "'");
    if (!e.contains("shape") || !e["shape"].is_array()) tb("missing or non-array shape");
    // numel * itemsize must fit: dimensions are capped so the product cannot overflow.
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) tb("shape entries must be integers >= 0, got " + quote_json(d));
      uint64_t v = d.get<uint64_t>();
      if (v > (1ull << 40) || (v != 0 && numel > (1ull << 60) / v)) tb("shape too large");
      numel *= v;
      ti.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = e.contains("data_offsets") ? e["data_offsets"] : nlohmann::json();
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      tb("data_offsets must be [begin, end] of integers >= 0");
    ti.begin = off[0].get<uint64_t>();
    ti.end = off[1].get<uint64_t>();
    if (ti.begin > ti.end) tb("data_offsets begin " + std::to_string(ti.begin) + " > end " + std::to_string(ti.end));
    if (ti.end > buffer)
      tb("data_offsets [" + std::to_string(ti.begin) + ", " + std::to_string(ti.end) +
         "] out of range: the data buffer has " + std::to_string(buffer) + " bytes");
    uint64_t want = numel * static_cast<uint64_t>(st_itemsize(ti.dtype));
    if (ti.end - ti.begin != want)
      tb("data_offsets span " + std::to_string(ti.end - ti.begin) + " bytes, expected numel " + std::to_string(numel) +
         " * itemsize " + std::to_string(st_itemsize(ti.dtype)) + " = " + std::to_string(want));
    f.tensors.push_back(std::move(ti));
  }

  // The tensors must tile the buffer: sorted by offset, each begins where the previous ended.
  std::vector<const TensorInfo*> by_off;
  for (const auto& t : f.tensors) by_off.push_back(&t);
  std::sort(by_off.begin(), by_off.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : by_off) {
    if (t->begin < cursor)
      bad_safetensors(path, "tensor '" + quote_text(t->key) + "' [" + std::to_string(t->begin) + ", " +
                                std::to_string(t->end) + ") overlaps tensor '" + quote_text(prev->key) +
                                "' ending at " + std::to_string(cursor));
    if (t->begin > cursor)
      bad_safetensors(path, "hole of " + std::to_string(t->begin - cursor) + " bytes before tensor '" +
                                quote_text(t->key) + "' at offset " + std::to_string(cursor));
    cursor = t->end;
    prev = t;
  }
  if (cursor != buffer)
    bad_safetensors(path, "file size " + std::to_string(size) + " != 8 + header " + std::to_string(n) +
                              " + tensor bytes " + std::to_string(cursor));
  return f;   // tensors are sorted by key: the JSON object iterates in key order
}

[[noreturn]] void bad_safetensors(const std::string& path, const std::string& what) {
  throw CheckpointError("safetensors file " + path + ": " + what);
}

}   // namespace rh::ckpt
