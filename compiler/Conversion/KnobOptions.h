//===- KnobOptions.h - Kernel pass options from Knobs.def -------*- C++ -*-===//
//
// A kernel pass's options for the knobs it takes, declared from
// dialects/Cell/IR/Knobs.def rather than in Passes.td (TableGen cannot
// include a .def file), so that a knob is written once. In the pass's class:
//
//   #define CELLC_KNOB_PASS KnobBatched
//   #include "compiler/Conversion/KnobOptions.inc"
//
// declares, for each knob whose uses have that bit, an `Option` member named
// as PipelineOptions' (batchTile), under the knob's flag (batch-tile) and
// help, with its default: an integer knob's, or for a word knob a string
// that is empty where none is named (the pass takes its own default). Knobs
// the pass does not take are `NoKnobOption`s, which hold nothing. The CPU's
// passes take integer knobs only: the strategy word chooses between them.
// `setKnobs(knobs)` sets the options from PipelineOptions' knobs.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_COMPILER_CONVERSION_KNOBOPTIONS_H
#define CELLC_COMPILER_CONVERSION_KNOBOPTIONS_H

#include "dialects/Cell/IR/Knobs.h"

#include <type_traits>

namespace cellc {

/// The member of a pass for a knob it does not take: it ignores its
/// arguments and what is assigned to it.
struct NoKnobOption {
  template <typename... Args>
  explicit NoKnobOption(Args &&...) {}
  template <typename T>
  NoKnobOption &operator=(const T &) {
    return *this;
  }
};

/// `Option`, where the pass takes the knob, else NoKnobOption.
template <bool Takes, typename Option>
using KnobOption = std::conditional_t<Takes, Option, NoKnobOption>;

} // namespace cellc

#endif // CELLC_COMPILER_CONVERSION_KNOBOPTIONS_H
