// mul_mat of one activation column (decode) for IQ1_M weights: mul_mat.glsl with NC = 1.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define MUL_MAT_NC 1
#define W_IQ1_M 1
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat.glsl"
