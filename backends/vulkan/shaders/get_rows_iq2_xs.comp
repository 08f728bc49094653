// get_rows for IQ2_XS weights: get_rows.glsl with dequant.glsl's IQ2_XS decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#define W_IQ2_XS 1
#include "common.glsl"
#include "dequant.glsl"
#include "get_rows.glsl"
