// tools/table.cpp — see table.hpp.
#include "table.hpp"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <stdexcept>

namespace burstlab::tools {

std::string format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string s(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(&s[0], s.size() + 1, fmt, ap2);
  va_end(ap2);
  return s;
}

Json json_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

Cell text(const std::string& s) { return Cell{s, s}; }
Cell integer(int64_t v) { return Cell{std::to_string(v), v}; }
Cell number(double v, const char* fmt) {
  if (!std::isfinite(v)) return Cell{std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"), json_number(v)};
  return Cell{format(fmt, v), v};
}
Cell missing() { return Cell{"-", nullptr}; }

void Table::add(std::vector<Cell> row) {
  if (row.size() != columns.size())
    throw std::logic_error("table row has " + std::to_string(row.size()) + " cells for " +
                           std::to_string(columns.size()) + " columns");
  rows.push_back(std::move(row));
}

void Table::print(std::FILE* out) const {
  std::vector<size_t> w(columns.size());
  for (size_t c = 0; c < columns.size(); ++c) {
    w[c] = columns[c].header.size();
    for (const auto& r : rows) w[c] = std::max(w[c], r[c].text.size());
  }
  auto line = [&](auto cell_text) {
    std::string s;
    for (size_t c = 0; c < columns.size(); ++c) {
      const std::string t = cell_text(c);
      const std::string pad(w[c] - t.size(), ' ');
      if (c) s += "  ";
      s += columns[c].left ? t + pad : pad + t;
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    std::fprintf(out, "%s\n", s.c_str());
  };
  line([&](size_t c) { return columns[c].header; });
  line([&](size_t c) { return std::string(w[c], '-'); });
  for (const auto& r : rows) line([&](size_t c) { return r[c].text; });
  std::fflush(out);
}

Json Table::json() const {
  Json a = Json::array();
  for (const auto& r : rows) {
    Json o = Json::object();
    for (size_t c = 0; c < columns.size(); ++c) o[columns[c].key] = r[c].value;
    a.push_back(std::move(o));
  }
  return a;
}

}  // namespace burstlab::tools
