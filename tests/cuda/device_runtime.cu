// The device runtime and indirect calls: printf (vprintf), assert (__assertfail), in-kernel malloc/free,
// recursion, a virtual call and a function-pointer table (call through a register, .callprototype).
#include <cassert>
#include <cstdio>
__device__ int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
struct Shape { __device__ virtual float area() const = 0; };
struct Square : Shape {
    float s;
    __device__ Square(float s) : s(s) {}
    __device__ float area() const override { return s * s; }
};
struct Circle : Shape {
    float r;
    __device__ Circle(float r) : r(r) {}
    __device__ float area() const override { return 3.14f * r * r; }
};
__device__ float twice(float x) { return 2 * x; }
__device__ float negate(float x) { return -x; }
__device__ float (*ops[2])(float) = {twice, negate};
extern "C" __global__ void device_runtime(const int *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    assert(in[i] >= 0);
    int *scratch = (int *)malloc(4 * sizeof(int));
    if (scratch == nullptr) return;
    for (int k = 0; k < 4; ++k) scratch[k] = in[i] + k;
    Square sq(scratch[1]);
    Circle ci(scratch[2]);
    const Shape *s = (i & 1) ? (const Shape *)&sq : (const Shape *)&ci;
    out[i] = s->area() + fib(scratch[3] & 7) + ops[i & 1](scratch[0]);
    free(scratch);
    if (i == 0) printf("out[0] = %f\n", out[0]);
}
