// Dequantization on the device: get_rows (a table of any type), copy from a quantized or float
// tensor, and whole weight matrices to F16/F32 for cuBLAS. One thread decodes one 32-element
// unit (quant.cuh) and writes its 32 values.
#include <cuda_fp16.h>

#include "backends/cuda/kernels.h"
#include "backends/cuda/launch.cuh"
#include "backends/cuda/quant.cuh"

namespace kite::cuda {
namespace {

constexpr int kThreads = 256;

unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 1048576 ? 1048576 : b));
}

__device__ __forceinline__ void store(int dst_type, void* row, int64_t i, float v) {
  if (dst_type == kF32) static_cast<float*>(row)[i] = v;
  else if (dst_type == kF16) static_cast<__half*>(row)[i] = __float2half_rn(v);
  else static_cast<uint16_t*>(row)[i] = to_bf16(v);
}

// Units of rows: unit u of source row r -> 32 values of destination row r.
template <int T>
__global__ void dequant_rows_kernel(Rows src, int dst_type, Rows dst, int64_t units_per_row, int64_t n_units) {
  KITE_GRID_DEPENDENCY();
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n_units;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / units_per_row, un = idx % units_per_row;
    Unit u;
    load_unit<T>(row_ptr(src, r), static_cast<int>(un), u);
    uint8_t* out = row_ptr(dst, r);
#pragma unroll
    for (int e = 0; e < 32; ++e) store(dst_type, out, un * 32 + e, unit_value(u, e));
  }
}

template <int T>
__global__ void get_rows_kernel(const uint8_t* table, size_t nb1, const int32_t* ids, float* dst,
                                int64_t units_per_row, int64_t n_units) {
  KITE_GRID_DEPENDENCY();
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n_units;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / units_per_row, un = idx % units_per_row;
    Unit u;
    load_unit<T>(table + static_cast<int64_t>(ids[r]) * nb1, static_cast<int>(un), u);
    float* out = dst + r * units_per_row * 32 + un * 32;
#pragma unroll
    for (int e = 0; e < 32; ++e) out[e] = unit_value(u, e);
  }
}

__global__ void get_rows_float_kernel(int type, const uint8_t* table, size_t nb1, const int32_t* ids, float* dst,
                                      int64_t ne0, int64_t n) {
  KITE_GRID_DEPENDENCY();
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < ne0 * n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / ne0, i = idx % ne0;
    dst[idx] = load_float(type, table + static_cast<int64_t>(ids[r]) * nb1, i);
  }
}

// Weight units to a dense half or float matrix (row i at dst + i * k).
template <int T, bool F16>
__global__ void dequant_matrix_kernel(const uint8_t* w, size_t row_bytes, int64_t units_per_row, int64_t n_units,
                                      void* dst) {
  KITE_GRID_DEPENDENCY();
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n_units;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / units_per_row, un = idx % units_per_row;
    Unit u;
    load_unit<T>(w + r * row_bytes, static_cast<int>(un), u);
    const int64_t base = r * units_per_row * 32 + un * 32;
    if (F16) {
      __half2* out = reinterpret_cast<__half2*>(static_cast<__half*>(dst) + base);
#pragma unroll
      for (int e = 0; e < 32; e += 2) out[e / 2] = __floats2half2_rn(unit_value(u, e), unit_value(u, e + 1));
    } else {
      float* out = static_cast<float*>(dst) + base;
#pragma unroll
      for (int e = 0; e < 32; ++e) out[e] = unit_value(u, e);
    }
  }
}

template <bool F16>
__global__ void float_matrix_kernel(int type, const uint8_t* w, size_t row_bytes, int64_t k, int64_t n, void* dst) {
  KITE_GRID_DEPENDENCY();
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / k, i = idx % k;
    const float v = load_float(type, w + r * row_bytes, i);
    if (F16) static_cast<__half*>(dst)[idx] = __float2half_rn(v);
    else static_cast<float*>(dst)[idx] = v;
  }
}

}  // namespace

bool quant_type_supported(int type) {
  return dispatch_quant(type, [](auto) {});
}

int type_block_elems(int type) {
  switch (type) {
    case kQ2_K: case kQ3_K: case kQ4_K: case kQ5_K: case kQ6_K: case kIQ4_XS:
    case kIQ2_XXS: case kIQ2_XS: case kIQ2_S: case kIQ3_XXS: case kIQ3_S: case kIQ1_S: case kIQ1_M: return 256;
    case kF32: case kF16: case kBF16: case kI32: return 1;
    default: return 32;
  }
}

int type_block_bytes(int type) {
  switch (type) {
    case kF32: case kI32: return 4;
    case kF16: case kBF16: return 2;
    case kQ4_0: return sizeof(quant::BlockQ4_0);
    case kQ4_1: return sizeof(quant::BlockQ4_1);
    case kQ5_0: return sizeof(quant::BlockQ5_0);
    case kQ5_1: return sizeof(quant::BlockQ5_1);
    case kQ8_0: return sizeof(quant::BlockQ8_0);
    case kIQ4_NL: return sizeof(quant::BlockIQ4_NL);
    case kQ2_K: return sizeof(quant::BlockQ2_K);
    case kQ3_K: return sizeof(quant::BlockQ3_K);
    case kQ4_K: return sizeof(quant::BlockQ4_K);
    case kQ5_K: return sizeof(quant::BlockQ5_K);
    case kQ6_K: return sizeof(quant::BlockQ6_K);
    case kIQ4_XS: return sizeof(quant::BlockIQ4_XS);
    case kIQ2_XXS: return sizeof(quant::BlockIQ2_XXS);
    case kIQ2_XS: return sizeof(quant::BlockIQ2_XS);
    case kIQ2_S: return sizeof(quant::BlockIQ2_S);
    case kIQ3_XXS: return sizeof(quant::BlockIQ3_XXS);
    case kIQ3_S: return sizeof(quant::BlockIQ3_S);
    case kIQ1_S: return sizeof(quant::BlockIQ1_S);
    case kIQ1_M: return sizeof(quant::BlockIQ1_M);
    default: return 0;
  }
}

cudaError_t launch_get_rows(int type, const void* table, size_t table_nb1, const int32_t* ids, float* dst,
                            int64_t ne0, int64_t n, cudaStream_t s) {
  if (ne0 * n == 0) return cudaSuccess;
  const auto* t = static_cast<const uint8_t*>(table);
  if (type == kF32 || type == kF16 || type == kBF16) {
    KITE_KERNEL(grid_for(ne0 * n), kThreads, 0, s, get_rows_float_kernel)(type, t, table_nb1, ids, dst, ne0, n);
    return cudaGetLastError();
  }
  const int64_t upr = ne0 / 32, n_units = upr * n;
  if (!dispatch_quant(type, [&](auto tag) {
        constexpr int T = decltype(tag)::value;
        KITE_KERNEL(grid_for(n_units), kThreads, 0, s, get_rows_kernel<T>)(t, table_nb1, ids, dst, upr, n_units);
      }))
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t launch_dequant_rows(int type, Rows src, int dst_type, Rows dst, int64_t ne0, int64_t n_rows,
                                cudaStream_t s) {
  if (ne0 * n_rows == 0) return cudaSuccess;
  if (type == kF32 || type == kF16 || type == kBF16)
    return launch_convert_rows(type, src, dst_type, dst, nullptr, ne0, n_rows, s);
  const int64_t upr = ne0 / 32, n_units = upr * n_rows;
  if (!dispatch_quant(type, [&](auto tag) {
        constexpr int T = decltype(tag)::value;
        KITE_KERNEL(grid_for(n_units), kThreads, 0, s, dequant_rows_kernel<T>)(src, dst_type, dst, upr, n_units);
      }))
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t launch_dequant_matrix(int type, const void* w, size_t row_bytes, int64_t k, int64_t rows, void* dst,
                                  bool dst_f16, cudaStream_t s) {
  if (k * rows == 0) return cudaSuccess;
  const auto* wp = static_cast<const uint8_t*>(w);
  if (type == kF32 || type == kF16 || type == kBF16) {
    if (dst_f16) KITE_KERNEL(grid_for(k * rows), kThreads, 0, s, float_matrix_kernel<true>)(type, wp, row_bytes, k, k * rows, dst);
    else KITE_KERNEL(grid_for(k * rows), kThreads, 0, s, float_matrix_kernel<false>)(type, wp, row_bytes, k, k * rows, dst);
    return cudaGetLastError();
  }
  const int64_t upr = k / 32, n_units = upr * rows;
  if (!dispatch_quant(type, [&](auto tag) {
        constexpr int T = decltype(tag)::value;
        if (dst_f16)
          KITE_KERNEL(grid_for(n_units), kThreads, 0, s, dequant_matrix_kernel<T, true>)(wp, row_bytes, upr, n_units, dst);
        else
          KITE_KERNEL(grid_for(n_units), kThreads, 0, s, dequant_matrix_kernel<T, false>)(wp, row_bytes, upr, n_units, dst);
      }))
    return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace kite::cuda
