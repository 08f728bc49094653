// mul_mat for IQ2_XS weights: mul_mat.glsl with dequant.glsl's IQ2_XS decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#define W_IQ2_XS 1
#include "common.glsl"
#include "dequant.glsl"
#include "mul_mat.glsl"
