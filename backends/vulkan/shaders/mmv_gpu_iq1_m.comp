// mmv_gpu.glsl (GPU-shaped mul_mat) for IQ1_M weights, up to 8 activation columns per workgroup.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define W_IQ1_M 1
#include "common.glsl"
#include "dequant.glsl"
#include "mmv_gpu.glsl"
