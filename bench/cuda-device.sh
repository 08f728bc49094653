#!/usr/bin/env bash
# THE one script a GPU session runs on the lent NVIDIA machine (the device tool's `run`), after
# bench/cuda-device-prepare.sh here:
#   run  command="bash bench/cuda-device.sh"  carry=["build-gpu-carry"]  timeout_s=540
# It stays inside BUDGET seconds (default 450: 7.5 minutes) whatever happens: every step's time
# limit is cut to what is left, and a step that cannot get half its limit is skipped with a line
# saying so. Everything lands in $OUT/summary.md (steps, then the results table) and $OUT/full.log
# (all output). Steps, the most important numbers first:
#   1. binaries: the prebuilt ones from build-gpu-carry/ (the device image lacks kite's Debian
#      build dependencies); without them, a CMake build with KITE_CUDA_ARCHITECTURES=90 -j16
#   2. the card's bandwidth (kite-cuda-bandwidth: a device-to-device copy kernel), the figure
#      every decode GB/s is compared with
#   3. smoke: the quick GPU tests (clean errors, kite run, greedy output equal to the CPU's)
#   4. synthetic Llama-3-8B Q4_K_M (the issue's bandwidth goal): one `kite bench` process builds
#      the model on the host (its build time is printed), then pp512, tg128 (tokens/s, achieved
#      GB/s and % of step 2's bandwidth) and batched decode at 1, 16 and 64 sequences, then each
#      once more profiled (--profile: every launch's time and GB/s)
#   5. op conformance on CUDA: every op and weight type against the references (ops:*); then
#      llama-1b Q4_K_M decode with KITE_CUDA_FUSE=1 and =0 (fused launches or one per op),
#      KITE_CUDA_NORM_TAIL=0 (the norms after the residual adds in their own launches),
#      KITE_CUDA_ROPE_TAIL=0 (the ropes and cache writes in their own launch, not the q/k/v one) and
#      KITE_CUDA_PDL=0 (plain launches instead of programmatic dependent ones), then
#      kite-cuda-matmul (mmq vs dequantize + cuBLAS per type and width at 8B shapes), and
#      llama-1b Q4_K_M pp512 and batched decode 16/64 with KITE_CUDA_MMQ=1, =0 and unset (int8
#      tensor-core matmul, dequantize + cuBLAS, or each shape's faster as the backend timed it), and a
#      2048-token prefill with KITE_CUDA_ATTN_TC=1 and =0 (tensor-core vs CUDA-core attention)
#   6. the same as 4 for llama-8b Q4_0 / Q8_0, then llama-1b and llama-3b x Q4_K_M / Q4_0 / Q8_0
#   7. the other GPU tests: every GGUF file's perplexity against llama.cpp's, batch invariance
#   8. CUDA graphs off (KITE_CUDA_GRAPHS=0; on by default): greedy + batch invariance, 1B decode
#   9. the Vulkan backend on the same GPU (NVIDIA's Vulkan driver; the loader from
#      build-gpu-carry/libvulkan1.deb where the image has none): its tests, then 1B decode/prefill,
#      profiled
# With llama.cpp's CUDA build carried (prepare packs it when built), each model of 4. and 6. is
# also written as a GGUF file and run by llama-bench and llama-batched-bench right after kite.
# Dry run on a machine without a GPU (checks the script, the parsing and the summary):
#   DEVICE=cpu BIN=build-cudaprep MODELS="tiny:q4_K_M:60 tiny:q8_0:60" SKIP_TESTS=1 bash bench/cuda-device.sh
# (TESTDATA=../shared/testdata adds the speculative step's rows.)
# (LLAMA_BIN=/tmp/llama.cpp/build/bin adds llama.cpp's rows from a CPU build.)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root="$PWD"
out="${OUT:-/tmp/kite-cuda-out}"
budget="${BUDGET:-450}"
device="${DEVICE:-cuda}"
# shape:type:seconds, in order. The time covers building the model on the host (single-threaded;
# the 8B Q8_0 model is 8.5 GB), uploading it and all the runs. (qwen2-7b and qwen3-8b are shapes
# too: Qwen2.5-7B's with its q/k/v biases, Qwen3-8B's with its head norms; not in the default
# list, which the budget already fills.)
models="${MODELS:-llama-8b:q4_K_M:100 llama-8b:q4_0:90 llama-8b:q8_0:100 llama-1b:q4_K_M:45 llama-1b:q4_0:40 \
llama-1b:q8_0:40 llama-3b:q4_K_M:60 llama-3b:q4_0:55 llama-3b:q8_0:60}"
mkdir -p "$out"
work="$(mktemp -d)"
sum="$out/summary.md"
log="$out/full.log"
results="$work/results.md"
: >"$sum"
: >"$log"
t_start=$(date +%s)
say() { echo "$*" | tee -a "$log" >>"$sum"; }
left() { echo $((budget - ($(date +%s) - t_start))); }

# run_step NAME LIMIT CMD...: runs CMD with a time limit (LIMIT, cut to the budget left minus 10 s
# for the summary; skipped when that is under LIMIT/2); output to the log and to $work/last.out,
# a row to the summary. Lines of the output matching $KEEP (a regex) are also copied to the summary.
KEEP=''
run_step() {
  local name=$1 want=$2
  shift 2
  local limit t0 rc status
  limit=$(($(left) - 10))
  if [ "$limit" -lt $((want / 2)) ]; then
    echo "| $name | skipped: $(left)s of the ${budget}s budget left, it needs up to ${want}s | | |" >>"$sum"
    : >"$work/last.out"
    return 125
  fi
  [ "$limit" -gt "$want" ] && limit=$want
  t0=$(date +%s)
  echo "=== $name (limit ${limit}s): $*" >>"$log"
  timeout -k 5 "$limit" "$@" >"$work/last.out" 2>&1
  rc=$?
  cat "$work/last.out" >>"$log"
  status="ok"
  [ $rc -ne 0 ] && status="FAIL rc=$rc"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && status="TIMEOUT after ${limit}s"
  echo "| $name | $status | $(($(date +%s) - t0))s | \`$*\` |" >>"$sum"
  if [ -n "$KEEP" ]; then grep -E "$KEEP" "$work/last.out" | sed 's/^/    /' >>"$sum"; fi
  return $rc
}

say "# kite CUDA device run, $(date -u '+%F %T') UTC"
say ""
say "$(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | head -3)"
say "nvcc: $(nvcc --version 2>/dev/null | tail -1); host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
say ""
say "| step | result | time | command |"
say "|---|---|---|---|"

# 1. Binaries.
carry="$root/build-gpu-carry"
if [ -n "${BIN:-}" ]; then  # a build folder given (dry runs)
  bin="$work/bin"
  mkdir -p "$bin"
  for exe in "$BIN/tools/kite" "$BIN/tests/kite-tests" "$BIN/bench/kite-cuda-bandwidth" "$BIN/bench/kite-cuda-matmul"; do
    [ -x "$exe" ] && ln -sf "$(cd "$(dirname "$exe")" && pwd)/$(basename "$exe")" "$bin/$(basename "$exe")"
  done
  echo "| binaries | from $BIN | | |" >>"$sum"
  llama="${LLAMA_BIN:-}"  # a llama.cpp bin folder (llama-bench, llama-batched-bench), for dry runs
elif [ -f "$carry/kite-bin.tar.xz" ]; then
  mkdir -p /tmp/kite-dist
  tar -C /tmp/kite-dist -xJf "$carry/kite-bin.tar.xz"
  bin=/tmp/kite-dist/bin
  # CUDA runtime and cuBLAS from the image (toolkit or the pip wheels).
  cuda_libs=$(find /usr/local/cuda/lib64 /usr/local/cuda*/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
    /opt -maxdepth 8 \( -name 'libcublas.so.13*' -o -name 'libcudart.so.13*' \) -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
  export LD_LIBRARY_PATH="/tmp/kite-dist/lib:${cuda_libs}${LD_LIBRARY_PATH:-}"
  # The paths compiled into kite-tests (test data, the kite binary, the build folder).
  # shellcheck disable=SC1091
  source "$carry/paths.env"
  mkdir -p "$(dirname "$KITE_TESTDATA_DIR")" "$(dirname "$KITE_EXE")" "$KITE_BINARY_DIR" /tmp/kite-testdata
  if [ -f "$carry/testdata.tar.xz" ]; then
    tar -C /tmp/kite-testdata -xJf "$carry/testdata.tar.xz"
    [ -e "$KITE_TESTDATA_DIR" ] || ln -s /tmp/kite-testdata "$KITE_TESTDATA_DIR"
  else  # prepared WITH_LLAMA=1: the benchmarks and llama.cpp's, no tests
    SKIP_TESTS=1
    echo "| tests | skipped: no test data carried (prepared with WITH_LLAMA=1) | | |" >>"$sum"
  fi
  [ -e "$KITE_EXE" ] || ln -s "$bin/kite" "$KITE_EXE"
  echo "| binaries | prebuilt (build-gpu-carry) | | LD_LIBRARY_PATH=$LD_LIBRARY_PATH |" >>"$sum"
  run_step "ldd" 10 bash -c "ldd $bin/kite-tests | grep -E 'not found|cublas|cudart' || true"
  # llama.cpp's CUDA build, when prepare carried one: the same synthetic files, the same run.
  if [ -f "$carry/llama-cuda.tar.xz" ]; then
    mkdir -p /tmp/llama-dist
    tar -C /tmp/llama-dist -xJf "$carry/llama-cuda.tar.xz"
    llama=/tmp/llama-dist/llama
    export LD_LIBRARY_PATH="$llama:$LD_LIBRARY_PATH"
    run_step "ldd llama.cpp" 10 bash -c "ldd $llama/llama-bench | grep -E 'not found|cublas|cudart|ggml' || true"
  fi
else
  build="$root/build-gpu"
  bin="$work/bin"
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  run_step "configure" 120 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKITE_CUDA=ON \
    -DKITE_CUDA_ARCHITECTURES=90 "${launcher[@]}" || { say "configure failed: see full.log"; exit 1; }
  run_step "build" 300 cmake --build "$build" --target kite kite-tests kite-cuda-bandwidth kite-cuda-matmul -j16 ||
    { say "build failed: see full.log"; exit 1; }
  mkdir -p "$bin"
  ln -sf "$build/tools/kite" "$bin/kite"
  ln -sf "$build/tests/kite-tests" "$bin/kite-tests"
  ln -sf "$build/bench/kite-cuda-bandwidth" "$bin/kite-cuda-bandwidth"
  ln -sf "$build/bench/kite-cuda-matmul" "$bin/kite-cuda-matmul"
fi

# 2. Bandwidth: the copy kernel's GB/s (read + write) is the bound every decode step is held to.
KEEP='GB/s|device'
bw=""
if [ -x "$bin/kite-cuda-bandwidth" ] && run_step "bandwidth" 40 "$bin/kite-cuda-bandwidth" 0 2048; then
  bw=$(sed -n 's/.*"copy_gbps": \([0-9.]*\).*/\1/p' "$work/last.out" | head -1)
fi
bw_flag=()
[ -n "$bw" ] && bw_flag=(--bandwidth "$bw")

# The GPU tests (kite-tests): clean errors, kite run, greedy equality and a profiled step first (quick),
# the rest later.
tests_quick="cuda: without*,cuda: cuBLAS*,cuda: kite run*,cuda: greedy*,cuda: fused*,cuda: a profiled*"
tests_rest="cuda: every GGUF*,cuda: a sequence*,cuda: mmq*,cuda: contexts*,cuda: the last*,cuda: decode steps*"
KEEP_TESTS='test cases|assertions|ERROR|FAILED|on cuda|greedy tokens|diverged|skipped|nmse|as graphs|graph capture|CUDA launches'
if [ -z "${SKIP_TESTS:-}" ]; then
  KEEP=$KEEP_TESTS
  run_step "cuda tests: quick" 60 "$bin/kite-tests" -tc="$tests_quick" --duration=true
fi

# bench_model SHAPE TYPE SECONDS [--profile]: one kite bench process (model built once): pp512,
# tg128 and batched decode at 1, 16, 64 sequences; a row of the results table. With --profile,
# each test once more with every launch timed (events, no graphs): where a step's time goes,
# kernel by kernel, with each matmul's GB/s; the tg128 and 64-sequence tables go to the summary.
bench_model() {
  local shape=$1 type=$2 limit=$3 profile=${4:-} f json built gib pp tg gbs pct b1 b16 b64 gguf="" write=()
  KEEP='built|graph capture|^\| +(1|16|64) \||^\{'
  if [ -n "${llama:-}" ]; then  # the same model as a file, for llama.cpp
    gguf="$work/$shape-$type.gguf"
    write=(--write-gguf "$gguf")
  fi
  run_step "bench $shape $type" "$limit" "$bin/kite" bench --device "$device" --synthetic "$shape" --type "$type" \
    -p 512 -n 128 -r 2 --json "${bw_flag[@]}" --and-parallel 1,16,64 --parallel-prompt 128 --parallel-gen 32 \
    "${write[@]}" $profile
  f="$work/last.out"
  [ -n "$profile" ] && awk '/^profile of (tg|64 sequences)/ { on = 1 } on { print "    " $0 } /by the wall clock/ { on = 0 }' \
    "$f" >>"$sum"
  json=$(grep -m1 '^{' "$f")
  num() { echo "$json" | sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p"; }
  built=$(sed -n 's/.* in \([0-9.]*\) s$/\1/p' "$f" | head -1)
  gib=$(awk -v b="$(num bytes)" 'BEGIN { if (b != "") printf "%.2f", b / 1073741824 }')
  pp=$(num pp_ts)
  tg=$(num tg_ts)
  gbs=$(num tg_gbs)
  # % of the measured bandwidth (on --device cpu, of the host's, which kite bench measures itself).
  pct=$(awk -v g="$gbs" -v b="${bw:-$(num read_gbs)}" 'BEGIN { if (g != "" && b + 0 > 0) printf "%.0f%%", 100 * g / b }')
  col() { awk -F'|' -v b="$1" '$2 + 0 == b && $9 ~ /x/ { gsub(/ /, "", $8); print $8 }' "$f" | head -1; }
  b1=$(col 1)
  b16=$(col 16)
  b64=$(col 64)
  echo "| $shape | $type | ${gib:--} | ${built:--} | ${pp:--} | ${tg:--} | ${gbs:--} | ${pct:--} | ${b1:--} | ${b16:--} | ${b64:--} |" >>"$results"
  [ -n "$gguf" ] && [ -f "$gguf" ] && llama_model "$shape" "$type" "$gguf"
  [ -n "$gguf" ] && rm -f "$gguf"
}

# llama_model SHAPE TYPE FILE: llama.cpp's CUDA build on the same file (all layers on the GPU,
# flash attention on): llama-bench pp512/tg128, llama-batched-bench at 1, 16, 64 sequences with
# the same prompt and generation lengths as kite's; a llama.cpp row of the results table.
llama_model() {
  local shape=$1 type=$2 file=$3 pp tg b1 b16 b64
  KEEP='pp512|tg128'
  run_step "llama.cpp bench $shape $type" 60 "$llama/llama-bench" -m "$file" -ngl 99 -fa 1 -p 512 -n 128 -r 2
  ts() { awk -F'|' -v t="$1" '$0 ~ t { gsub(/ /, "", $(NF-1)); split($(NF-1), a, "±"); print a[1] }' "$work/last.out" | head -1; }
  pp=$(ts pp512)
  tg=$(ts tg128)
  KEEP='^\| +(128) \|'
  run_step "llama.cpp batched $shape $type" 60 "$llama/llama-batched-bench" -m "$file" -ngl 99 -fa on \
    -c 16384 -npp 128 -ntg 32 -npl 1,16,64
  # Columns: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
  col() { awk -F'|' -v b="$1" '$4 + 0 == b && $2 + 0 == 128 { gsub(/ /, "", $9); print $9 }' "$work/last.out" | head -1; }
  b1=$(col 1)
  b16=$(col 16)
  b64=$(col 64)
  echo "| $shape | $type llama.cpp | | | ${pp:--} | ${tg:--} | | | ${b1:--} | ${b16:--} | ${b64:--} |" >>"$results"
}

# 4.-6. Synthetic models; op conformance after the first (the headline) one.
first=1
for m in $models; do
  IFS=: read -r shape type limit <<<"$m"
  # (The headline model profiled too: 10-15 s more.)
  if [ $first = 1 ]; then bench_model "$shape" "$type" $((limit + 15)) --profile; else bench_model "$shape" "$type" "$limit"; fi
  if [ $first = 1 ] && [ -z "${SKIP_TESTS:-}" ]; then
    KEEP='test cases|assertions|ERROR|FAILED|skipped, no CUDA'
    run_step "ops conformance" 90 "$bin/kite-tests" -tc="ops:*" --duration=true
  fi
  if [ $first = 1 ]; then
    # Fused launches (backends/cuda/ops.cpp run_fused: 5 launches a llama layer's decode step
    # instead of 24) against one launch per op, against the residual adds' launches without
    # the next norm (does one block's norm at the end of a mat-vec beat the norm's own launch?)
    # and the q/k/v launch without the ropes and cache writes, and programmatic dependent launch
    # (launch.cuh: a kernel starts while the one before it finishes) against plain launches, on
    # the 1B shape, where launches weigh most.
    KEEP='^\||^\{'
    for knobs in "KITE_CUDA_FUSE=1 KITE_CUDA_PDL=1" "KITE_CUDA_FUSE=0 KITE_CUDA_PDL=1" \
      "KITE_CUDA_FUSE=1 KITE_CUDA_NORM_TAIL=0" "KITE_CUDA_FUSE=1 KITE_CUDA_ROPE_TAIL=0" \
      "KITE_CUDA_FUSE=1 KITE_CUDA_PDL=0"; do
      run_step "llama-1b q4_K_M tg128 $knobs" 35 env $knobs "$bin/kite" bench \
        --device "$device" --synthetic llama-1b --type q4_K_M -p 0 -n 128 -r 2 "${bw_flag[@]}"
    done
    # The int8 tensor-core matmul (mmq) against dequantize + cuBLAS, both ways at every width
    # (by default the backend times both on each new shape and keeps the faster), per op at
    # Llama-3-8B's shapes (kite-cuda-matmul), then for a whole model: forced each way, then as
    # the backend chose (its choices printed as "(measured: ...)" lines).
    KEEP='^\||mmq|cuBLAS'
    mm_shapes=(--shapes 8b)
    [ "$device" = cuda ] || mm_shapes=(--shapes tiny --min-mib 1)  # (dry runs)
    [ -x "$bin/kite-cuda-matmul" ] && run_step "mul_mat mmq vs cuBLAS" 90 "$bin/kite-cuda-matmul" \
      --device "$device" --reps 3 "${mm_shapes[@]}"
    KEEP='^\||^\{|measured:'
    for mmq in 1 0 timed; do
      KITE_CUDA_MMQ=$mmq run_step "llama-1b q4_K_M KITE_CUDA_MMQ=$mmq" 45 "$bin/kite" bench --device "$device" \
        --synthetic llama-1b --type q4_K_M -p 512 -n 0 -r 2 --json --and-parallel 16,64 --parallel-prompt 128 \
        --parallel-gen 32
    done
    # Prefill attention on tensor cores against the CUDA-core kernel (by default runs of 16+
    # rows of one sequence take tensor cores): a 2048-token prompt, where attention weighs.
    for tc in 1 0; do
      KITE_CUDA_ATTN_TC=$tc run_step "llama-1b q4_K_M pp2048 KITE_CUDA_ATTN_TC=$tc" 40 "$bin/kite" bench \
        --device "$device" --synthetic llama-1b --type q4_K_M -p 2048 -n 0 -r 2 --json
    done
    # Sampling on the device (the top_k op: each row's best logits, or a draw from the whole row)
    # against whole rows of logits sampled on the host, at 64 sequences of a 128K vocabulary:
    # greedy, then the OpenAI API's default sampling, without and with logprobs, then top-p 0.9
    # (a synthetic model's flat rows pass the 64 nearly always: every row fetched, the worst case).
    for sampling in "" --openai-sampling "--openai-sampling --logprobs 5" "--openai-sampling --top-p 0.9"; do
      for top in 64 0; do
        run_step "llama-1b q4_K_M x64 ${sampling:-greedy} --top-k-outputs $top" 30 "$bin/kite" bench \
          --device "$device" --synthetic llama-1b --type q4_K_M --parallel 64 -p 64 -n 32 --top-k-outputs "$top" \
          $sampling
      done
    done
    # Speculative decoding with the test models (trained, one 4096-token vocabulary: the GPU path
    # and its acceptance, not the 128K row cost): a draft model's greedy proposals (verify rows
    # drawn on the device, draft rows one logit each) against sampled ones (whole rows both ways)
    # at the OpenAI API's defaults, 32 sequences.
    td="${KITE_TESTDATA_DIR:-${TESTDATA:-}}"
    if [ -n "$td" ] && [ -f "$td/gguf/llama-target-Q4_K_M.gguf" ]; then
      KEEP='^\||drafted|top-64 rows'
      for ds in greedy sampled; do
        run_step "speculative x32 openai --draft-sampling $ds" 20 "$bin/kite" bench --device "$device" \
          -m "$td/gguf/llama-target-Q4_K_M.gguf" --draft "$td/gguf/llama-draft-f16.gguf" --draft-sampling "$ds" \
          --draft-fixed --draft-max 4 --parallel 32 -p 32 -n 64 --openai-sampling --text "$td/heldout.txt"
      done
    fi
  fi
  first=0
done

# 7. The other GPU tests; 8. without CUDA graphs (each step op by op: what the graphs save).
if [ -z "${SKIP_TESTS:-}" ]; then
  KEEP=$KEEP_TESTS
  run_step "cuda tests: perplexity, batches" 120 "$bin/kite-tests" -tc="$tests_rest" --duration=true
  KEEP='test cases|assertions|ERROR|FAILED|graph capture|diverged'
  KITE_CUDA_GRAPHS=0 run_step "cuda tests, no graphs" 60 "$bin/kite-tests" -tc="cuda: greedy*,cuda: a sequence*"
fi
KEEP='^\||graph capture'
KITE_CUDA_GRAPHS=0 run_step "bench llama-1b q4_K_M no graphs" 40 "$bin/kite" bench --device "$device" \
  --synthetic llama-1b --type q4_K_M -p 0 -n 128 -r 2 "${bw_flag[@]}"

# 9. Vulkan on the same GPU.
if [ -z "${SKIP_TESTS:-}" ] && [ -z "${BIN:-}" ]; then
  if ! ldconfig -p | grep -q 'libvulkan.so.1' && [ -f "$carry/libvulkan1.deb" ]; then
    dpkg -x "$carry/libvulkan1.deb" /tmp/vkloader
    export LD_LIBRARY_PATH="/tmp/vkloader/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH"
  fi
  icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [ -f "$icd" ] && [ -z "$(ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>/dev/null)" ] && export VK_DRIVER_FILES="$icd"
  KEEP='test cases|assertions|ERROR|FAILED|vulkan devices|greedy tokens|on vulkan'
  KITE_REQUIRE_VULKAN=1 run_step "vulkan tests" 90 "$bin/kite-tests" -tc="vulkan:*" --duration=true
  KEEP='^\||^\{'
  run_step "bench llama-1b q4_K_M vulkan" 60 "$bin/kite" bench --device vulkan --synthetic llama-1b --type q4_K_M \
    -p 512 -n 128 -r 2 "${bw_flag[@]}" --profile
fi

say ""
say "## Results ($device; bandwidth ${bw:-not measured} GB/s, kite-cuda-bandwidth's copy kernel)"
say ""
say "tg128 GB/s: weight bytes one decode step reads x tokens/s; % of the bandwidth above. B=N: aggregate"
say "generated tokens/s of N sequences through the scheduler (prompts 128, 32 tokens each)."
say ""
say "| model | type | GiB | build s | pp512 t/s | tg128 t/s | tg GB/s | % of bw | B=1 t/s | B=16 t/s | B=64 t/s |"
say "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
[ -f "$results" ] && tee -a "$log" <"$results" >>"$sum"
say ""
say "total $(($(date +%s) - t_start))s of the ${budget}s budget"
rm -rf "$work"
cat "$sum"
