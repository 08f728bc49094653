// get_rows for IQ4_NL weights: get_rows.glsl with dequant.glsl's IQ4_NL decoding.
#version 460
#extension GL_GOOGLE_include_directive : require
#define W_IQ4_NL 1
#include "common.glsl"
#include "dequant.glsl"
#include "get_rows.glsl"
