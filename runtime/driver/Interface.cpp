//===- Interface.cpp - Elements, views, recompute modes, interfaces -------===//
//
// The words the driver and its callers share: element types, views of
// caller memory, recompute modes, and a cell's interface (its slots and
// projections) derived from its kernels' arguments.
//
//===----------------------------------------------------------------------===//

#include "runtime/driver/SequenceDriver.h"

using namespace cellc;
using namespace cellc::driver;

std::string cellc::driver::shapeString(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

size_t cellc::driver::indexOf(const std::vector<Slot> &slots, const std::string &name) {
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i].name == name)
      return i;
  return size_t(-1);
}

//===----------------------------------------------------------------------===//
// Elements, views, recompute modes
//===----------------------------------------------------------------------===//

int64_t cellc::driver::bytesOf(Element element) {
  switch (element) {
  case Element::F32:
  case Element::I32:
    return 4;
  case Element::F64:
    return 8;
  case Element::BF16:
    return 2;
  case Element::U8:
    return 1;
  }
  return 1;
}

std::optional<Element> cellc::driver::parseElement(std::string_view name) {
  if (name == "f32")
    return Element::F32;
  if (name == "f64")
    return Element::F64;
  if (name == "bf16")
    return Element::BF16;
  if (name == "i8" || name == "ui8")
    return Element::U8;
  if (name == "i32")
    return Element::I32;
  return std::nullopt;
}

const char *cellc::driver::elementName(Element element) {
  switch (element) {
  case Element::F32:
    return "f32";
  case Element::F64:
    return "f64";
  case Element::BF16:
    return "bf16";
  case Element::U8:
    return "i8";
  case Element::I32:
    return "i32";
  }
  return "?";
}

int64_t View::size() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

View View::at(int64_t elements, std::vector<int64_t> newShape) const {
  View v = *this;
  v.offset += elements;
  v.shape = std::move(newShape);
  return v;
}

void *View::pointer() const {
  if (!buffer.data)
    return nullptr;
  return static_cast<char *>(buffer.data) + offset * bytesOf(buffer.element);
}

std::optional<Recompute> Recompute::parse(std::string_view text) {
  Recompute mode;
  if (text == "none")
    return mode;
  if (text == "full") {
    mode.kind = Kind::Full;
    return mode;
  }
  std::string_view prefix = "chunk:";
  if (text.substr(0, prefix.size()) != prefix || text.size() == prefix.size())
    return std::nullopt;
  int64_t k = 0;
  for (char c : text.substr(prefix.size())) {
    if (c < '0' || c > '9' || k > (int64_t(1) << 40))
      return std::nullopt;
    k = k * 10 + (c - '0');
  }
  if (k < 1)
    return std::nullopt;
  mode.kind = Kind::Chunk;
  mode.chunk = k;
  return mode;
}

Status Recompute::parse(std::string_view text, Recompute &out) {
  if (std::optional<Recompute> mode = parse(text)) {
    out = *mode;
    return Status();
  }
  return Status::error("recompute must be 'none', 'full' or 'chunk:K' with K > 0, not '" +
                       std::string(text) + "'");
}

std::string Recompute::str() const {
  if (kind == Kind::Chunk)
    return "chunk:" + std::to_string(chunk);
  return kind == Kind::Full ? "full" : "none";
}

//===----------------------------------------------------------------------===//
// Interface
//===----------------------------------------------------------------------===//

Status Interface::finish() {
  inputs.clear(), states.clear(), params.clear(), outputs.clear();
  projections.clear();
  for (const KernelArg &arg : forward.args) {
    int64_t n = arg.shape.empty() ? 0 : arg.shape.back();
    // The cell's signature and element types; the other arguments are
    // bound per call or per chunk (SequenceDriver::bind).
    if (arg.kind == ArgKind::Input)
      inputs.push_back({arg.name, {n}});
    else if (arg.kind == ArgKind::InitialState)
      states.push_back({arg.name, {n}});
    else if (arg.kind == ArgKind::Param)
      params.push_back({arg.name, arg.shape});
    else if (arg.kind == ArgKind::Output)
      outputs.push_back({arg.name, {n}});
    else if (arg.kind == ArgKind::Gates)
      gatesWidth = n;
    else if (arg.kind == ArgKind::EndState)
      endStates = true;
    if (arg.kind == ArgKind::Input || arg.kind == ArgKind::StateHistory)
      storage = arg.element.value_or(compute);
  }
  for (const KernelArg &arg : forward.args) {
    if (arg.kind != ArgKind::Projection)
      continue;
    Projection p;
    p.weight = indexOf(params, arg.name);
    p.input = indexOf(inputs, arg.input);
    if (p.weight == size_t(-1) || p.input == size_t(-1) ||
        params[p.weight].shape.size() < 2 || params[p.weight].shape.size() > 3)
      return Status::error("the projection of '" + arg.name + "' names no matrix "
                           "param or input");
    for (const std::string &b : arg.biases) {
      size_t bias = indexOf(params, b);
      if (bias == size_t(-1))
        return Status::error("the projection of '" + arg.name +
                             "' adds an unknown param '" + b + "'");
      p.biases.push_back(bias);
    }
    const std::vector<int64_t> &shape = params[p.weight].shape;
    p.blocks = shape.size() == 3 ? shape[0] : 1;
    p.rows = p.blocks * shape[shape.size() - 2];
    p.cols = p.blocks * shape.back();
    p.element = arg.element.value_or(compute);
    projections.push_back(p);
  }
  if (states.empty())
    return Status::error("the forward kernel has no state");
  // An output named as a state is that state after each step (an output is
  // the last statement), so one buffer can hold both where they are stored
  // alike.
  auto elementOf = [&](ArgKind kind, const std::string &name) {
    for (const KernelArg &arg : forward.args)
      if (arg.kind == kind && arg.name == name)
        return arg.element;
    return std::optional<Element>();
  };
  stateOutputs.assign(states.size(), -1);
  for (size_t i = 0; i < states.size(); ++i) {
    size_t o = indexOf(outputs, states[i].name);
    if (o != size_t(-1) && outputs[o].shape == states[i].shape &&
        elementOf(ArgKind::Output, states[i].name) ==
            elementOf(ArgKind::StateHistory, states[i].name))
      stateOutputs[i] = int64_t(o);
  }
  return Status();
}

