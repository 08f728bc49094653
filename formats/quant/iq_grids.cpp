// The host's copy of the IQ codebooks, expanded at compile time (iq_codebooks.h).
#include "formats/quant/iq_codebooks.h"

namespace kite::quant {
namespace {

constexpr IqGrids kGrids = make_iq_grids();

}  // namespace

const IqGrids& iq_grids() {
  return kGrids;
}

}  // namespace kite::quant
