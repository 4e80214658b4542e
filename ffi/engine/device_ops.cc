#include "device_ops.h"

namespace jaxoff::aio {

const char* CopyKindName(CopyKind kind) {
  switch (kind) {
    case CopyKind::kHostToDevice: return "H2D";
    case CopyKind::kDeviceToHost: return "D2H";
    default: return "D2D";
  }
}

}  // namespace jaxoff::aio
