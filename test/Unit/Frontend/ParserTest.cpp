//===- ParserTest.cpp - Tests of the cell language's parser ---------------===//

#include "FrontendTestUtil.h"

#include "gtest/gtest.h"

using namespace cellc;
using cellc::testing::Source;

static const char *kLstm = R"(cell lstm {
  input x: [I]
  state h: [H], c: [H]
  param W_ih: [4*H, I], W_hh: [4*H, H], b_ih: [4*H], b_hh: [4*H]
  i, f, g, o = chunk(W_ih @ x + b_ih + W_hh @ h + b_hh, 4)
  c = sigmoid(f) * c + sigmoid(i) * tanh(g)
  h = sigmoid(o) * tanh(c)
  output h
})";

TEST(ParserTest, ParsesTheLstm) {
  Source src(kLstm);
  auto cell = src.parse();
  ASSERT_TRUE(cell) << src.diagnostics();
  EXPECT_EQ(cell->ident.name, "lstm");
  ASSERT_EQ(cell->decls.size(), 7u);
  EXPECT_EQ(cell->decls[0].kind, DeclKind::Input);
  EXPECT_EQ(cell->decls[2].ident.name, "c");
  EXPECT_EQ(cell->decls[2].kind, DeclKind::State);
  ASSERT_EQ(cell->decls[3].shape.size(), 2u);
  EXPECT_EQ(cell->decls[3].shape[0].terms[0].coefficient, 4);
  EXPECT_EQ(cell->decls[3].shape[0].terms[0].symbols[0].name, "H");
  ASSERT_EQ(cell->stmts.size(), 4u);
  EXPECT_EQ(cell->stmts[0].names.size(), 4u);
  EXPECT_EQ(cell->stmts[0].value->kind, Expr::Kind::Call);
  EXPECT_EQ(cell->stmts[3].kind, Stmt::Kind::Output);
  EXPECT_TRUE(src.diagnostics().empty());
}

/// Parses `h = <expr>` and returns the expression's tree, printed (the
/// cell's lines before it, the same for every expression, dropped).
static std::string parseExpr(llvm::StringRef expr) {
  std::string text =
      ("cell t { state h: [H]\n h = " + expr + "\n}").str();
  Source src(text);
  auto cell = src.parse();
  if (!cell)
    return "error: " + src.diagnostics();
  std::string out;
  llvm::raw_string_ostream os(out);
  cell->dump(os);
  llvm::StringRef tree = os.str();
  llvm::StringRef prefix = "Cell t\n  state h: [H]\n  Assign h\n";
  EXPECT_TRUE(tree.starts_with(prefix)) << tree.str();
  return tree.drop_front(prefix.size()).str();
}

/// How operators group: '*' and '@' bind tighter than '+', '-' groups to
/// the left, and unary minus takes a parenthesized operand whole.
TEST(ParserTest, PrecedenceAndAssociativity) {
  struct Case {
    const char *expr;
    const char *tree;
  };
  const Case cases[] = {
      {"a + b * c",
       "    Binary +\n      Name a\n      Binary *\n        Name b\n"
       "        Name c\n"},
      {"W @ x + b",
       "    Binary +\n      Binary @\n        Name W\n        Name x\n"
       "      Name b\n"},
      {"a - b - c",
       "    Binary -\n      Binary -\n        Name a\n        Name b\n"
       "      Name c\n"},
      {"-(a + 1)", "    Neg\n      Binary +\n        Name a\n"
                   "        Number 1\n"},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(c.expr);
    EXPECT_EQ(parseExpr(c.expr), c.tree);
  }
}

TEST(ParserTest, ReportsEmptyFiles) {
  for (const char *text : {"", "   \n# only a comment\n"}) {
    Source src(text);
    EXPECT_FALSE(src.parse());
    EXPECT_NE(src.diagnostics().find("test.cell:1:1: error: empty cell source"),
              std::string::npos)
        << src.diagnostics();
  }
}

TEST(ParserTest, ReportsTheLineAndColumnOfAnError) {
  Source src("cell t {\n  state h: [H]\n  h = (x + \n}");
  EXPECT_FALSE(src.parse());
  EXPECT_NE(src.diagnostics().find(
                "test.cell:4:1: error: expected an expression, found '}'"),
            std::string::npos)
      << src.diagnostics();
}

TEST(ParserTest, DeepNestingIsAnErrorNotACrash) {
  std::string text = "cell t { state h: [H]\n h = " + std::string(10000, '(') +
                     "h" + std::string(10000, ')') + "\n}";
  Source src(text);
  EXPECT_FALSE(src.parse());
  EXPECT_NE(src.diagnostics().find("nested too deeply"), std::string::npos);
}

TEST(ParserTest, LongOperatorChainsAreBounded) {
  std::string expr = "h";
  for (int i = 0; i < 5000; ++i)
    expr += " + h";
  Source src("cell t { state h: [H]\n h = " + expr + "\n}");
  EXPECT_FALSE(src.parse());
  EXPECT_NE(src.diagnostics().find("expression is too deep"),
            std::string::npos);
}

TEST(ParserTest, RejectsASecondCell) {
  Source src("cell a { state h: [H] h = h }\ncell b { state h: [H] h = h }");
  EXPECT_FALSE(src.parse());
  EXPECT_NE(src.diagnostics().find("test.cell:2:1: error: expected end of file"),
            std::string::npos)
      << src.diagnostics();
}

TEST(ParserTest, TakesBlocksOfThreeDimensionsAndRejectsFour) {
  EXPECT_TRUE(Source("cell t { param W: [G, H, H] }").parse());
  Source src("cell t { param W: [G, H, H, H] }");
  EXPECT_FALSE(src.parse());
  EXPECT_NE(src.diagnostics().find("found 4 dimensions"), std::string::npos);
}
