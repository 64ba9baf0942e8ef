//===- Knobs.h - The kernel knobs, as a table -------------------*- C++ -*-===//
//
// The knobs of Knobs.def as a table that the command line, Python and the
// tuner walk: each knob's name, flag, default, help and uses; and the
// tuner's CUDA knobs and the CPU JIT's config keys with their values. Plain
// C++17, like KernelInterface.h.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_DIALECTS_CELL_IR_KNOBS_H
#define CELLC_DIALECTS_CELL_IR_KNOBS_H

#include "dialects/Cell/IR/KernelInterface.h"

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace cellc {

/// What takes a knob: bits of KnobInfo::uses. Each kernel pass takes its
/// knobs as options (compiler/Conversion/KnobOptions.h).
enum KnobUse : unsigned {
  /// The CPU's batched kernels (convert-cell-to-batched-kernels).
  KnobBatched = 1,
  /// The CUDA kernels and their emulation (convert-cell-to-tiled-kernels).
  KnobCuda = 2,
  /// Python's Cell.cuda_package.
  KnobPython = 4,
  /// The CPU's per-row kernels (convert-cell-to-kernels).
  KnobPerRow = 8,
  /// The CPU's kernels, batched or per-row.
  KnobCpu = KnobBatched | KnobPerRow,
};

/// The knobs' values, one member a knob with its default: PipelineOptions
/// holds them, and the kernel passes take them.
struct Knobs {
#define CELLC_INT_KNOB(Name, Member, Default, Uses, Help) int64_t Member = Default;
#define CELLC_WORD_KNOB(Name, Member, Enum, Default, Uses, Help) Enum Member = Enum::Default;
#include "dialects/Cell/IR/Knobs.def"
};

/// One knob of Knobs.def.
struct KnobInfo {
  const char *name;
  /// A word knob's words (KernelInterface.def), or null for an integer knob.
  const Word *words;
  size_t wordCount;
  /// An integer knob's default, or the index of a word knob's default word.
  int64_t defaultValue;
  unsigned uses;
  const char *help;

  bool isWord() const { return words != nullptr; }
  /// The default as Python and kernels.json write it: a word, or digits.
  std::string defaultText() const {
    return isWord() ? words[defaultValue].name : std::to_string(defaultValue);
  }
  /// A word knob's words: "ieee, tf32 or bf16".
  std::string expected() const {
    std::string list;
    for (size_t i = 0; i < wordCount; ++i)
      list += std::string(i == 0 ? "" : i + 1 == wordCount ? " or " : ", ") + words[i].name;
    return list;
  }

  /// The command line's flag: the name with '-' for '_'.
  std::string flag() const {
    std::string text = name;
    for (char &c : text)
      if (c == '_')
        c = '-';
    return text;
  }
};

// clang-format off
/// The knobs, in Knobs.def's order.
inline constexpr KnobInfo kKnobs[] = {
#define CELLC_INT_KNOB(Name, Member, Default, Uses, Help)                      \
  {#Name, nullptr, 0, Default, Uses, Help},
#define CELLC_WORD_KNOB(Name, Member, Enum, Default, Uses, Help)               \
  {#Name, Words<Enum>::begin(), size_t(Words<Enum>::end() - Words<Enum>::begin()), \
   int64_t(Enum::Default), Uses, Help},
#include "dialects/Cell/IR/Knobs.def"
};
// clang-format on

/// The knob called `name`, or null.
inline const KnobInfo *findKnob(std::string_view name) {
  for (const KnobInfo &knob : kKnobs)
    if (name == knob.name)
      return &knob;
  return nullptr;
}

/// The command line's flag of the knob called `name` (batch_tile:
/// "batch-tile"), kept for the life of the process, as a pass option's
/// name must be.
inline const char *knobFlag(std::string_view name) {
  static const std::vector<std::string> flags = [] {
    std::vector<std::string> all;
    for (const KnobInfo &knob : kKnobs)
      all.push_back(knob.flag());
    return all;
  }();
  for (size_t i = 0; i < flags.size(); ++i)
    if (name == kKnobs[i].name)
      return flags[i].c_str();
  return nullptr;
}

/// One knob of cellc-tune's CUDA search: its name, default, legal values
/// and what it changes.
struct CudaTuneKnob {
  const char *name;
  int64_t defaultValue;
  const char *help;
  std::vector<int64_t> values;
};

/// cellc-tune's CUDA knobs, in Knobs.def's order.
inline std::vector<CudaTuneKnob> cudaTuneKnobs() {
  return {
#define CELLC_CUDA_TUNE(Name, Default, Help, ...) {#Name, Default, Help, {__VA_ARGS__}},
#include "dialects/Cell/IR/Knobs.def"
  };
}

/// One key of the CPU JIT's kernel config: its name, what it changes and
/// its legal values (none: the machine's threads, see Knobs.def).
struct CpuTuneKnob {
  const char *name;
  const char *help;
  std::vector<int64_t> values;
};

/// The CPU JIT's config keys, in Knobs.def's order.
inline std::vector<CpuTuneKnob> cpuTuneKnobs() {
  return {
#define CELLC_CPU_TUNE(Name, Member, Unset, Help, ...)                         \
  {#Name, Help, {__VA_ARGS__}},
#include "dialects/Cell/IR/Knobs.def"
  };
}

} // namespace cellc

#endif // CELLC_DIALECTS_CELL_IR_KNOBS_H
