// Reading PyTorch state-dict files written by torch.save (.pth / .pt).
//
// torch.save (PyTorch >= 1.6) writes a ZIP archive of uncompressed (STORED) records:
// `<archive>/data.pkl`, a pickle of the saved object in which every tensor is a call to
// torch._utils._rebuild_tensor_v2 on a persistent storage reference, and
// `<archive>/data/<key>`, the raw little-endian bytes of each storage. load_pth parses
// the archive itself (local headers, central directory, ZIP64 records; CRC-32 checked)
// and runs a minimal pickle machine that knows only what a state dict needs: dicts and
// OrderedDicts, lists, tuples, strings, numbers, booleans, None, tensors and parameters.
// It never executes anything: a pickle that names any other Python object (a whole
// nn.Module, an argparse.Namespace, a tensor subclass), uses an opcode outside that
// subset, or a file in the legacy (pre-1.6) format, with compressed entries or
// big-endian data raises dltrain::Error that says what was found and how to re-save the
// file (`torch.save(model.state_dict(), path)`). Saving .pth is not offered: write
// safetensors (dltrain/io/safetensors.hpp), which PyTorch reads without pickle.
#pragma once

#include <string>

#include "dltrain/core/state_dict.hpp"

namespace dltrain::io {

/// Loads the state dict saved by `torch.save(obj, path)` onto the CPU, in the saved order.
///
/// `obj` is a dict or OrderedDict of name -> tensor (what `module.state_dict()` returns;
/// parameters saved directly are accepted too), or a checkpoint dict holding one under
/// "state_dict", "model_state_dict" or "model" (the first of these keys whose value is
/// a dict of tensors wins; the rest of the checkpoint, e.g. optimizer state, is parsed
/// and ignored). Storage types Float, Double, Half, BFloat16, Long, Int, Byte and Bool
/// map to f32 f64 f16 bf16 i64 i32 u8 b8; Char (int8) and Short (int16) are widened
/// losslessly to i32. Tensors keep PyTorch's sizes, strides and storage offsets: tensors
/// that shared a storage in PyTorch (views, tied weights) share one here, and a
/// transposed or sliced tensor is loaded as the same view (call .contiguous() for a
/// row-major copy). Tensors saved on a GPU load onto the CPU; requires_grad is dropped.
/// Throws dltrain::Error naming the file and the problem for a missing, truncated or
/// corrupt file and for anything outside the supported subset (see the file comment).
StateDict load_pth(const std::string& path);

}  // namespace dltrain::io
