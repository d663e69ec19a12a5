// burstlab/names.hpp — an enum's names written once, as a table: to_string, the parser and the
// parser's error ("field (value) must be one of a, b, c") all read the same list, so a new value
// cannot be printable but unparsable, or listed in the wrong order in the message.
#pragma once

#include <cstddef>
#include <string>

#include "burstlab/error.hpp"

namespace burstlab {

template <class E>
struct Named {
  E value;
  const char* name;
};

// The name of v; "?" for a value the table lacks (a cast from an out-of-range integer).
template <class E, size_t N>
const char* name_of(E v, const Named<E> (&table)[N]) {
  for (const Named<E>& n : table)
    if (n.value == v) return n.name;
  return "?";
}

// The value named s, else an Error naming the field, the value and every name in table order.
template <class E, size_t N>
E parse_named(const std::string& s, const Named<E> (&table)[N], const char* field) {
  std::string names;
  for (const Named<E>& n : table) {
    if (s == n.name) return n.value;
    names += (names.empty() ? "" : ", ") + std::string(n.name);
  }
  fail(field, " (", s, ") must be one of ", names);
}

// The item of a list of records with a `name` member (the presets) called `name`, with the same
// error as parse_named.
template <class List>
const typename List::value_type& find_named(const List& items, const std::string& name, const char* field) {
  std::string names;
  for (const auto& item : items) {
    if (item.name == name) return item;
    names += (names.empty() ? "" : ", ") + std::string(item.name);
  }
  fail(field, " (", name, ") must be one of ", names);
}

}  // namespace burstlab
