//===- AST.cpp - Syntax tree of the cell language -------------------------===//

#include "compiler/Frontend/AST.h"

#include "llvm/ADT/STLExtras.h"

#include <iterator>

using namespace cellc;

llvm::StringRef cellc::spell(DeclKind kind) {
  static constexpr llvm::StringLiteral words[] = {"input", "state", "param"};
  static_assert(std::size(words) == size_t(DeclKind::Param) + 1);
  return words[size_t(kind)];
}

llvm::StringRef cellc::spell(Expr::BinaryOp op) {
  static constexpr llvm::StringLiteral words[] = {"+",  "-",  "*",  "/",  "**", "<", "<=",
                                                  ">",  ">=", "==", "!=", "@"};
  static_assert(std::size(words) == size_t(Expr::BinaryOp::Matvec) + 1);
  return words[size_t(op)];
}

void SizeExpr::print(llvm::raw_ostream &os) const {
  llvm::interleave(
      terms, os,
      [&](const Term &term) {
        bool first = true;
        if (term.coefficient != 1 || term.symbols.empty()) {
          os << term.coefficient;
          first = false;
        }
        for (const Ident &sym : term.symbols) {
          if (!first)
            os << '*';
          os << sym.name;
          first = false;
        }
      },
      " + ");
}

static void dumpExpr(const Expr &expr, llvm::raw_ostream &os, unsigned indent) {
  os.indent(indent);
  switch (expr.kind) {
  case Expr::Kind::Number:
    os << "Number " << expr.name << '\n';
    return;
  case Expr::Kind::Name:
    os << "Name " << expr.name << '\n';
    return;
  case Expr::Kind::Neg:
    os << "Neg\n";
    break;
  case Expr::Kind::Binary:
    os << "Binary " << spell(expr.binaryOp) << '\n';
    break;
  case Expr::Kind::Call:
    os << "Call " << expr.name << '\n';
    break;
  }
  for (const auto &operand : expr.operands)
    dumpExpr(*operand, os, indent + 2);
}

void CellAST::dump(llvm::raw_ostream &os) const {
  os << "Cell " << ident.name << '\n';
  for (const Decl &decl : decls) {
    os << "  " << spell(decl.kind) << ' ' << decl.ident.name << ": [";
    llvm::interleaveComma(decl.shape, os,
                          [&](const SizeExpr &size) { size.print(os); });
    os << "]\n";
  }
  for (const Stmt &stmt : stmts) {
    if (stmt.kind == Stmt::Kind::Output) {
      os << "  Output ";
      llvm::interleaveComma(stmt.names, os,
                            [&](const Ident &id) { os << id.name; });
      os << '\n';
      continue;
    }
    os << "  Assign ";
    llvm::interleaveComma(stmt.names, os,
                          [&](const Ident &id) { os << id.name; });
    os << '\n';
    dumpExpr(*stmt.value, os, 4);
  }
}
