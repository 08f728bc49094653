// The one place that knows which backends were compiled in. GPU backends register first; the
// CPU registers last and is the fallback.
#include "backends/cpu/cpu_backend.h"
#include "src/core/backend.h"

namespace kite {

void register_builtin_backends() { register_backend("cpu", cpu::make_cpu_backend); }

}  // namespace kite
