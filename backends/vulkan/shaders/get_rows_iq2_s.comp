// get_rows for IQ2_S weights: get_rows.glsl with dequant.glsl's IQ2_S decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#define W_IQ2_S 1
#include "common.glsl"
#include "dequant.glsl"
#include "get_rows.glsl"
