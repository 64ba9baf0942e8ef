//===- Sizes.h - Binding symbolic sizes -------------------------*- C++ -*-===//

#ifndef CELLC_COMPILER_FRONTEND_SIZES_H
#define CELLC_COMPILER_FRONTEND_SIZES_H

#include "compiler/Frontend/AST.h"
#include "compiler/Frontend/Diagnostics.h"

#include "llvm/Support/Error.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace cellc {

/// The largest size one dimension may have once bound.
constexpr int64_t kMaxSize = int64_t(1) << 30;

/// Symbolic size names and the values they are bound to.
using SizeBindings = std::map<std::string, int64_t>;

/// Parses a `-D` binding such as `H=256`.
llvm::Expected<std::pair<std::string, int64_t>>
parseSizeBinding(llvm::StringRef text);

/// Evaluates `size` under `bindings`. Reports an unbound name, a result that
/// is not positive, and one above kMaxSize, and then returns nullopt.
std::optional<int64_t> evaluateSize(const SizeExpr &size,
                                    const SizeBindings &bindings,
                                    CellDiagnostics &diag);

} // namespace cellc

#endif // CELLC_COMPILER_FRONTEND_SIZES_H
