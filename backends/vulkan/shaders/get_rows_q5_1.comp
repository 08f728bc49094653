// get_rows for Q5_1 weights: get_rows.glsl with dequant.glsl's Q5_1 decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#define W_Q5_1 1
#include "common.glsl"
#include "dequant.glsl"
#include "get_rows.glsl"
