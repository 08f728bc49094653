// get_rows for Q4_K weights: get_rows.glsl with dequant.glsl's Q4_K decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#define W_Q4_K 1
#include "common.glsl"
#include "dequant.glsl"
#include "get_rows.glsl"
