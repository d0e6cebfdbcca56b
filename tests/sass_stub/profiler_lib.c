/* A profiler library linked with libcupti, as libtorch_cuda (kineto) is: app_cupti -DVIA_LIB dlopens it
 * RTLD_LOCAL, so its libcupti is in no global scope (tests/test_sass_live.py). */
int cuptiActivityRegisterCallbacks(void *requested, void *completed);
int cuptiActivityEnable(int kind);

int profiler_start(int *enabled) {
    int reg = cuptiActivityRegisterCallbacks((void *)0, (void *)0);
    *enabled = cuptiActivityEnable(10);
    return reg;
}
