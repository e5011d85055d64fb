#pragma once
// The host side of programmatic dependent launch (programmatic_launch.cuh says what it is and the rules its kernels
// follow): a scope in which this thread's launches through launch_programmatic carry the PDL attribute. Plain C++,
// so the model's .cpp files can open the scope around a decode step.
namespace elastic::cuda {

namespace pdl_detail {
inline bool& enabled() {
  thread_local bool on = false;
  return on;
}
}  // namespace pdl_detail

// Launches in this scope (on this thread) carry the programmatic-serialization attribute when `on`.
class ProgrammaticLaunch {
 public:
  explicit ProgrammaticLaunch(bool on) : prev_(pdl_detail::enabled()) { pdl_detail::enabled() = on; }
  ~ProgrammaticLaunch() { pdl_detail::enabled() = prev_; }
  ProgrammaticLaunch(const ProgrammaticLaunch&) = delete;
  ProgrammaticLaunch& operator=(const ProgrammaticLaunch&) = delete;

 private:
  bool prev_;
};

}  // namespace elastic::cuda
