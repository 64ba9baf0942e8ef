//===- AST.h - Syntax tree of the cell language -----------------*- C++ -*-===//

#ifndef CELLC_COMPILER_FRONTEND_AST_H
#define CELLC_COMPILER_FRONTEND_AST_H

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/SMLoc.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cellc {

/// A name as written, with where it was written.
struct Ident {
  std::string name;
  llvm::SMRange range;
};

/// A symbolic size: a sum of terms, each an integer times a product of size
/// names, as in `4*H` or `H + 2*I`. Kept flat so that no input can make its
/// evaluation recurse deeply.
struct SizeExpr {
  struct Term {
    int64_t coefficient = 1;
    std::vector<Ident> symbols;
  };
  std::vector<Term> terms;
  llvm::SMRange range;

  /// Prints the size as written, normalised (`4*H`).
  void print(llvm::raw_ostream &os) const;
};

enum class DeclKind { Input, State, Param };

llvm::StringRef spell(DeclKind kind);

/// `input x: [I]`, `state h: [H]` or `param W: [4*H, I]`.
struct Decl {
  DeclKind kind;
  Ident ident;
  std::vector<SizeExpr> shape;
  llvm::SMRange range;
};

/// An expression. The depth is bounded by the parser, so that walking the tree
/// recursively cannot overflow the stack.
struct Expr {
  enum class Kind { Number, Name, Neg, Binary, Call };
  enum class BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
    Equal,
    NotEqual,
    Matvec
  };

  Kind kind;
  llvm::SMRange range;
  /// The location of the operator or callee, for diagnostics.
  llvm::SMLoc opLoc;
  /// Number: the value, and whether it was written as an integer.
  double number = 0;
  bool isInteger = false;
  /// Name and Call: the name. Number: the text as written.
  std::string name;
  BinaryOp binaryOp = BinaryOp::Add;
  /// Neg: one operand; Binary: lhs and rhs; Call: the arguments.
  std::vector<std::unique_ptr<Expr>> operands;
  /// 1 for a leaf, else one more than the deepest operand.
  unsigned depth = 1;

  Expr(Kind kind, llvm::SMRange range) : kind(kind), range(range) {}
};

llvm::StringRef spell(Expr::BinaryOp op);

/// `a = expr`, `a, b = chunk(expr, 2)` or `output a, b`.
struct Stmt {
  enum class Kind { Assign, Output };
  Kind kind;
  std::vector<Ident> names;
  std::unique_ptr<Expr> value;
  llvm::SMRange range;
};

/// `cell name { ... }`.
struct CellAST {
  Ident ident;
  std::vector<Decl> decls;
  std::vector<Stmt> stmts;

  /// Prints the tree, for `cellc --emit=ast`.
  void dump(llvm::raw_ostream &os) const;
};

} // namespace cellc

#endif // CELLC_COMPILER_FRONTEND_AST_H
