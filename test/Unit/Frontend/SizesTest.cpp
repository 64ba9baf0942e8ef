//===- SizesTest.cpp - Tests of symbolic size binding ---------------------===//

#include "FrontendTestUtil.h"
#include "compiler/Frontend/Sizes.h"

#include "gtest/gtest.h"

using namespace cellc;
using cellc::testing::Source;

TEST(SizesTest, ParsesBindings) {
  auto binding = parseSizeBinding("H=256");
  ASSERT_TRUE(static_cast<bool>(binding));
  EXPECT_EQ(binding->first, "H");
  EXPECT_EQ(binding->second, 256);
}

TEST(SizesTest, RejectsBadBindings) {
  for (const char *text : {"H", "H=", "=4", "H=x", "H=0", "H=-3", "4H=2",
                           "H=99999999999", "H=2147483648"}) {
    auto binding = parseSizeBinding(text);
    EXPECT_FALSE(static_cast<bool>(binding)) << text;
    llvm::consumeError(binding.takeError());
  }
}

/// Parses a one-param cell with the given shape and evaluates its sizes.
static std::vector<std::optional<int64_t>>
evaluate(llvm::StringRef shape, const SizeBindings &bindings,
         std::string *diagnostics = nullptr) {
  Source src(("cell t { param p: [" + shape + "] }").str());
  auto cell = src.parse();
  std::vector<std::optional<int64_t>> values;
  if (!cell)
    return values;
  for (const SizeExpr &size : cell->decls[0].shape)
    values.push_back(evaluateSize(size, bindings, src.diag));
  if (diagnostics)
    *diagnostics = src.diagnostics();
  return values;
}

TEST(SizesTest, EvaluatesMultiplesAndSums) {
  auto values = evaluate("4*H, H + 2*I", {{"H", 8}, {"I", 3}});
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(values[0], 32);
  EXPECT_EQ(values[1], 14);
  EXPECT_EQ(evaluate("H*4*2", {{"H", 5}})[0], 40);
  EXPECT_EQ(evaluate("7", {})[0], 7);
}

TEST(SizesTest, ReportsUnboundNamesAtTheirColumn) {
  std::string diagnostics;
  auto values = evaluate("4*K", {{"H", 8}}, &diagnostics);
  ASSERT_EQ(values.size(), 1u);
  EXPECT_FALSE(values[0]);
  EXPECT_NE(diagnostics.find("test.cell:1:22: error: unbound size 'K'"),
            std::string::npos)
      << diagnostics;
}

TEST(SizesTest, ReportsOverflow) {
  std::string diagnostics;
  auto values = evaluate("H*H*H*H", {{"H", 1 << 20}}, &diagnostics);
  EXPECT_FALSE(values[0]);
  EXPECT_NE(diagnostics.find("is larger than"), std::string::npos);
}

TEST(SizesTest, ReportsZeroSizes) {
  std::string diagnostics;
  auto values = evaluate("0*H", {{"H", 4}}, &diagnostics);
  EXPECT_FALSE(values[0]);
  EXPECT_NE(diagnostics.find("sizes must be positive"), std::string::npos);
}
