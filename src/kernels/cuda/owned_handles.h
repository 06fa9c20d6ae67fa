// Handles of a CUDA library (cuDNN descriptors, CUDA events) owned by a scope: destroyed on
// every path out of it, last created first, unless released to another owner.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace forge::cuda {

template <typename Handle, auto Destroy>
class OwnedHandles {
 public:
  OwnedHandles() = default;
  OwnedHandles(const OwnedHandles&) = delete;
  OwnedHandles& operator=(const OwnedHandles&) = delete;
  ~OwnedHandles() {
    for (auto it = handles_.rbegin(); it != handles_.rend(); ++it) Destroy(*it);
  }

  void Own(Handle h) { handles_.push_back(h); }
  Handle operator[](size_t i) const { return handles_[i]; }
  Handle back() const { return handles_.back(); }
  // Hands the handles to the caller, who destroys them.
  std::vector<Handle> Release() { return std::exchange(handles_, {}); }

 private:
  std::vector<Handle> handles_;
};

}  // namespace forge::cuda
