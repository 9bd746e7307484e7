// SequentialUnits lets a ZeRO-3 engine gather the children of a stock torch::nn::Sequential, which
// no tessera::Unit holder calls: Sequential::forward runs its entries through type-erased
// AnyModules, so for the time the engine lives each entry whose module is a unit is swapped for
// one that brackets the same call with zero::UnitCall (unit_hooks.h), exactly as a holder does.
//
//   auto model = torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 1));
//   auto engine = tessera::initialize(model.ptr(), config).engine;   // stage 3: both Linears are units
//   engine->backward(model->forward(x).pow(2).mean());                // gathered around each entry
//
// The swap is invisible to most code: seq->ptr(i), seq[i] and ptr<LinearImpl>(i) still return the
// original module, parameters and names are unchanged, and clone() copies the originals. Only
// seq->at<LinearImpl>(i) (a typed cast of the entry itself) refuses while the engine lives.
// Destruction puts the original entries back (also when initialize fails after the swap).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace torch::nn {
class Module;
class SequentialImpl;
}

namespace tessera::zero {

class SequentialUnits {
 public:
  // Swaps every entry, of every Sequential in `model` (itself included), whose module is one of
  // `units`.
  SequentialUnits(torch::nn::Module& model, const std::vector<const torch::nn::Module*>& units);
  ~SequentialUnits();
  SequentialUnits(const SequentialUnits&) = delete;
  SequentialUnits& operator=(const SequentialUnits&) = delete;

  // Whether some swapped entry calls `module`.
  bool brackets(const torch::nn::Module* module) const;
  size_t size() const { return swapped_.size(); }

 private:
  struct Swapped;
  std::vector<std::unique_ptr<Swapped>> swapped_;
};

}  // namespace tessera::zero
