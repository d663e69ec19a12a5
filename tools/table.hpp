// tools/table.hpp — fixed-width text tables with a JSON twin (docs/design.md §8: a header row
// with units, fixed-width columns, machine-readable JSON on request).
// Every cell carries its display text and its typed JSON value, so the two never disagree.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace burstlab::tools {

using Json = nlohmann::ordered_json;

struct Cell {
  std::string text;  // what the table shows
  Json value;        // what --json emits
};
Cell text(const std::string& s);
Cell integer(int64_t v);
// printf-style number ("%.3f", "%.2e"); non-finite values show as inf / nan and are emitted as
// the strings "inf", "-inf", "nan" (JSON has no non-finite numbers).
Cell number(double v, const char* fmt);
Cell missing();  // "-" / null

// JSON value of a double that may be non-finite (see number()).
Json json_number(double v);

struct Column {
  std::string key;     // JSON key
  std::string header;  // table header, units included: "time(ms)"
  bool left = false;   // left-aligned (text) or right-aligned (numbers)
};

struct Table {
  std::vector<Column> columns;
  std::vector<std::vector<Cell>> rows;  // each row has columns.size() cells

  void add(std::vector<Cell> row);
  // Header, a rule, then the rows; widths = the widest cell of each column.
  void print(std::FILE* out) const;
  // [{key: value, ...}, ...]
  Json json() const;
};

// printf into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace burstlab::tools
