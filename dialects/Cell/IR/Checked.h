//===- Checked.h - Sizes multiplied with their overflow checked -*- C++ -*-===//
//
// Every product of sizes, counts, bytes and offsets that can pass int64 (the
// front end's shapes, the plan's and the driver's buffers, a package's
// shapes) is formed through these, and a product that does not fit is an
// error where it is formed, never a wrapped number. Plain C++17: the words
// layer, which the compiler and the runtime both include.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_DIALECTS_CELL_IR_CHECKED_H
#define CELLC_DIALECTS_CELL_IR_CHECKED_H

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

namespace cellc {

/// `a * b`, or nullopt where a factor is negative or the product passes
/// int64.
inline std::optional<int64_t> checkedMul(int64_t a, int64_t b) {
  int64_t out;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &out))
    return std::nullopt;
  return out;
}

/// `a + b`, or nullopt where a term is negative or the sum passes int64.
inline std::optional<int64_t> checkedAdd(int64_t a, int64_t b) {
  int64_t out;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &out))
    return std::nullopt;
  return out;
}

/// The product of `factors` (1 for none), or nullopt.
template <typename Range> std::optional<int64_t> checkedProduct(const Range &factors) {
  int64_t product = 1;
  for (int64_t f : factors) {
    std::optional<int64_t> next = checkedMul(product, f);
    if (!next)
      return std::nullopt;
    product = *next;
  }
  return product;
}
inline std::optional<int64_t> checkedProduct(std::initializer_list<int64_t> factors) {
  return checkedProduct<std::initializer_list<int64_t>>(factors);
}

} // namespace cellc

#endif // CELLC_DIALECTS_CELL_IR_CHECKED_H
