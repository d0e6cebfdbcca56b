#!/usr/bin/env bash
# The SASS-patching experiment (issue 9), in one command on the GPU machine:
#     OUT=/some/dir bash sass/experiment/run.sh
# Builds with the machine's nvcc and the real sanitizer headers, runs every arrangement under
# `timeout`, and prints RESULT PASS/FAIL/INFO lines (summary at the end). Log: $OUT/sass.log.
# A failing part never stops the others. Total run time is kept under ~9 minutes (BUDGET_S).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$HERE/out}
mkdir -p "$OUT"
B=$OUT/build
mkdir -p "$B"
LOG=$OUT/sass.log
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
CUDA=${CUDA_HOME:-/usr/local/cuda}
SAN=$CUDA/compute-sanitizer
NVCC=$CUDA/bin/nvcc
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-540}
TOOL=$B/libsass_tool.so
START=$SECONDS

res() { echo "RESULT $1 $2: $3"; }
left() { echo $((BUDGET_S - (SECONDS - START))); }
# run NAME TIMEOUT CMD...: runs with a timeout, logs the exit status; rc in $RC
run() {
    local name=$1 t=$2; shift 2
    echo "== [$((SECONDS - START))s] $name: $*"
    timeout "$t" "$@"
    RC=$?
    echo "   $name exit=$RC$([ $RC = 124 ] && echo ' (TIMEOUT)')"
    return $RC
}

echo "== environment"
nvidia-smi -L 2>&1 | head -4
"$NVCC" --version | tail -2
ls "$SAN" "$SAN/include" 2>&1 | head -30
$PY -c 'import torch; print("torch", torch.__version__, torch.version.cuda)' 2>&1 | tail -1

# ---- builds (each independent) ----
HAVE_TOOL=0 HAVE_PATCHES=0 HAVE_TARGET=0 HAVE_EBPF=0
if run build_tool 120 g++ -std=c++17 -O2 -Wall -fPIC -shared -I"$SAN/include" -I"$CUDA/include" \
        "$HERE/sass_tool.cpp" -o "$TOOL" -L"$SAN" -lsanitizer-public -Wl,-rpath,"$SAN" -ldl -lpthread; then
    HAVE_TOOL=1; res PASS build/tool "$TOOL"
else res FAIL build/tool "g++ failed (see above)"; fi

if run build_patches 120 "$NVCC" -gencode arch=compute_90,code=sm_90 --fatbin --keep-device-functions \
        -Xptxas --compile-as-tools-patch -I"$SAN/include" -I"$HERE" -o "$B/patches.fatbin" "$HERE/patches.cu"; then
    HAVE_PATCHES=1; res PASS build/patches "$B/patches.fatbin"
else res FAIL build/patches "nvcc failed (see above)"; fi

if run build_target 120 "$NVCC" -gencode arch=compute_90,code=sm_90 -O2 -o "$B/target" "$HERE/target.cu" \
        -L"$CUDA/lib64/stubs" -lcuda -ldl; then
    HAVE_TARGET=1
    PTX=$("$CUDA/bin/cuobjdump" --list-ptx "$B/target" 2>&1)
    ELF=$("$CUDA/bin/cuobjdump" --list-elf "$B/target" 2>&1)
    echo "   cuobjdump --list-ptx: ${PTX:-<none>}"; echo "   cuobjdump --list-elf: $ELF"
    # cuobjdump lists each PTX entry as "PTX file    N: NAME"; "No PTX file found ..." means none
    if ! echo "$PTX" | grep -q "^PTX file" && echo "$ELF" | grep -q sm_90; then
        res PASS build/target_sass_only "target has sm_90 SASS and no PTX"
    else res FAIL build/target_sass_only "target is not SASS-only"; fi
else res FAIL build/target "nvcc failed (see above)"; fi

if run build_ebpf_wrapper 120 "$NVCC" -arch=sm_90 -rdc=true -ptx --keep-device-functions -I"$SAN/include" \
        -I"$HERE" -o "$B/wrapper.ptx" "$HERE/patches_ebpf.cu" &&
   run splice_ebpf 60 $PY "$HERE/probe_ptx.py" splice "$B/wrapper.ptx" "$HERE/probe_count.ptx" "$B/patches_ebpf.ptx" &&
   run build_ebpf_patches 120 "$CUDA/bin/ptxas" -arch=sm_90 --compile-as-tools-patch -v -o "$B/patches_ebpf.cubin" \
        "$B/patches_ebpf.ptx"; then
    HAVE_EBPF=1; res PASS build/ebpf_patches "$B/patches_ebpf.cubin (egpu count.bpf.o probe spliced in)"
else res FAIL build/ebpf_patches "see above"; fi

CHECK="$PY $HERE/check.py"
export SASS_TOOL_PATCHES=$B/patches.fatbin SASS_TOOL_LIB=$TOOL

# ---- the nvcc program under each arrangement ----
WORKS=""
target_case() {  # NAME KIND ENV... -- ARGS
    local name=$1 kind=$2; shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    if [ "$(left)" -lt 30 ]; then res FAIL "$name" "skipped: out of time budget"; return; fi
    run "$name" 60 env SASS_TOOL_OUT="$OUT/$name.tool" "${envs[@]}" "$B/target" "$@" > "$OUT/$name.stdout" 2>&1
    cat "$OUT/$name.stdout"
    echo "   tool file $OUT/$name.tool:"; head -40 "$OUT/$name.tool" 2>/dev/null | sed 's/^/     /'
    [ "$RC" = 0 ] || res FAIL "$name/exit" "target exit status $RC"
    if $CHECK "$kind" "$name" "$OUT/$name.tool" "$OUT/$name.stdout" "$OUT/target.base.stdout" && [ "$RC" = 0 ]; then
        res PASS "$name" "all checks passed"; return 0
    fi
    res FAIL "$name" "see the lines above"; return 1
}

if [ $HAVE_TOOL = 1 ] && [ $HAVE_PATCHES = 1 ] && [ $HAVE_TARGET = 1 ]; then
    run target_baseline 60 "$B/target" plain > "$OUT/target.base.stdout" 2>&1; cat "$OUT/target.base.stdout"
    target_case inject target SASS_TOOL_MODE=inject CUDA_INJECTION64_PATH="$TOOL" -- plain && WORKS="$WORKS inject"
    target_case inject_eager target SASS_TOOL_MODE=inject CUDA_INJECTION64_PATH="$TOOL" CUDA_MODULE_LOADING=EAGER \
        -- plain
    target_case preload_ctor target SASS_TOOL_MODE=ctor LD_PRELOAD="$TOOL" -- plain && WORKS="$WORKS preload_ctor"
    target_case api_early target SASS_TOOL_MODE=api -- early && WORKS="$WORKS api_early"
    target_case api_late target SASS_TOOL_MODE=api -- late
    target_case api_late_eager target SASS_TOOL_MODE=api CUDA_MODULE_LOADING=EAGER -- late
    res INFO arrangements "working for the nvcc program:${WORKS:- none}"
else
    res FAIL target_runs "skipped: a build failed"
fi

# ---- the eBPF probe variant, under the first working arrangement ----
arr_env() {  # the environment and target argument of an arrangement
    case $1 in
        inject) echo "SASS_TOOL_MODE=inject CUDA_INJECTION64_PATH=$TOOL";;
        preload_ctor) echo "SASS_TOOL_MODE=ctor LD_PRELOAD=$TOOL";;
        api_early) echo "SASS_TOOL_MODE=api";;
    esac
}
arr_arg() { [ "$1" = api_early ] && echo early || echo plain; }
FIRST=$(echo $WORKS | awk '{print $1}')
if [ $HAVE_EBPF = 1 ] && [ -n "$FIRST" ]; then
    # shellcheck disable=SC2046
    target_case "ebpf_$FIRST" ebpf $(arr_env "$FIRST") SASS_TOOL_PATCHES="$B/patches_ebpf.cubin" \
        SASS_TOOL_ENTER=EgpuBlockEnter -- "$(arr_arg "$FIRST")"
else
    res FAIL ebpf "skipped: no eBPF patch image or no working arrangement"
fi

# ---- stock PyTorch, preferring the in-process arrangements egpu would use ----
if [ $HAVE_TOOL = 1 ] && [ $HAVE_PATCHES = 1 ] &&
        $PY -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    run torch_baseline 150 env -u SASS_TOOL_LIB $PY "$HERE/torch_prog.py" > "$OUT/torch.base.stdout" 2>&1
    cat "$OUT/torch.base.stdout"
    # a second plain run: outputs that differ between two runs without the tool cannot blame the tool
    run torch_baseline2 150 env -u SASS_TOOL_LIB $PY "$HERE/torch_prog.py" > "$OUT/torch.base2.stdout" 2>&1
    if [ "$(grep ^HASH "$OUT/torch.base.stdout")" = "$(grep ^HASH "$OUT/torch.base2.stdout")" ]; then
        res PASS torch_baseline/deterministic "two runs without the tool agree"
    else res FAIL torch_baseline/deterministic "two runs without the tool differ: output checks mean nothing"; fi
    ORDER=""
    for a in api_early preload_ctor inject; do case " $WORKS " in *" $a "*) ORDER="$ORDER $a";; esac; done
    [ -n "$ORDER" ] || ORDER="api_early preload_ctor inject"   # nothing worked on the nvcc program: try anyway
    for a in $ORDER; do
        name=torch_$a
        if [ "$(left)" -lt 60 ]; then res FAIL "$name" "skipped: out of time budget ($(left)s left)"; continue; fi
        T=$(( $(left) - 20 )); [ $T -gt 240 ] && T=240
        # shellcheck disable=SC2046
        run "$name" $T env SASS_TOOL_OUT="$OUT/$name.tool" $(arr_env $a) $PY "$HERE/torch_prog.py" \
            > "$OUT/$name.stdout" 2>&1
        tail -20 "$OUT/$name.stdout"
        echo "   tool file (head):"; head -30 "$OUT/$name.tool" 2>/dev/null | sed 's/^/     /'
        [ "$RC" = 0 ] || res FAIL "$name/exit" "python exit status $RC"
        if $CHECK torch "$name" "$OUT/$name.tool" "$OUT/$name.stdout" "$OUT/torch.base.stdout" && [ "$RC" = 0 ]; then
            res PASS "$name" "all checks passed"
        else res FAIL "$name" "see the lines above"; fi
    done
else
    res FAIL torch "skipped: tool/patches missing or torch without CUDA"
fi

echo
echo "===== summary ($((SECONDS - START))s) ====="
grep -a '^RESULT \(PASS\|FAIL\)' "$LOG" | grep -v '^RESULT PASS .*/' | sort | uniq
echo "PASS lines: $(grep -ac '^RESULT PASS' "$LOG")  FAIL lines: $(grep -ac '^RESULT FAIL' "$LOG")"
grep -a '^RESULT FAIL' "$LOG" | head -40
