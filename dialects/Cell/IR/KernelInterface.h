//===- KernelInterface.h - The words of the kernel interface ----*- C++ -*-===//
//
// The enums of KernelInterface.def, each with its names and its one parse
// function. Plain C++17: the CUDA runtime includes it, and builds without
// LLVM.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_DIALECTS_CELL_IR_KERNELINTERFACE_H
#define CELLC_DIALECTS_CELL_IR_KERNELINTERFACE_H

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace cellc {

/// One word of an enum: its name and what it means.
struct Word {
  const char *name;
  const char *help;
};

// The enums.
#define CELLC_ENUM(Enum) enum class Enum {
#define CELLC_WORD(E, S, H) E,
// clang-format off
#define CELLC_END(Enum) };
// clang-format on
#include "dialects/Cell/IR/KernelInterface.def"

namespace detail {
// Their words: kArgKind, kPrecision, ...
#define CELLC_ENUM(Enum) inline constexpr Word k##Enum[] = {
#define CELLC_WORD(E, S, H) {S, H},
// clang-format off
#define CELLC_END(Enum) };
// clang-format on
#include "dialects/Cell/IR/KernelInterface.def"

template <typename E, size_t N>
std::optional<E> parse(const Word (&words)[N], std::string_view text) {
  for (size_t i = 0; i < N; ++i)
    if (text == words[i].name)
      return static_cast<E>(i);
  return std::nullopt;
}
template <size_t N> std::string expected(const Word (&words)[N]) {
  std::string list;
  for (size_t i = 0; i < N; ++i)
    list += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + words[i].name;
  return list;
}
} // namespace detail

/// The words of each enum, in order: for listings and the Python module.
template <typename E> struct Words;
#define CELLC_ENUM(E)                                                          \
  template <> struct Words<E> {                                                \
    static constexpr const Word *begin() { return detail::k##E; }              \
    static constexpr const Word *end() {                                       \
      return detail::k##E + sizeof(detail::k##E) / sizeof(Word);               \
    }                                                                          \
    static std::string expected() { return detail::expected(detail::k##E); }   \
    static std::optional<E> parse(std::string_view text) {                     \
      return detail::parse<E>(detail::k##E, text);                             \
    }                                                                          \
  };                                                                           \
  inline const char *name(E value) {                                           \
    return detail::k##E[static_cast<size_t>(value)].name;                      \
  }                                                                            \
  inline const char *help(E value) {                                           \
    return detail::k##E[static_cast<size_t>(value)].help;                      \
  }
#define CELLC_WORD(E, S, H)
#define CELLC_END(Enum)
#include "dialects/Cell/IR/KernelInterface.def"

/// The one parse function of each enum: `parse<Precision>("tf32")`.
template <typename E> std::optional<E> parse(std::string_view text) {
  return Words<E>::parse(text);
}

/// Whether a kernel argument of `kind` is written by the backward kernel:
/// the run from initial_state_grad to start_state_grad in
/// KernelInterface.def.
inline bool isBackwardResult(ArgKind kind) {
  return kind >= ArgKind::InitialStateGrad && kind <= ArgKind::StartStateGrad;
}

/// The kernel argument that carries a backward step's result of `kind`.
inline ArgKind argKindOf(GradKind kind) {
  switch (kind) {
  case GradKind::State:
    return ArgKind::InitialStateGrad;
  case GradKind::Input:
    return ArgKind::InputGrad;
  case GradKind::Projection:
    return ArgKind::ProjectionGrad;
  case GradKind::WeightRows:
    return ArgKind::WeightRows;
  case GradKind::WeightVectors:
    return ArgKind::WeightVectors;
  case GradKind::Param:
    return ArgKind::ParamGrad;
  }
  return ArgKind::Input;
}

/// The 32-bit words of a persistent CUDA kernel's grid barrier, a grid row
/// (a batch tile's CTAs): its count and its generation, each on its own
/// 128-byte line, so that one row's spinning waiters share no line with
/// the arrivals or with another row's (kernels.json's `barrier_words`).
inline constexpr long kPersistentBarrierWords = 64;

} // namespace cellc

#endif // CELLC_DIALECTS_CELL_IR_KERNELINTERFACE_H
