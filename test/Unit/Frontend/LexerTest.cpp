//===- LexerTest.cpp - Tests of the cell language's lexer -----------------===//

#include "compiler/Frontend/Lexer.h"

#include "gtest/gtest.h"

#include <vector>

using namespace cellc;

static std::vector<Token> lexAll(llvm::StringRef text) {
  Lexer lexer(text);
  std::vector<Token> tokens;
  while (true) {
    tokens.push_back(lexer.next());
    if (tokens.back().is(TokenKind::Eof) || tokens.back().is(TokenKind::Error))
      return tokens;
  }
}

TEST(LexerTest, SplitsDeclarationsIntoTokens) {
  auto tokens = lexAll("param W: [4*H, I]");
  std::vector<TokenKind> kinds;
  for (const Token &tok : tokens)
    kinds.push_back(tok.kind);
  std::vector<TokenKind> expected = {
      TokenKind::KwParam,  TokenKind::Identifier, TokenKind::Colon,
      TokenKind::LBracket, TokenKind::Integer,    TokenKind::Star,
      TokenKind::Identifier, TokenKind::Comma,    TokenKind::Identifier,
      TokenKind::RBracket, TokenKind::Eof};
  EXPECT_EQ(kinds, expected);
  EXPECT_EQ(tokens[1].text, "W");
  EXPECT_EQ(tokens[4].text, "4");
}

TEST(LexerTest, SkipsCommentsAndNewlines) {
  auto tokens = lexAll("# a comment\n  h # trailing\n = 1");
  ASSERT_EQ(tokens.size(), 4u);
  EXPECT_EQ(tokens[0].text, "h");
  EXPECT_TRUE(tokens[1].is(TokenKind::Equal));
  EXPECT_TRUE(tokens[2].is(TokenKind::Integer));
}

TEST(LexerTest, TellsIntegersFromFloats) {
  auto tokens = lexAll("7 0.5 .25 1e-3 2E+4 3.");
  ASSERT_EQ(tokens.size(), 7u);
  EXPECT_TRUE(tokens[0].is(TokenKind::Integer));
  for (int i = 1; i < 6; ++i)
    EXPECT_TRUE(tokens[i].is(TokenKind::Float)) << tokens[i].text.str();
  EXPECT_EQ(tokens[3].text, "1e-3");
}

TEST(LexerTest, KeywordsAreNotNames) {
  auto tokens = lexAll("cell input state param output cells");
  EXPECT_TRUE(tokens[0].is(TokenKind::KwCell));
  EXPECT_TRUE(tokens[1].is(TokenKind::KwInput));
  EXPECT_TRUE(tokens[2].is(TokenKind::KwState));
  EXPECT_TRUE(tokens[3].is(TokenKind::KwParam));
  EXPECT_TRUE(tokens[4].is(TokenKind::KwOutput));
  EXPECT_TRUE(tokens[5].is(TokenKind::Identifier));
}

TEST(LexerTest, ReportsGarbageCharacters) {
  auto tokens = lexAll("h = x $ y");
  ASSERT_TRUE(tokens.back().is(TokenKind::Error));
  EXPECT_EQ(tokens.back().text, "$");
  EXPECT_EQ(tokens.back().message, "unexpected character '$'");
}

TEST(LexerTest, ReportsNonAsciiBytes) {
  auto tokens = lexAll("h = \xc3\xa9");
  ASSERT_TRUE(tokens.back().is(TokenKind::Error));
  EXPECT_EQ(tokens.back().message, "unexpected byte 0xc3");
}

TEST(LexerTest, ReportsNumbersGluedToNames) {
  auto tokens = lexAll("[4H]");
  ASSERT_TRUE(tokens.back().is(TokenKind::Error));
  EXPECT_EQ(tokens.back().text, "4H");
}

TEST(LexerTest, ReportsEmptyExponents) {
  auto tokens = lexAll("1e+");
  ASSERT_TRUE(tokens.back().is(TokenKind::Error));
  EXPECT_NE(tokens.back().message.find("exponent"), std::string::npos);
}

TEST(LexerTest, KeepsReturningEofAtTheEnd) {
  Lexer lexer("x");
  EXPECT_TRUE(lexer.next().is(TokenKind::Identifier));
  EXPECT_TRUE(lexer.next().is(TokenKind::Eof));
  EXPECT_TRUE(lexer.next().is(TokenKind::Eof));
}
