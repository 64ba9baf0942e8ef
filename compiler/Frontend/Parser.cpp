//===- Parser.cpp - Parser of the cell language ---------------------------===//

#include "compiler/Frontend/Parser.h"

#include "llvm/Support/MathExtras.h"

#include <cmath>

using namespace cellc;

/// How the current token reads in an "expected X, found Y" message.
static std::string describe(const Token &tok) {
  switch (tok.kind) {
  case TokenKind::Eof:
    return "end of file";
  case TokenKind::Identifier:
  case TokenKind::Integer:
  case TokenKind::Float:
  case TokenKind::Error:
    return "'" + tok.text.str() + "'";
  default:
    return spell(tok.kind).str();
  }
}

bool Parser::consumeIf(TokenKind kind) {
  if (!tok.is(kind))
    return false;
  advance();
  return true;
}

bool Parser::errorHere(const llvm::Twine &message) {
  if (tok.is(TokenKind::Error))
    diag.error(tok.loc(), tok.message, tok.range());
  else
    diag.error(tok.loc(), message, tok.range());
  return false;
}

bool Parser::expect(TokenKind kind, llvm::StringRef context) {
  if (consumeIf(kind))
    return true;
  return errorHere("expected " + spell(kind) + " " + context + ", found " +
                   describe(tok));
}

bool Parser::parseIdent(Ident &ident, llvm::StringRef what) {
  if (!tok.is(TokenKind::Identifier))
    return errorHere("expected " + what + ", found " + describe(tok));
  ident.name = tok.text.str();
  ident.range = tok.range();
  advance();
  return true;
}

std::unique_ptr<CellAST> Parser::parseCell() {
  if (tok.is(TokenKind::Eof)) {
    diag.error(llvm::SMLoc::getFromPointer(buffer.data()),
               "empty cell source: expected 'cell <name> { ... }'");
    return nullptr;
  }
  auto cell = std::make_unique<CellAST>();
  if (!expect(TokenKind::KwCell, "to start a cell definition") ||
      !parseIdent(cell->ident, "the cell's name") ||
      !expect(TokenKind::LBrace, "after the cell's name"))
    return nullptr;

  while (!consumeIf(TokenKind::RBrace)) {
    bool ok = true;
    switch (tok.kind) {
    case TokenKind::KwInput:
      advance();
      ok = parseDecls(DeclKind::Input, *cell);
      break;
    case TokenKind::KwState:
      advance();
      ok = parseDecls(DeclKind::State, *cell);
      break;
    case TokenKind::KwParam:
      advance();
      ok = parseDecls(DeclKind::Param, *cell);
      break;
    case TokenKind::Semicolon:
      advance();
      break;
    case TokenKind::Eof:
      ok = errorHere("expected '}' to close the cell body, found end of file");
      break;
    default:
      ok = parseStmt(*cell);
      break;
    }
    if (!ok)
      return nullptr;
  }
  if (!tok.is(TokenKind::Eof)) {
    errorHere("expected end of file after the cell, found " + describe(tok) +
              "; a file holds one cell");
    return nullptr;
  }
  return cell;
}

bool Parser::parseDecls(DeclKind kind, CellAST &cell) {
  do {
    Decl decl;
    decl.kind = kind;
    llvm::SMLoc start = tok.loc();
    if (!parseIdent(decl.ident, "a name to declare") ||
        !expect(TokenKind::Colon, "after the declared name") ||
        !parseShape(decl.shape))
      return false;
    decl.range = llvm::SMRange(start, decl.shape.back().range.End);
    cell.decls.push_back(std::move(decl));
  } while (consumeIf(TokenKind::Comma));
  return true;
}

bool Parser::parseShape(std::vector<SizeExpr> &shape) {
  llvm::SMLoc open = tok.loc();
  if (!expect(TokenKind::LBracket, "to start a shape such as [H]"))
    return false;
  do {
    SizeExpr size;
    if (!parseSize(size))
      return false;
    shape.push_back(std::move(size));
  } while (consumeIf(TokenKind::Comma));
  llvm::SMRange range(open, tok.range().End);
  if (!expect(TokenKind::RBracket, "to close the shape"))
    return false;
  if (shape.size() > 3) {
    diag.error(open,
               "expected a vector [n], a matrix [rows, cols] or blocks [G, rows, "
               "cols], found " +
                   llvm::Twine(shape.size()) + " dimensions",
               range);
    return false;
  }
  return true;
}

bool Parser::parseSize(SizeExpr &size) {
  llvm::SMLoc start = tok.loc();
  llvm::SMLoc end = start;
  do {
    SizeExpr::Term term;
    do {
      if (tok.is(TokenKind::Integer)) {
        uint64_t value;
        if (tok.text.getAsInteger(10, value) || value > (uint64_t(1) << 40))
          return errorHere("size " + describe(tok) + " is too large");
        int64_t product;
        if (llvm::MulOverflow(term.coefficient, static_cast<int64_t>(value),
                              product) ||
            product > (int64_t(1) << 40))
          return errorHere("size is too large");
        term.coefficient = product;
      } else if (tok.is(TokenKind::Identifier)) {
        term.symbols.push_back({tok.text.str(), tok.range()});
      } else {
        return errorHere("expected a size (an integer or a size name such as "
                         "H), found " +
                         describe(tok));
      }
      end = tok.range().End;
      advance();
    } while (consumeIf(TokenKind::Star));
    size.terms.push_back(std::move(term));
  } while (consumeIf(TokenKind::Plus));
  size.range = llvm::SMRange(start, end);
  return true;
}

bool Parser::parseStmt(CellAST &cell) {
  Stmt stmt;
  llvm::SMLoc start = tok.loc();
  if (consumeIf(TokenKind::KwOutput)) {
    stmt.kind = Stmt::Kind::Output;
    do {
      Ident name;
      if (!parseIdent(name, "the name of an output"))
        return false;
      stmt.names.push_back(std::move(name));
    } while (consumeIf(TokenKind::Comma));
    stmt.range = llvm::SMRange(start, stmt.names.back().range.End);
    cell.stmts.push_back(std::move(stmt));
    return true;
  }

  stmt.kind = Stmt::Kind::Assign;
  if (!tok.is(TokenKind::Identifier))
    return errorHere("expected a declaration ('input', 'state', 'param'), an "
                     "assignment or 'output', found " +
                     describe(tok));
  do {
    Ident name;
    if (!parseIdent(name, "a name to assign"))
      return false;
    stmt.names.push_back(std::move(name));
  } while (consumeIf(TokenKind::Comma));
  if (!expect(TokenKind::Equal, "after the assigned name"))
    return false;
  stmt.value = parseExpr();
  if (!stmt.value)
    return false;
  stmt.range = llvm::SMRange(start, stmt.value->range.End);
  cell.stmts.push_back(std::move(stmt));
  return true;
}

std::unique_ptr<Expr> Parser::parseExpr() { return parseBinary(1); }

/// The binding strength of a binary operator token, or 0 for none. As in
/// Python: comparisons bind loosest, `@` like `*`; `**` (parsePower) binds
/// tighter than a unary minus on its left.
static unsigned precedence(TokenKind kind) {
  switch (kind) {
  case TokenKind::Less:
  case TokenKind::LessEqual:
  case TokenKind::Greater:
  case TokenKind::GreaterEqual:
  case TokenKind::EqualEqual:
  case TokenKind::NotEqual:
    return 1;
  case TokenKind::Plus:
  case TokenKind::Minus:
    return 2;
  case TokenKind::Star:
  case TokenKind::Slash:
  case TokenKind::At:
    return 3;
  default:
    return 0;
  }
}

/// Comparisons do not chain (`a < b < c`).
static bool isComparison(TokenKind kind) { return precedence(kind) == 1; }

static Expr::BinaryOp binaryOpOf(TokenKind kind) {
  switch (kind) {
  case TokenKind::Plus:
    return Expr::BinaryOp::Add;
  case TokenKind::Minus:
    return Expr::BinaryOp::Sub;
  case TokenKind::Star:
    return Expr::BinaryOp::Mul;
  case TokenKind::Slash:
    return Expr::BinaryOp::Div;
  case TokenKind::At:
    return Expr::BinaryOp::Matvec;
  case TokenKind::StarStar:
    return Expr::BinaryOp::Pow;
  case TokenKind::Less:
    return Expr::BinaryOp::Less;
  case TokenKind::LessEqual:
    return Expr::BinaryOp::LessEqual;
  case TokenKind::Greater:
    return Expr::BinaryOp::Greater;
  case TokenKind::GreaterEqual:
    return Expr::BinaryOp::GreaterEqual;
  case TokenKind::EqualEqual:
    return Expr::BinaryOp::Equal;
  case TokenKind::NotEqual:
    return Expr::BinaryOp::NotEqual;
  default:
    // Only tokens with a precedence (binaryPrecedence) reach here.
    llvm_unreachable("not a binary operator");
  }
}

bool Parser::setDepth(Expr &expr) {
  unsigned depth = 0;
  for (const auto &operand : expr.operands)
    depth = std::max(depth, operand->depth);
  expr.depth = depth + 1;
  if (expr.depth <= kMaxExprDepth)
    return true;
  diag.error(expr.opLoc,
             "expression is too deep (more than " +
                 llvm::Twine(kMaxExprDepth) + " levels); split it with names",
             expr.range);
  return false;
}

std::unique_ptr<Expr> Parser::parseBinary(unsigned minPrecedence) {
  std::unique_ptr<Expr> lhs = parseUnary();
  if (!lhs)
    return nullptr;
  while (true) {
    unsigned prec = precedence(tok.kind);
    if (prec == 0 || prec < minPrecedence)
      return lhs;
    llvm::SMLoc opLoc = tok.loc();
    Expr::BinaryOp op = binaryOpOf(tok.kind);
    advance();
    std::unique_ptr<Expr> rhs = parseBinary(prec + 1);
    if (!rhs)
      return nullptr;
    if (isComparison(tok.kind) && prec == 1) {
      errorHere("comparisons do not chain: write (a < b) * (b < c) for a < b < c");
      return nullptr;
    }
    auto binary = std::make_unique<Expr>(
        Expr::Kind::Binary, llvm::SMRange(lhs->range.Start, rhs->range.End));
    binary->binaryOp = op;
    binary->opLoc = opLoc;
    binary->operands.push_back(std::move(lhs));
    binary->operands.push_back(std::move(rhs));
    if (!setDepth(*binary))
      return nullptr;
    lhs = std::move(binary);
  }
}

namespace {
/// Counts one level of recursive descent for as long as it lives.
struct NestingGuard {
  explicit NestingGuard(unsigned &nesting) : nesting(nesting) { ++nesting; }
  ~NestingGuard() { --nesting; }
  unsigned &nesting;
};
} // namespace

std::unique_ptr<Expr> Parser::parseUnary() {
  NestingGuard guard(nesting);
  if (nesting > kMaxExprDepth) {
    errorHere("expression is nested too deeply (more than " +
              llvm::Twine(kMaxExprDepth) + " levels)");
    return nullptr;
  }
  if (!tok.is(TokenKind::Minus))
    return parsePower();
  llvm::SMLoc opLoc = tok.loc();
  advance();
  std::unique_ptr<Expr> operand = parseUnary();
  if (!operand)
    return nullptr;
  auto neg = std::make_unique<Expr>(Expr::Kind::Neg,
                                    llvm::SMRange(opLoc, operand->range.End));
  neg->opLoc = opLoc;
  neg->operands.push_back(std::move(operand));
  if (!setDepth(*neg))
    return nullptr;
  return neg;
}

std::unique_ptr<Expr> Parser::parsePower() {
  std::unique_ptr<Expr> base = parsePrimary();
  if (!base || !tok.is(TokenKind::StarStar))
    return base;
  llvm::SMLoc opLoc = tok.loc();
  advance();
  // Right to left, and the exponent may be negated: 2 ** -x ** 2 is
  // 2 ** (-(x ** 2)).
  std::unique_ptr<Expr> exponent = parseUnary();
  if (!exponent)
    return nullptr;
  auto power = std::make_unique<Expr>(Expr::Kind::Binary,
                                      llvm::SMRange(base->range.Start, exponent->range.End));
  power->binaryOp = Expr::BinaryOp::Pow;
  power->opLoc = opLoc;
  power->operands.push_back(std::move(base));
  power->operands.push_back(std::move(exponent));
  if (!setDepth(*power))
    return nullptr;
  return power;
}

std::unique_ptr<Expr> Parser::parsePrimary() {
  if (tok.is(TokenKind::Integer) || tok.is(TokenKind::Float)) {
    auto number = std::make_unique<Expr>(Expr::Kind::Number, tok.range());
    number->opLoc = tok.loc();
    number->isInteger = tok.is(TokenKind::Integer);
    number->name = tok.text.str();
    if (tok.text.getAsDouble(number->number, /*AllowInexact=*/true) ||
        !std::isfinite(number->number)) {
      errorHere("number " + describe(tok) + " is out of range");
      return nullptr;
    }
    advance();
    return number;
  }

  if (tok.is(TokenKind::LParen)) {
    llvm::SMLoc open = tok.loc();
    advance();
    std::unique_ptr<Expr> inner = parseExpr();
    if (!inner)
      return nullptr;
    if (!tok.is(TokenKind::RParen)) {
      errorHere("expected ')' to close this '(', found " + describe(tok));
      diag.note(open, "the '(' is here");
      return nullptr;
    }
    inner->range = llvm::SMRange(open, tok.range().End);
    advance();
    return inner;
  }

  if (!tok.is(TokenKind::Identifier)) {
    errorHere("expected an expression, found " + describe(tok));
    return nullptr;
  }

  Token name = tok;
  advance();
  if (!tok.is(TokenKind::LParen)) {
    auto ref = std::make_unique<Expr>(Expr::Kind::Name, name.range());
    ref->name = name.text.str();
    ref->opLoc = name.loc();
    return ref;
  }

  llvm::SMLoc open = tok.loc();
  advance();
  auto call = std::make_unique<Expr>(Expr::Kind::Call, name.range());
  call->name = name.text.str();
  call->opLoc = name.loc();
  if (!tok.is(TokenKind::RParen)) {
    do {
      std::unique_ptr<Expr> arg = parseExpr();
      if (!arg)
        return nullptr;
      call->operands.push_back(std::move(arg));
    } while (consumeIf(TokenKind::Comma));
  }
  if (!tok.is(TokenKind::RParen)) {
    errorHere("expected ')' or ',' in the call to '" + call->name +
              "', found " + describe(tok));
    diag.note(open, "the call's '(' is here");
    return nullptr;
  }
  call->range = llvm::SMRange(name.loc(), tok.range().End);
  advance();
  if (!setDepth(*call))
    return nullptr;
  return call;
}
