// An engine this build or machine lacks, registered under its name so that asking for it says what to install, or
// that no version of xpuruntime has it yet and what to use instead (Note [Declared engines]). Internal header of src/cpp, for the engines' registration functions
// (engines/<name>/) and core/engine.cpp.
//
// Note [Declared engines]
// Like kernels (Note [Declared kernels of absent backends]), every engine name xpuruntime knows is registered in
// every build: an engine this build or machine lacks ("tensorrt" here) is an engine whose `available` says what
// to install, so `InferenceSession(engine="tensorrt")` fails with that sentence instead of "unknown engine". Each
// such engine has its own folder and registration function (engines/tensorrt/, engines/openvino/, engines/qnn/:
// `register_<name>`), where its real implementation will go; core/engine.cpp declares onnxruntime this way in a
// build without ONNX Runtime.
//
// Ownership: the registry owns the engine. Thread-safety: immutable after construction.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "xpuruntime/engine.h"
#include "xpuruntime/exceptions.h"

namespace xpuruntime {

class DeclaredEngine final : public Engine {
 public:
  // `reason`: what is missing and how to install it (naming only packages, scripts and build options that exist),
  // the whole of every refusal.
  DeclaredEngine(std::string name, std::string reason) : Engine(std::move(name)), reason_(std::move(reason)) {}
  Support available(const SessionOptions&) const override { return Support::no(reason_); }
  std::unique_ptr<EngineSession> create(const std::string&, const SessionOptions&) const override {
    throw UnsupportedOperationError(reason_);
  }

 private:
  std::string reason_;
};

}  // namespace xpuruntime
