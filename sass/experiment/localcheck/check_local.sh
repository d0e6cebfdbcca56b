#!/usr/bin/env bash
# Compile-check the experiment on a machine without the sanitizer headers or a GPU, against the
# stand-in headers here (written from the public docs; run.sh never uses them). Also runs the eBPF
# splice and ptxas --compile-as-tools-patch, and lists the patch functions in the cubins.
set -eu
HERE=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d)
I="-I$HERE/localcheck/include -I$HERE"
g++ -std=c++17 -O2 -Wall -fPIC -shared $I -I/usr/local/cuda/include "$HERE/sass_tool.cpp" -o "$T/libsass_tool.so"
nm -D "$T/libsass_tool.so" | grep -E ' T (InitializeInjection|sass_tool_)'
nvcc -gencode arch=compute_90,code=sm_90 --fatbin --keep-device-functions -Xptxas --compile-as-tools-patch $I \
    -o "$T/patches.fatbin" "$HERE/patches.cu"
nvcc -gencode arch=compute_90,code=sm_90 -O2 -c -o "$T/target.o" "$HERE/target.cu"
nvcc -arch=sm_90 -rdc=true -ptx --keep-device-functions $I -o "$T/wrapper.ptx" "$HERE/patches_ebpf.cu"
python3 "$HERE/probe_ptx.py" splice "$T/wrapper.ptx" "$HERE/probe_count.ptx" "$T/patches_ebpf.ptx"
ptxas -arch=sm_90 --compile-as-tools-patch -o "$T/patches_ebpf.cubin" "$T/patches_ebpf.ptx"
readelf -sW "$T/patches_ebpf.cubin" 2>/dev/null | grep FUNC
python3 -c "import ast,sys; [ast.parse(open(f).read()) for f in sys.argv[1:]]" "$HERE/check.py" "$HERE/torch_prog.py"
bash -n "$HERE/run.sh"
rm -rf "$T"
echo "local compile check: ok"
