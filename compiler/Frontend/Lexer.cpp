//===- Lexer.cpp - Tokens of the cell language ----------------------------===//

#include "compiler/Frontend/Lexer.h"

#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

#include <cctype>

using namespace cellc;

llvm::StringRef cellc::spell(TokenKind kind) {
  switch (kind) {
  case TokenKind::Eof:
    return "end of file";
  case TokenKind::Error:
    return "invalid token";
  case TokenKind::Identifier:
    return "a name";
  case TokenKind::Integer:
    return "an integer";
  case TokenKind::Float:
    return "a number";
  case TokenKind::KwCell:
    return "'cell'";
  case TokenKind::KwInput:
    return "'input'";
  case TokenKind::KwState:
    return "'state'";
  case TokenKind::KwParam:
    return "'param'";
  case TokenKind::KwOutput:
    return "'output'";
  case TokenKind::LBrace:
    return "'{'";
  case TokenKind::RBrace:
    return "'}'";
  case TokenKind::LParen:
    return "'('";
  case TokenKind::RParen:
    return "')'";
  case TokenKind::LBracket:
    return "'['";
  case TokenKind::RBracket:
    return "']'";
  case TokenKind::Comma:
    return "','";
  case TokenKind::Colon:
    return "':'";
  case TokenKind::Semicolon:
    return "';'";
  case TokenKind::Equal:
    return "'='";
  case TokenKind::Plus:
    return "'+'";
  case TokenKind::Minus:
    return "'-'";
  case TokenKind::Star:
    return "'*'";
  case TokenKind::StarStar:
    return "'**'";
  case TokenKind::Less:
    return "'<'";
  case TokenKind::LessEqual:
    return "'<='";
  case TokenKind::Greater:
    return "'>'";
  case TokenKind::GreaterEqual:
    return "'>='";
  case TokenKind::EqualEqual:
    return "'=='";
  case TokenKind::NotEqual:
    return "'!='";
  case TokenKind::Slash:
    return "'/'";
  case TokenKind::At:
    return "'@'";
  }
  return "token";
}

bool Lexer::consumeIf(char c) {
  if (cur == buffer.end() || *cur != c)
    return false;
  ++cur;
  return true;
}

Token Lexer::make(TokenKind kind, const char *start) {
  Token tok;
  tok.kind = kind;
  tok.text = llvm::StringRef(start, cur - start);
  return tok;
}

Token Lexer::error(const char *start, const char *end, std::string message) {
  cur = end;
  Token tok;
  tok.kind = TokenKind::Error;
  tok.text = llvm::StringRef(start, end - start);
  tok.message = std::move(message);
  return tok;
}

Token Lexer::next() {
  const char *end = buffer.end();
  // Skip whitespace and comments.
  while (cur != end) {
    if (*cur == ' ' || *cur == '\t' || *cur == '\n' || *cur == '\r' ||
        *cur == '\f' || *cur == '\v') {
      ++cur;
    } else if (*cur == '#') {
      while (cur != end && *cur != '\n')
        ++cur;
    } else {
      break;
    }
  }
  if (cur == end)
    return make(TokenKind::Eof, cur);

  const char *start = cur;
  char c = *cur++;
  switch (c) {
  case '{':
    return make(TokenKind::LBrace, start);
  case '}':
    return make(TokenKind::RBrace, start);
  case '(':
    return make(TokenKind::LParen, start);
  case ')':
    return make(TokenKind::RParen, start);
  case '[':
    return make(TokenKind::LBracket, start);
  case ']':
    return make(TokenKind::RBracket, start);
  case ',':
    return make(TokenKind::Comma, start);
  case ':':
    return make(TokenKind::Colon, start);
  case ';':
    return make(TokenKind::Semicolon, start);
  case '=':
    return make(consumeIf('=') ? TokenKind::EqualEqual : TokenKind::Equal, start);
  case '<':
    return make(consumeIf('=') ? TokenKind::LessEqual : TokenKind::Less, start);
  case '>':
    return make(consumeIf('=') ? TokenKind::GreaterEqual : TokenKind::Greater, start);
  case '!':
    if (consumeIf('='))
      return make(TokenKind::NotEqual, start);
    return error(start, cur, "unexpected character '!'; '!=' compares, and a mask is "
                             "negated with 1 - m");
  case '+':
    return make(TokenKind::Plus, start);
  case '-':
    return make(TokenKind::Minus, start);
  case '*':
    return make(consumeIf('*') ? TokenKind::StarStar : TokenKind::Star, start);
  case '/':
    return make(TokenKind::Slash, start);
  case '@':
    return make(TokenKind::At, start);
  default:
    break;
  }
  if (std::isdigit(static_cast<unsigned char>(c)) ||
      (c == '.' && cur != end && std::isdigit(static_cast<unsigned char>(*cur))))
    return lexNumber(start);
  if (std::isalpha(static_cast<unsigned char>(c)) || c == '_')
    return lexIdentifier(start);
  // `W.T @ h`, as NumPy writes a transposed product.
  if (c == '.' && cur != end && *cur == 'T' &&
      (cur + 1 == end || !std::isalnum(static_cast<unsigned char>(cur[1]))))
    return error(start, cur + 1,
                 "'.T' is not in the language: a product with the transpose of W is "
                 "written `h @ W` (the vector on the left), as `W @ h` is W's");

  std::string message;
  llvm::raw_string_ostream os(message);
  if (std::isprint(static_cast<unsigned char>(c)))
    os << "unexpected character '" << c << "'";
  else
    os << "unexpected byte 0x"
       << llvm::format_hex_no_prefix(static_cast<unsigned char>(c), 2);
  return error(start, cur, os.str());
}

Token Lexer::lexNumber(const char *start) {
  const char *end = buffer.end();
  auto isDigit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)); };
  bool isFloat = *start == '.';
  while (cur != end && isDigit(*cur))
    ++cur;
  if (!isFloat && cur != end && *cur == '.') {
    isFloat = true;
    ++cur;
    while (cur != end && isDigit(*cur))
      ++cur;
  }
  if (cur != end && (*cur == 'e' || *cur == 'E')) {
    const char *exp = cur + 1;
    if (exp != end && (*exp == '+' || *exp == '-'))
      ++exp;
    if (exp == end || !isDigit(*exp))
      return error(start, exp, "expected digits in the exponent of a number");
    isFloat = true;
    cur = exp;
    while (cur != end && isDigit(*cur))
      ++cur;
  }
  // A number glued to a name, as in `2H`, is a typo for `2*H`.
  if (cur != end && (std::isalpha(static_cast<unsigned char>(*cur)) || *cur == '_')) {
    const char *bad = cur;
    while (bad != end && (std::isalnum(static_cast<unsigned char>(*bad)) || *bad == '_'))
      ++bad;
    return error(start, bad, "a number cannot be followed by a name; did you mean '*'?");
  }
  return make(isFloat ? TokenKind::Float : TokenKind::Integer, start);
}

Token Lexer::lexIdentifier(const char *start) {
  const char *end = buffer.end();
  while (cur != end &&
         (std::isalnum(static_cast<unsigned char>(*cur)) || *cur == '_'))
    ++cur;
  llvm::StringRef text(start, cur - start);
  TokenKind kind = llvm::StringSwitch<TokenKind>(text)
                       .Case("cell", TokenKind::KwCell)
                       .Case("input", TokenKind::KwInput)
                       .Case("state", TokenKind::KwState)
                       .Case("param", TokenKind::KwParam)
                       .Case("output", TokenKind::KwOutput)
                       .Default(TokenKind::Identifier);
  return make(kind, start);
}
