// tests/contract/test_dispatch_env.cpp — dispatch_dtype (burstlab/dispatch.hpp) picks the storage
// type each Dtype names; the env getters (burstlab/env.hpp) parse, fall back and refuse as declared.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "burstlab/dispatch.hpp"
#include "burstlab/env.hpp"

namespace {

using namespace burstlab;
using ::testing::HasSubstr;

TEST(DispatchDtype, EachDtypeGivesItsStorageType) {
  for (Dtype t : {Dtype::F64, Dtype::F32, Dtype::BF16, Dtype::F16}) {
    const Dtype back = dispatch_dtype(t, [](auto tag) { return dtype_of<typename decltype(tag)::type>(); });
    EXPECT_EQ(back, t);
    const int64_t bytes = dispatch_dtype(t, [](auto tag) { return int64_t(sizeof(typename decltype(tag)::type)); });
    EXPECT_EQ(bytes, bytes_of(t));
  }
  bool ran = false;  // a void f
  dispatch_dtype(Dtype::BF16, [&](auto tag) { ran = std::is_same_v<typename decltype(tag)::type, bf16_t>; });
  EXPECT_TRUE(ran);
  EXPECT_THROW(dispatch_dtype(static_cast<Dtype>(17), [](auto) { return 0; }), Error);
}

// Each test sets and clears the variables it reads (ctest runs every test in its own process).
struct Scoped {
  const char* name;
  Scoped(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~Scoped() { unsetenv(name); }
};

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(Env, FlagParsesZeroOneAndFallsBack) {
  unsetenv("BURSTLAB_TEST_BROKEN_IMPL");
  EXPECT_FALSE(env::flag("BURSTLAB_TEST_BROKEN_IMPL"));  // fallback 0
  {
    Scoped s("BURSTLAB_TEST_BROKEN_IMPL", "1");
    EXPECT_TRUE(env::flag("BURSTLAB_TEST_BROKEN_IMPL"));
    EXPECT_EQ(env::text("BURSTLAB_TEST_BROKEN_IMPL"), "1");
  }
  {
    Scoped s("BURSTLAB_TEST_BROKEN_IMPL", "");  // empty = unset
    EXPECT_FALSE(env::flag("BURSTLAB_TEST_BROKEN_IMPL"));
    EXPECT_EQ(env::text("BURSTLAB_TEST_BROKEN_IMPL"), std::nullopt);
  }
  {
    Scoped s("BURSTLAB_TEST_BROKEN_IMPL", "yes");
    EXPECT_THROW(env::flag("BURSTLAB_TEST_BROKEN_IMPL"), Error);
    EXPECT_EQ(message_of([] { env::flag("BURSTLAB_TEST_BROKEN_IMPL"); }),
              "BURSTLAB_TEST_BROKEN_IMPL (yes) must be 0 or 1");
    EXPECT_THROW(env::validate(), Error);
  }
  unsetenv("BURSTLAB_CUDA_CACHE");
  EXPECT_TRUE(env::flag("BURSTLAB_CUDA_CACHE"));  // fallback 1
}

TEST(Env, IntegerParsesAndRefusesText) {
  unsetenv("BURSTLAB_V4_GRID");
  EXPECT_EQ(env::integer("BURSTLAB_V4_GRID"), 0);
  {
    Scoped s("BURSTLAB_V4_GRID", "-1");
    EXPECT_EQ(env::integer("BURSTLAB_V4_GRID"), -1);
  }
  {
    Scoped s("BURSTLAB_V4_GRID", "3x");
    EXPECT_EQ(message_of([] { env::integer("BURSTLAB_V4_GRID"); }), "BURSTLAB_V4_GRID (3x) must be an integer");
    EXPECT_THROW(env::validate(), Error);
  }
  EXPECT_NO_THROW(env::validate());
}

TEST(Env, UndeclaredOrMistypedReadsAreBugs) {
  // A variable, not a literal: test_cli_env.cpp counts a literal name read as a real read.
  const std::string undeclared = "BURSTLAB_NOT_DECLARED";
  EXPECT_THROW(env::text(undeclared), std::logic_error);
  EXPECT_THAT(message_of([&] { env::flag(undeclared); }), HasSubstr("not declared in src/env.cpp"));
  EXPECT_THROW(env::integer("BURSTLAB_CUDA_CACHE"), std::logic_error);  // a flag read as an integer
  EXPECT_THROW(env::flag("BURSTLAB_V4_GRID"), std::logic_error);
}

TEST(Env, TableNamesAreUniqueAndFallbacksParse) {
  std::set<std::string> names;
  for (const env::Knob& k : env::knobs()) {
    EXPECT_TRUE(names.insert(k.name).second) << k.name;
    EXPECT_FALSE(std::string(k.meaning).empty()) << k.name;
    const std::string fallback = k.fallback;
    if (k.kind == env::Kind::Flag) {
      EXPECT_TRUE(fallback == "0" || fallback == "1") << k.name;
    }
    if (k.kind == env::Kind::Integer && !fallback.empty()) {  // empty: no default (torchrun's RANK)
      EXPECT_NO_THROW(std::stoll(fallback)) << k.name;
    }
  }
}

}  // namespace
