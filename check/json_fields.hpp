// check/json_fields.hpp — strict JSON field access for the case files (case.cpp,
// lmhead_case.cpp): every error names the file and the field; unknown fields are errors.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "burstlab/error.hpp"

namespace burstlab::check::detail {

using Json = nlohmann::json;

struct Fields {
  const Json& j;
  std::string where;
  std::set<std::string> seen;
  const Json& get(const std::string& key) {
    seen.insert(key);
    if (!j.contains(key)) fail(where, ": missing field '", key, "'");
    return j.at(key);
  }
  bool has(const std::string& key) const { return j.contains(key); }
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) {
    const Json& v = get(key);
    if (!v.is_number_integer()) fail(where, ": field '", key, "' must be an integer, got ", v.dump());
    // get<int64_t> of a uint64 above INT64_MAX wraps: read the unsigned form first.
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
      fail(where, ": field '", key, "' (", v.dump(), ") must be in [", lo, ", ", hi, "]");
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) fail(where, ": field '", key, "' (", x, ") must be in [", lo, ", ", hi, "]");
    return x;
  }
  uint64_t uinteger(const std::string& key) {
    const Json& v = get(key);
    if (!v.is_number_unsigned()) fail(where, ": field '", key, "' must be a non-negative integer, got ", v.dump());
    return v.get<uint64_t>();
  }
  double number(const std::string& key) {
    const Json& v = get(key);
    if (!v.is_number()) fail(where, ": field '", key, "' must be a number, got ", v.dump());
    return v.get<double>();
  }
  bool boolean(const std::string& key) {
    const Json& v = get(key);
    if (!v.is_boolean()) fail(where, ": field '", key, "' must be true or false, got ", v.dump());
    return v.get<bool>();
  }
  std::string string(const std::string& key) {
    const Json& v = get(key);
    if (!v.is_string()) fail(where, ": field '", key, "' must be a string, got ", v.dump());
    return v.get<std::string>();
  }
  template <class T>
  std::vector<T> int_array(const std::string& key, int64_t lo, int64_t hi, size_t max_len) {
    const Json& v = get(key);
    if (!v.is_array()) fail(where, ": field '", key, "' must be an array of integers");
    if (v.size() > max_len) fail(where, ": field '", key, "' has ", v.size(), " entries (at most ", max_len, ")");
    std::vector<T> out;
    out.reserve(v.size());
    for (size_t k = 0; k < v.size(); ++k) {
      const Json& e = v[k];
      if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > static_cast<uint64_t>(hi)) ||
          e.get<int64_t>() < lo || e.get<int64_t>() > hi)
        fail(where, ": ", key, "[", k, "] (", e.dump(), ") must be an integer in [", lo, ", ", hi, "]");
      out.push_back(static_cast<T>(e.get<int64_t>()));
    }
    return out;
  }
  void no_others() const {
    for (auto it = j.begin(); it != j.end(); ++it)
      if (!seen.count(it.key())) fail(where, ": unknown field '", it.key(), "'");
  }
};

inline Json parse_json(const std::string& text, const std::string& where) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    fail(where, ": invalid JSON: ", e.what());
  }
  if (!j.is_object()) fail(where, ": must hold a JSON object");
  return j;
}

}  // namespace burstlab::check::detail
