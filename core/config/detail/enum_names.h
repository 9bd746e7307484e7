// The spelling of every enum value in configuration files, in one table per enum, used by the
// decoder (case-insensitive match), the encoder and name_of().
#pragma once

#include <utility>

#include "core/config/config.h"

namespace tessera::config::detail {

template <class E> struct EnumNames;

#define TESSERA_ENUM_NAMES(E, what, ...)                             \
  template <> struct EnumNames<E> {                                  \
    static constexpr const char* kWhat = what;                       \
    static constexpr std::pair<E, const char*> kNames[] = {__VA_ARGS__}; \
  };

TESSERA_ENUM_NAMES(OffloadDevice, "an offload device", {OffloadDevice::none, "none"}, {OffloadDevice::cpu, "cpu"},
                   {OffloadDevice::nvme, "nvme"})
TESSERA_ENUM_NAMES(OptimizerType, "an optimizer type", {OptimizerType::adam, "Adam"}, {OptimizerType::adamw, "AdamW"},
                   {OptimizerType::sgd, "SGD"}, {OptimizerType::adagrad, "Adagrad"}, {OptimizerType::lion, "Lion"})
TESSERA_ENUM_NAMES(SchedulerType, "a scheduler type", {SchedulerType::warmup_lr, "WarmupLR"},
                   {SchedulerType::warmup_decay_lr, "WarmupDecayLR"},
                   {SchedulerType::warmup_cosine_lr, "WarmupCosineLR"}, {SchedulerType::one_cycle, "OneCycle"})
TESSERA_ENUM_NAMES(PartitionType, "a partition type", {PartitionType::row, "row"},
                   {PartitionType::column, "column"}, {PartitionType::skip, "skip"})
TESSERA_ENUM_NAMES(TransportBackend, "a transport backend", {TransportBackend::automatic, "auto"},
                   {TransportBackend::ucx, "ucx"}, {TransportBackend::gloo, "gloo"}, {TransportBackend::nccl, "nccl"})
TESSERA_ENUM_NAMES(TagValidation, "a tag validation mode", {TagValidation::ignore, "Ignore"},
                   {TagValidation::warn, "Warn"}, {TagValidation::fail, "Fail"})

#undef TESSERA_ENUM_NAMES

// The replica policy's names are core/affine's own table (callback has no name: it needs code).
template <> struct EnumNames<affine::ReplicaPolicyKind> {
  static constexpr const char* kWhat = "a replica policy";
  static constexpr const auto& kNames = affine::kReplicaPolicyNames;
};

template <class E> const char* enum_name(E value) {
  for (const auto& [v, name] : EnumNames<E>::kNames) {
    if (v == value) return name;
  }
  return "?";
}

}  // namespace tessera::config::detail
