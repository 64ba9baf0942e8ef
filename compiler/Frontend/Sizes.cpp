//===- Sizes.cpp - Binding symbolic sizes ---------------------------------===//

#include "compiler/Frontend/Sizes.h"

#include "llvm/Support/MathExtras.h"

#include <cctype>

using namespace cellc;

llvm::Expected<std::pair<std::string, int64_t>>
cellc::parseSizeBinding(llvm::StringRef text) {
  auto [name, value] = text.split('=');
  name = name.trim();
  value = value.trim();
  auto fail = [&](const llvm::Twine &why) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "bad size binding '" + text + "': " + why);
  };
  if (!text.contains('='))
    return fail("expected NAME=VALUE, such as H=256");
  if (name.empty() ||
      !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') ||
      llvm::any_of(name, [](char c) {
        return !std::isalnum(static_cast<unsigned char>(c)) && c != '_';
      }))
    return fail("'" + name + "' is not a size name");
  int64_t number;
  if (value.getAsInteger(10, number))
    return fail("'" + value + "' is not an integer");
  if (number <= 0)
    return fail("sizes must be positive");
  if (number > kMaxSize)
    return fail("sizes must be at most " + llvm::Twine(kMaxSize));
  return std::make_pair(name.str(), number);
}

std::optional<int64_t> cellc::evaluateSize(const SizeExpr &size,
                                           const SizeBindings &bindings,
                                           CellDiagnostics &diag) {
  int64_t total = 0;
  bool overflow = false;
  for (const SizeExpr::Term &term : size.terms) {
    int64_t product = term.coefficient;
    for (const Ident &sym : term.symbols) {
      auto it = bindings.find(sym.name);
      if (it == bindings.end()) {
        diag.error(sym.range.Start,
                   "unbound size '" + sym.name + "'; bind it, as in -D " +
                       sym.name + "=64",
                   sym.range);
        return std::nullopt;
      }
      overflow |= llvm::MulOverflow(product, it->second, product) ||
                  product > kMaxSize;
    }
    overflow |= llvm::AddOverflow(total, product, total) || total > kMaxSize;
    if (overflow)
      break;
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  size.print(os);
  if (overflow) {
    diag.error(size.range.Start,
               "size " + os.str() + " is larger than " + llvm::Twine(kMaxSize),
               size.range);
    return std::nullopt;
  }
  if (total <= 0) {
    diag.error(size.range.Start,
               "size " + os.str() + " is " + llvm::Twine(total) +
                   "; sizes must be positive",
               size.range);
    return std::nullopt;
  }
  return total;
}
