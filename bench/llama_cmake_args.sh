#!/bin/sh
# Prints the CMAKE_ARGS that build llama-cpp-python for this CPU. A plain install builds with
# -march=native, which on some Xeons turns on AMX that then faults at run time; so native is off,
# AMX is always off, and each SIMD level is switched on only where /proc/cpuinfo lists it.
flags=$(grep -m1 "^flags" "${CPUINFO:-/proc/cpuinfo}" 2>/dev/null)  # CPUINFO: another file (tests)
has() { case " $flags " in *" $1 "*) echo ON ;; *) echo OFF ;; esac; }
printf '%s' "-DGGML_NATIVE=OFF -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma)"
printf '%s' " -DGGML_F16C=$(has f16c) -DGGML_AVX512=$(has avx512f) -DGGML_AVX512_VBMI=$(has avx512vbmi)"
printf '%s' " -DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_BF16=$(has avx512_bf16)"
printf '%s\n' " -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
