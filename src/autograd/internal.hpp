// Engine internals shared with other parts of the library (not installed).
#pragma once

#include <cstdint>

namespace dltrain::autograd {

/// The sequence number the next node created will get: nodes created from now on have a
/// sequence_nr() at least this (activation checkpointing tells its segment's nodes from
/// older ones by it).
uint64_t next_sequence_nr();

}  // namespace dltrain::autograd
