//===- Lexer.h - Tokens of the cell language --------------------*- C++ -*-===//

#ifndef CELLC_COMPILER_FRONTEND_LEXER_H
#define CELLC_COMPILER_FRONTEND_LEXER_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/SMLoc.h"

#include <string>

namespace cellc {

enum class TokenKind {
  Eof,
  Error,
  Identifier,
  Integer,
  Float,
  // Keywords.
  KwCell,
  KwInput,
  KwState,
  KwParam,
  KwOutput,
  // Punctuation.
  LBrace,
  RBrace,
  LParen,
  RParen,
  LBracket,
  RBracket,
  Comma,
  Colon,
  Semicolon,
  Equal,
  Plus,
  Minus,
  Star,
  StarStar,
  Slash,
  At,
  Less,
  LessEqual,
  Greater,
  GreaterEqual,
  EqualEqual,
  NotEqual,
};

/// A printable name for a token kind, as used in "expected ..." messages.
llvm::StringRef spell(TokenKind kind);

struct Token {
  TokenKind kind = TokenKind::Eof;
  /// The token's text in the source buffer.
  llvm::StringRef text;
  /// For an Error token, what is wrong.
  std::string message;

  bool is(TokenKind k) const { return kind == k; }
  llvm::SMLoc loc() const { return llvm::SMLoc::getFromPointer(text.data()); }
  llvm::SMRange range() const {
    return llvm::SMRange(loc(),
                         llvm::SMLoc::getFromPointer(text.data() + text.size()));
  }
};

/// Splits a cell source buffer into tokens. `#` starts a comment that runs to
/// the end of the line; newlines are whitespace.
class Lexer {
public:
  explicit Lexer(llvm::StringRef buffer)
      : buffer(buffer), cur(buffer.begin()) {}

  /// Lexes and returns the next token; after the end it keeps returning Eof.
  Token next();

private:
  Token make(TokenKind kind, const char *start);
  /// Consumes the next character where it is `c`.
  bool consumeIf(char c);
  Token error(const char *start, const char *end, std::string message);
  Token lexNumber(const char *start);
  Token lexIdentifier(const char *start);

  llvm::StringRef buffer;
  const char *cur;
};

} // namespace cellc

#endif // CELLC_COMPILER_FRONTEND_LEXER_H
