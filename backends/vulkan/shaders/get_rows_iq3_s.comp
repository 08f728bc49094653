// get_rows for IQ3_S weights: get_rows.glsl with dequant.glsl's IQ3_S decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#define W_IQ3_S 1
#include "common.glsl"
#include "dequant.glsl"
#include "get_rows.glsl"
