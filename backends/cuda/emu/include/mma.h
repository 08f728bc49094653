// The CUDA emulator's stand-in for the toolkit header of this name (backends/cuda/emu): the
// warp matrix functions (nvcuda::wmma) for 8-bit integer inputs with int accumulators (sm_72+ on
// a GPU) and half inputs with float accumulators (sm_70+), the parts kite's kernels use.
//
// Semantics are the CUDA programming guide's ("Warp Matrix Functions"):
// - a fragment is a warp's share of an M x K (matrix_a), K x N (matrix_b) or M x N (accumulator)
//   tile; shapes m16n16k16, m32n8k16, m8n32k16;
// - load_matrix_sync / store_matrix_sync: element (i, j) of the tile is at mptr[i * ldm + j]
//   (row major) or mptr[j * ldm + i] (column major); mptr 256-bit aligned, ldm a multiple of 16
//   bytes; matrix_a/matrix_b take their layout from the fragment type, the accumulator from the
//   call's layout_t;
// - mma_sync(d, a, b, c, satf): d = a * b + c in 32-bit integers (wrapping; with satf, clamped)
//   for 8-bit inputs; for half inputs, float products (exact) summed into c in float, k in order
//   (a GPU's tensor cores round the sum their own way: results agree to float rounding);
// - every call is warp-collective with the same arguments in every lane.
//
// Emulation: each lane's fragment holds the whole tile (element (i, j) at x[i * cols + j]); lane
// 0 computes a product and the warp's other lanes copy it. On a GPU the elements are spread over
// the lanes in an unspecified way, so code must not read x[] by position (fill_fragment and
// elementwise use of every x[] element are fine, including scaling x[k] by a factor that depends
// on the row of x[k], learned from a fragment loaded from a matrix of row numbers: the mapping is
// the same for every fragment of one type). Each call starts with a
// full-warp exchange, which fails the kernel unless all 32 lanes take part; loads and stores
// also check that the lanes passed the same pointer, stride and layout, that the pointer is
// 256-bit aligned and the stride a multiple of 16 bytes (a violation fails the kernel, reported
// on stderr, as undefined behaviour could on a GPU).
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backends/cuda/emu/kernel.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};

enum layout_t { mem_row_major, mem_col_major };

namespace detail {

template <int M, int N, int K>
inline constexpr bool kShapeOk = (M == 16 && N == 16 && K == 16) || (M == 32 && N == 8 && K == 16) ||
                                 (M == 8 && N == 32 && K == 16);

// The tile a fragment holds: rows x cols.
template <class Use, int M, int N, int K>
struct Tile;
template <int M, int N, int K>
struct Tile<matrix_a, M, N, K> {
  static constexpr int kRows = M, kCols = K;
};
template <int M, int N, int K>
struct Tile<matrix_b, M, N, K> {
  static constexpr int kRows = K, kCols = N;
};
template <int M, int N, int K>
struct Tile<accumulator, M, N, K> {
  static constexpr int kRows = M, kCols = N;
};

template <class T>
inline constexpr bool kInt8 = std::is_same_v<T, signed char> || std::is_same_v<T, unsigned char>;
template <class T>
inline constexpr bool kInput = kInt8<T> || std::is_same_v<T, __half>;
template <class T>
inline constexpr bool kAccum = std::is_same_v<T, int> || std::is_same_v<T, float>;

inline float to_float(__half h) { return __half2float(h); }

// Fails the running kernel (reported on stderr; later synchronizations return an error).
inline void fail(const char* op, const std::string& what) {
  ::kite::cuda::emu::kernel_failed("(wmma)", (std::string(op) + ": " + what).c_str());
}

// All 32 lanes of the warp take part: a full-warp exchange fails the kernel otherwise (where a
// __syncwarp() alone would release the lanes still running).
// (The wait is where all_lanes is called: lanes at two different warp matrix operations fail.)
inline void all_lanes(::kite::cuda::emu::Site site = ::kite::cuda::emu::Site::current()) {
  (void)::kite::cuda::emu::shuffle(0xffffffffu, 0u, 0, site);
}

// The warp-collective prologue of the loads and stores: all 32 lanes arrive (one full-warp
// exchange), and all pass lane 0's pointer, stride and layout (each lane compares its own with
// lane 0's, received in the same exchange); the pointer is 256-bit aligned and the stride 16
// bytes' worth.
inline void enter(const char* op, const void* p, unsigned ldm, int layout, size_t elem_bytes,
                  ::kite::cuda::emu::Site site = ::kite::cuda::emu::Site::current()) {
  namespace emu = ::kite::cuda::emu;
  const auto bits = reinterpret_cast<uint64_t>(p);
  const uint64_t key = bits * 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(ldm) << 8 | static_cast<uint64_t>(layout & 0xff));
  if (emu::shuffle(0xffffffffu, key, 0, site) != key) {
    fail(op, "the lanes of the warp passed different pointers, strides or layouts");
    return;
  }
  if (emu::lane_id() != 0) return;  // (one report per warp)
  if (bits % 32 != 0) fail(op, "pointer " + std::to_string(bits) + " is not 256-bit aligned");
  if ((static_cast<size_t>(ldm) * elem_bytes) % 16 != 0)
    fail(op, "ldm " + std::to_string(ldm) + " is not a multiple of 16 bytes");
}

}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
  static_assert(detail::kShapeOk<M, N, K>, "wmma (emulated): shapes are m16n16k16, m32n8k16, m8n32k16");
  static_assert(std::is_same_v<Use, accumulator>
                    ? detail::kAccum<T> && std::is_void_v<Layout>
                    : detail::kInput<T> && (std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>),
                "wmma (emulated): signed/unsigned char or half matrix_a/matrix_b with a row_major/col_major "
                "layout, int or float accumulators without one");

 public:
  using element_type = T;
  static constexpr int kRows = detail::Tile<Use, M, N, K>::kRows;
  static constexpr int kCols = detail::Tile<Use, M, N, K>::kCols;
  enum { num_elements = kRows * kCols };
  T x[num_elements];  // (emulation) the whole tile, element (i, j) at x[i * kCols + j]
};

template <class Use, int M, int N, int K, class T, class Layout>
inline void fill_fragment(fragment<Use, M, N, K, T, Layout>& a, const T& v) {
  detail::all_lanes();
  for (T& e : a.x) e = v;
}

// matrix_a / matrix_b: the layout is the fragment's.
template <class Use, int M, int N, int K, class T, class Layout>
inline void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& a, const T* mptr, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator is loaded with a layout_t argument");
  constexpr bool kRow = std::is_same_v<Layout, row_major>;
  detail::enter("load_matrix_sync", mptr, ldm, kRow ? 0 : 1, sizeof(T));
  using F = fragment<Use, M, N, K, T, Layout>;
  for (int i = 0; i < F::kRows; ++i)
    for (int j = 0; j < F::kCols; ++j)
      a.x[i * F::kCols + j] = kRow ? mptr[static_cast<size_t>(i) * ldm + j] : mptr[static_cast<size_t>(j) * ldm + i];
}

template <int M, int N, int K, class T>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T>& a, const T* mptr, unsigned ldm, layout_t layout) {
  detail::enter("load_matrix_sync", mptr, ldm, layout, sizeof(T));
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j)
      a.x[i * N + j] =
          layout == mem_row_major ? mptr[static_cast<size_t>(i) * ldm + j] : mptr[static_cast<size_t>(j) * ldm + i];
}

template <int M, int N, int K, class T>
inline void store_matrix_sync(T* mptr, const fragment<accumulator, M, N, K, T>& a, unsigned ldm, layout_t layout) {
  detail::enter("store_matrix_sync", mptr, ldm, layout, sizeof(T));
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      T& e =
          layout == mem_row_major ? mptr[static_cast<size_t>(i) * ldm + j] : mptr[static_cast<size_t>(j) * ldm + i];
      e = a.x[i * N + j];
    }
}

// d = a * b + c: 32-bit integer arithmetic for 8-bit inputs (wrapping, or with satf clamped to
// the int range); float for half inputs.
template <int M, int N, int K, class TD, class TA, class LA, class TB, class LB>
inline void mma_sync(fragment<accumulator, M, N, K, TD>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
                     const fragment<matrix_b, M, N, K, TB, LB>& b, const fragment<accumulator, M, N, K, TD>& c,
                     bool satf = false) {
  constexpr bool kHalf = std::is_same_v<TA, __half>;
  static_assert(std::is_same_v<TA, TB>, "wmma (emulated): matrix_a and matrix_b of one input type");
  static_assert(kHalf ? std::is_same_v<TD, float> : std::is_same_v<TD, int>,
                "wmma (emulated): half inputs accumulate in float, 8-bit inputs in int");
  detail::all_lanes();
  // Every lane holds the same fragments (the loads check the lanes' arguments agree), so lane 0
  // computes the product once for its warp and, after a second barrier, the other lanes copy it
  // (lanes resume from a barrier in any order: KITE_CUDA_EMU_SCHEDULE). The next mma_sync's first
  // barrier keeps lane 0 from overwriting it before all have copied. (A block runs at a time, so
  // a function static indexed by warp is the block's.)
  static TD shared_out[32][M * N];
  namespace emu = ::kite::cuda::emu;
  const auto& id = emu::ids();
  const unsigned warp = (id.thread_idx.x + id.block_dim.x * (id.thread_idx.y + id.block_dim.y * id.thread_idx.z)) / 32;
  TD* out = shared_out[warp];  // (d may be c)
  if (emu::lane_id() == 0) {
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        if constexpr (kHalf) {
          float s = c.x[i * N + j];
          for (int e = 0; e < K; ++e) s += detail::to_float(a.x[i * K + e]) * detail::to_float(b.x[e * N + j]);
          out[i * N + j] = s;
        } else {
          int64_t s = c.x[i * N + j];
          for (int e = 0; e < K; ++e)
            s += static_cast<int64_t>(a.x[i * K + e]) * static_cast<int64_t>(b.x[e * N + j]);
          if (satf) s = s < INT_MIN ? INT_MIN : (s > INT_MAX ? INT_MAX : s);
          out[i * N + j] = static_cast<int>(static_cast<uint32_t>(static_cast<uint64_t>(s)));
        }
      }
  }
  detail::all_lanes();  // lane 0 has computed it
  for (int i = 0; i < M * N; ++i) d.x[i] = out[i];
}

}  // namespace nvcuda::wmma
