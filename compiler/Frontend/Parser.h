//===- Parser.h - Parser of the cell language -------------------*- C++ -*-===//

#ifndef CELLC_COMPILER_FRONTEND_PARSER_H
#define CELLC_COMPILER_FRONTEND_PARSER_H

#include "compiler/Frontend/AST.h"
#include "compiler/Frontend/Diagnostics.h"
#include "compiler/Frontend/Lexer.h"

#include <memory>

namespace cellc {

/// The deepest expression the parser accepts. Real cells nest a handful of
/// levels; the bound keeps every recursive walk of the tree off the end of the
/// stack.
constexpr unsigned kMaxExprDepth = 256;

/// Parses one `cell` from a buffer. Stops at the first error, which it reports
/// through the diagnostic engine, and then returns null.
class Parser {
public:
  Parser(llvm::StringRef buffer, CellDiagnostics &diag)
      : lexer(buffer), diag(diag), buffer(buffer) {
    advance();
  }

  std::unique_ptr<CellAST> parseCell();

private:
  void advance() { tok = lexer.next(); }
  bool consumeIf(TokenKind kind);
  /// Reports an error at the current token (or what the lexer found wrong with
  /// it) and returns false.
  bool errorHere(const llvm::Twine &message);
  bool expect(TokenKind kind, llvm::StringRef context);
  bool parseIdent(Ident &ident, llvm::StringRef what);

  bool parseDecls(DeclKind kind, CellAST &cell);
  bool parseShape(std::vector<SizeExpr> &shape);
  bool parseSize(SizeExpr &size);
  bool parseStmt(CellAST &cell);

  std::unique_ptr<Expr> parseExpr();
  std::unique_ptr<Expr> parseBinary(unsigned minPrecedence);
  std::unique_ptr<Expr> parseUnary();
  /// A primary, raised to a power where `**` follows.
  std::unique_ptr<Expr> parsePower();
  std::unique_ptr<Expr> parsePrimary();
  /// Sets `expr`'s depth from its operands; reports an error past the limit.
  bool setDepth(Expr &expr);

  Lexer lexer;
  CellDiagnostics &diag;
  llvm::StringRef buffer;
  Token tok;
  /// The current nesting of recursive calls into expression parsing.
  unsigned nesting = 0;
};

} // namespace cellc

#endif // CELLC_COMPILER_FRONTEND_PARSER_H
