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


enum class ArgKind {
#define CELLC_ARG_KIND(E, S, H) E,
#include "dialects/Cell/IR/KernelInterface.def"
};
enum class GradKind {
#define CELLC_GRAD_KIND(E, S, H) E,
#include "dialects/Cell/IR/KernelInterface.def"
};
enum class Precision {
#define CELLC_PRECISION(E, S, H) E,
#include "dialects/Cell/IR/KernelInterface.def"
};
enum class Storage {
#define CELLC_STORAGE(E, S, H) E,
#include "dialects/Cell/IR/KernelInterface.def"
};
enum class Strategy {
#define CELLC_STRATEGY(E, S, H) E,
#include "dialects/Cell/IR/KernelInterface.def"
};
enum class Target {
#define CELLC_TARGET(E, S, H) E,
#include "dialects/Cell/IR/KernelInterface.def"
};
enum class Emit {
#define CELLC_EMIT(E, S, H) E,
#include "dialects/Cell/IR/KernelInterface.def"
};

namespace detail {
inline constexpr Word kArgKinds[] = {
#define CELLC_ARG_KIND(E, S, H) {S, H},
#include "dialects/Cell/IR/KernelInterface.def"
};
inline constexpr Word kGradKinds[] = {
#define CELLC_GRAD_KIND(E, S, H) {S, H},
#include "dialects/Cell/IR/KernelInterface.def"
};
inline constexpr Word kPrecisions[] = {
#define CELLC_PRECISION(E, S, H) {S, H},
#include "dialects/Cell/IR/KernelInterface.def"
};
inline constexpr Word kStorages[] = {
#define CELLC_STORAGE(E, S, H) {S, H},
#include "dialects/Cell/IR/KernelInterface.def"
};
inline constexpr Word kStrategies[] = {
#define CELLC_STRATEGY(E, S, H) {S, H},
#include "dialects/Cell/IR/KernelInterface.def"
};
inline constexpr Word kTargets[] = {
#define CELLC_TARGET(E, S, H) {S, H},
#include "dialects/Cell/IR/KernelInterface.def"
};
inline constexpr Word kEmits[] = {
#define CELLC_EMIT(E, S, H) {S, H},
#include "dialects/Cell/IR/KernelInterface.def"
};

template <typename E, size_t N>
std::optional<E> parse(const Word (&words)[N], std::string_view text) {
  for (size_t i = 0; i < N; ++i)
    if (text == words[i].name)
      return static_cast<E>(i);
  return std::nullopt;
}
template <size_t N>
std::string expected(const Word (&words)[N]) {
  std::string list;
  for (size_t i = 0; i < N; ++i)
    list += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + words[i].name;
  return list;
}
} // namespace detail

/// The words of each enum, in order: for listings and the Python module.
template <typename E> struct Words;
#define CELLC_WORDS(E, TABLE)                                                  \
  template <> struct Words<E> {                                                \
    static constexpr const Word *begin() { return detail::TABLE; }             \
    static constexpr const Word *end() {                                       \
      return detail::TABLE + sizeof(detail::TABLE) / sizeof(Word);             \
    }                                                                          \
    static std::string expected() { return detail::expected(detail::TABLE); }  \
    static std::optional<E> parse(std::string_view text) {                     \
      return detail::parse<E>(detail::TABLE, text);                            \
    }                                                                          \
  };                                                                           \
  inline const char *name(E value) {                                           \
    return detail::TABLE[static_cast<size_t>(value)].name;                     \
  }                                                                            \
  inline const char *help(E value) {                                           \
    return detail::TABLE[static_cast<size_t>(value)].help;                     \
  }
CELLC_WORDS(ArgKind, kArgKinds)
CELLC_WORDS(GradKind, kGradKinds)
CELLC_WORDS(Precision, kPrecisions)
CELLC_WORDS(Storage, kStorages)
CELLC_WORDS(Strategy, kStrategies)
CELLC_WORDS(Target, kTargets)
CELLC_WORDS(Emit, kEmits)
#undef CELLC_WORDS

/// The one parse function of each enum: `parse<Precision>("tf32")`.
template <typename E> std::optional<E> parse(std::string_view text) {
  return Words<E>::parse(text);
}

/// Whether a kernel argument of `kind` is written by the backward kernel.
inline bool isBackwardResult(ArgKind kind) {
  switch (kind) {
  case ArgKind::InitialStateGrad:
  case ArgKind::InputGrad:
  case ArgKind::ProjectionGrad:
  case ArgKind::WeightRows:
  case ArgKind::WeightVectors:
  case ArgKind::ParamGrad:
  case ArgKind::StartStateGrad:
    return true;
  case ArgKind::Input:
  case ArgKind::Projection:
  case ArgKind::Resets:
  case ArgKind::InitialState:
  case ArgKind::StartState:
  case ArgKind::Param:
  case ArgKind::Output:
  case ArgKind::StateHistory:
  case ArgKind::Gates:
  case ArgKind::OutputGrad:
  case ArgKind::FinalStateGrad:
  case ArgKind::BatchBegin:
  case ArgKind::BatchEnd:
  case ArgKind::Workspace:
  case ArgKind::GridBarrier:
    return false;
  }
  return false;
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

} // namespace cellc

#endif // CELLC_DIALECTS_CELL_IR_KERNELINTERFACE_H
