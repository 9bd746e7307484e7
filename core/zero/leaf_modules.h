// ZeRO-3 leaf modules: a leaf is gathered whole (every parameter of its subtree in one unit) around
// its own forward, and nothing below it is a unit, so a block that routes its input to different
// children on different ranks (mixture of experts) gathers the same unit on every rank.
//
// Marks are kept per module (by identity; a module that dies loses its mark) and read by a stage-3
// initialize, which also takes zero_optimization.leaf_module and DeepSpeed's default classes. The
// leaf must be called through a tessera::Unit holder; holders below it stay plain holders.
//
// Class names: LibTorch's module name (torch::nn::Module::name(), e.g. "torch::nn::LinearImpl",
// "tessera::nn::SparseMoeBlockImpl"). A pattern matches with or without its namespace and with or
// without the "Impl" suffix ("Linear", "LinearImpl", "torch::nn::Linear"); a dotted Python path
// ("transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock") matches by its last part.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace tessera {

// Each returns the dotted names of the modules it marked (in named_modules order). By name, a name
// the model does not have is an Error (nothing is marked then).
std::vector<std::string> set_z3_leaf_modules(torch::nn::Module& model, const std::vector<std::string>& classes);
std::vector<std::string> set_z3_leaf_modules_by_name(torch::nn::Module& model, const std::vector<std::string>& names);
std::vector<std::string> set_z3_leaf_modules_by_suffix(torch::nn::Module& model, const std::vector<std::string>& suffixes);
// Removes the marks of the modules of these classes (every mark in the model with no classes).
void unset_z3_leaf_modules(torch::nn::Module& model, const std::vector<std::string>& classes = {});
bool z3_leaf_module(const torch::nn::Module& module);
// The dotted names of the model's marked modules.
std::vector<std::string> get_z3_leaf_modules(torch::nn::Module& model);

// DeepSpeed's default leaf classes: the Mixtral, Qwen2-MoE and Qwen3-MoE sparse MoE blocks.
const std::vector<std::string>& default_z3_leaf_classes();
// Whether a class pattern (see above) names LibTorch module name `module_name`.
bool z3_class_matches(const std::string& pattern, const std::string& module_name);
// Whether dotted module name `name` ends with `suffix` as whole components ("experts" matches
// "layers.0.experts", not "layers.0.my_experts").
bool z3_suffix_matches(const std::string& suffix, const std::string& name);

}  // namespace tessera
