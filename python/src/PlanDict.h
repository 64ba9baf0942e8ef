//===- PlanDict.h - A memory plan as Python sees it ------------*- C++ -*-===//
//
// The one dict of a driver::MemoryPlan, for both extensions: a step form's
// plan (_cellc_runtime's CompiledCell.memory_plan) and the chunk form's
// (_cellc.chunk_plan, which adds its parts).
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_PYTHON_PLANDICT_H
#define CELLC_PYTHON_PLANDICT_H

#include "runtime/driver/SequenceDriver.h"

#include <pybind11/pybind11.h>

#include <initializer_list>
#include <utility>

namespace cellc::python {

/// A memory plan as Python sees it: bytes by name.
inline pybind11::dict planDict(const driver::MemoryPlan &plan) {
  pybind11::dict d;
  for (auto [name, bytes] : std::initializer_list<std::pair<const char *, int64_t>>{
           {"kept", plan.driver.kept}, {"kept_outputs", plan.keptOutputs},
           {"forward_peak", plan.driver.forwardPeak},
           {"backward_peak", plan.driver.backwardPeak}, {"piece_steps", plan.pieceSteps},
           {"outputs", plan.outputs}, {"final_states", plan.finalStates},
           {"grad_outputs", plan.gradOutputs}, {"grad_inputs", plan.gradInputs},
           {"grad_params", plan.gradParams}, {"peak", plan.peak()}, {"floor", plan.floor()}})
    d[name] = bytes;
  return d;
}

} // namespace cellc::python

#endif // CELLC_PYTHON_PLANDICT_H
