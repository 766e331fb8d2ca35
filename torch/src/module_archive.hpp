#pragma once
// A module's parameters and buffers in a torch archive, laid out as Module::save lays them out,
// read back by copying into the module's own tensors (Module::load would swap their storage,
// which auto_model's buckets and the optimizer point into). Checkpoint's files and Recovery's
// catch-up from a survivor both use it.
#include <torch/nn/module.h>
#include <torch/serialize/archive.h>

#include <string>

namespace idist::detail {

// Clones, so that training may go on while the archive is written.
void write_module(torch::serialize::OutputArchive& archive, const torch::nn::Module& module);
// `path` prefixes the names in errors ("model: "). A missing entry, or one of another shape or
// dtype, raises idist::Error ("was it saved from another model?").
void read_module(torch::serialize::InputArchive& archive, torch::nn::Module& module, const std::string& path);

}  // namespace idist::detail
