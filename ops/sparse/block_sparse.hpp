#pragma once
// The sparse attention backend: flash tasks that walk per-(head, query block) lists of KV
// blocks, so a block of scores nobody keeps is never computed.

#include "ops/attention/call.hpp"

namespace ditops::sparse {

/// attention_forward's AttentionBackend::sparse: the call's boolean mask is scanned once into
/// per-(batch, head, query block) lists of the 64-key blocks it keeps anything of; the flash
/// kernel visits only those (and masks inside them as usual). Requires a boolean mask and a
/// dense call (the backend table in ops/attention/backends.cpp refuses others).
void run_sparse_backend(const attention::Call& call, int threads);

}  // namespace ditops::sparse
