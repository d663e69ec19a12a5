// burstlab/env.hpp — every environment variable the project reads, declared once (src/env.cpp):
// its name, kind, value when unset, who reads it and what it does. C++ code reads a variable only
// through the typed getters below, which refuse a name the table lacks; scripts, the Python
// package, its tests and the notebooks read theirs directly, and the table lists them too.
// `burstlab env` prints the table with the current values; tests/tools/test_cli_env.cpp fails when
// the source reads a variable the table lacks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace burstlab::env {

enum class Kind {
  Flag,     // "0" or "1"
  Integer,  // a decimal integer
  Text,     // any text (a path, arguments, a count the reader parses itself)
};

struct Knob {
  const char* name;
  Kind kind;
  const char* fallback;  // what unset (or empty) means, as text; "" = nothing
  const char* read_by;   // the files that read it
  const char* meaning;
};

// The table, in the order `burstlab env` prints it.
const std::vector<Knob>& knobs();

// The declared knob of this name. A name the table lacks is a bug of the reader, not bad input:
// std::logic_error.
const Knob& knob(std::string_view name);

// The variable's text; nullopt when unset or empty.
std::optional<std::string> text(std::string_view name);

// A Flag knob: "1" true, "0" false, unset or empty: its fallback. Any other text: Error naming
// the variable and its value.
bool flag(std::string_view name);

// An Integer knob: its decimal value, unset or empty: its fallback (none: Error). Any other text:
// Error naming the variable and its value.
int64_t integer(std::string_view name);

// Every Flag and Integer knob read by C++ code (a reader in read_by is a C++ file) that is set:
// parsed, the first malformed one an Error. Programs call it first, so that a bad value is
// refused before any work rather than where it is read.
void validate();

const char* to_string(Kind k);

}  // namespace burstlab::env
