// get_rows for Q3_K weights: get_rows.glsl with dequant.glsl's Q3_K decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#define W_Q3_K 1
#include "common.glsl"
#include "dequant.glsl"
#include "get_rows.glsl"
