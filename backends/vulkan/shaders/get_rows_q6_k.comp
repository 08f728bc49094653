// get_rows for Q6_K weights: get_rows.glsl with dequant.glsl's Q6_K decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#define W_Q6_K 1
#include "common.glsl"
#include "dequant.glsl"
#include "get_rows.glsl"
