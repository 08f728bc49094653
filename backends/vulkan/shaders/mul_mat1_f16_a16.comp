// mul_mat of one activation column (decode) for F16 weights whose rows start 16-byte aligned,
// k a multiple of 8 (16-byte loads).
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define MUL_MAT_NC 1
#define W_F16 1
#define W_ALIGNED16 1
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat.glsl"
