/*
 * torch_harness.c: sympool's PyTorch entry points driven the way PyTorch's CUDAPluggableAllocator
 * (torch/csrc/cuda/CUDAPluggableAllocator.cpp) drives them, on the cuda backend under the CUDA
 * doubles. libsympool.so is dlopen'ed and its four symbols looked up, as
 * torch.cuda.memory.CUDAPluggableAllocator does through ctypes; then:
 *  - allocate(size) / raw_alloc: alloc_fn(size, device, stream) with device = the current device
 *    (c10::cuda::GetDevice) and stream = its current stream (the default stream: NULL);
 *  - raw_delete: free_fn(ptr, size, device, stream) with the size, device and stream recorded at
 *    allocation (never called for a NULL DataPtr);
 *  - copy_data: cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice); memcpyAsync: cudaMemcpyAsync
 *    device to device on a stream;
 *  - recordStream(ptr, stream): record_stream_fn(ptr, stream) (set_record_stream_fn);
 *  - emptyCache: reset_fn() (set_reset_fn).
 * Prints "torch-harness: ok" or "torch-harness: FAIL ..." (the test's pass/fail patterns).
 */
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

typedef void *(*alloc_fn_t)(size_t, int, void *);
typedef void (*free_fn_t)(void *, size_t, int, void *);
typedef void (*record_fn_t)(void *, void *);
typedef void (*reset_fn_t)(void);

static int g_fails;
#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("torch-harness: FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                  \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            g_fails++;                                                                             \
        }                                                                                          \
    } while (0)

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        printf("torch-harness: FAIL no %s: %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

/* Whether reading p from the host faults (it must: device memory is not host memory). */
static int host_read_faults(const void *p) {
    pid_t pid = fork();
    if (pid == 0) {
        volatile const char *c = p;
        char x = *c;
        (void)x;
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "libsympool.so";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("torch-harness: FAIL dlopen(%s): %s\n", path, dlerror());
        return 1;
    }
    alloc_fn_t alloc = (alloc_fn_t)sym(lib, "sp_torch_malloc");
    free_fn_t dfree = (free_fn_t)sym(lib, "sp_torch_free");
    record_fn_t record = (record_fn_t)sym(lib, "sp_torch_record_stream");
    reset_fn_t reset = (reset_fn_t)sym(lib, "sp_torch_empty_cache");
    if (argc > 2 && strcmp(argv[2], "--expect-refused") == 0) {
        /* No GPU answers, or the host backend: PyTorch must get NULL, never host memory. */
        void *p = alloc(4096, 0, NULL);
        CHECK(p == NULL, "alloc handed out %p without a cuda backend", p);
        record(p, NULL);
        dfree(p, 4096, 0, NULL);
        reset();
        if (g_fails == 0)
            printf("torch-harness: ok (refused)\n");
        return g_fails != 0;
    }
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    int (*contexts)(int) = drv ? (int (*)(int))dlsym(drv, "cuda_double_primary_contexts") : NULL;
    size_t (*used)(int) = drv ? (size_t(*)(int))dlsym(drv, "cuda_double_memory_used") : NULL;
    int (*device_of)(const void *) =
        drv ? (int (*)(const void *))dlsym(drv, "cuda_double_device_of") : NULL;
    if (!contexts || !used || !device_of) {
        printf("torch-harness: FAIL not running under the CUDA doubles (LD_LIBRARY_PATH)\n");
        return 1;
    }

    int ndev = 0;
    CHECK(cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0, "no device");
    for (int dev = 0; dev < ndev; dev++) {
        /* A process sets up only the devices it uses: nothing on this one yet. */
        CHECK(contexts(dev) == 0, "device %d has %d contexts before its first use", dev,
              contexts(dev));
        CHECK(cudaSetDevice(dev) == cudaSuccess, "cudaSetDevice(%d)", dev);
        void *const stream = NULL; /* getCurrentCUDAStream(dev): the default stream */
        const size_t n = 4096;

        CHECK(alloc(0, dev, stream) == NULL, "size 0 gives NULL, as raw_alloc(0) does");
        void *p = alloc(n, dev, stream);
        CHECK(p != NULL, "alloc(%zu, %d)", n, dev);
        if (!p)
            continue;
        CHECK(device_of(p) == dev, "%p is memory of device %d, not %d", p, device_of(p), dev);
        CHECK(host_read_faults(p), "a host read of device memory %p did not fault", p);

        unsigned char pat[4096], back[4096];
        for (size_t i = 0; i < n; i++)
            pat[i] = (unsigned char)(i * 7 + dev);
        CHECK(cudaMemcpy(p, pat, n, cudaMemcpyHostToDevice) == cudaSuccess, "H2D");
        void *q = alloc(n, dev, stream);
        CHECK(q != NULL && q != p, "second block");
        /* copy_data */
        CHECK(cudaMemcpy(q, p, n, cudaMemcpyDeviceToDevice) == cudaSuccess, "copy_data");
        memset(back, 0, n);
        CHECK(cudaMemcpy(back, q, n, cudaMemcpyDeviceToHost) == cudaSuccess, "D2H");
        CHECK(memcmp(back, pat, n) == 0, "data did not survive the round trip");

        /* A side stream reads p; recordStream(p, side); then PyTorch frees p (raw_delete with
         * the stream recorded at allocation). Until the side stream's work is done, p must not
         * come back from the allocator. */
        cudaStream_t side = NULL;
        CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess, "stream");
        CHECK(cudaMemcpyAsync(q, p, n, cudaMemcpyDeviceToDevice, side) == cudaSuccess,
              "memcpyAsync");
        record(p, side);
        dfree(p, n, dev, stream);
        void *r = alloc(n, dev, stream);
        CHECK(r != NULL && r != p,
              "%p was handed out again while a stream recorded on it still "
              "had work queued",
              p);
        CHECK(cudaStreamSynchronize(side) == cudaSuccess, "sync side");
        void *r2 = alloc(n, dev, stream);
        CHECK(r2 == p, "after the side stream completed, %p should be reused (got %p)", p, r2);

        /* A size that does not match what was allocated: PyTorch's bookkeeping is wrong, the
         * block is still freed (WARN). */
        dfree(r2, n + 1, dev, stream);
        dfree(q, n, dev, stream);
        dfree(r, n, dev, stream);
        CHECK(cudaStreamDestroy(side) == cudaSuccess, "stream destroy");

        /* Out of memory: NULL (CUDA_DOUBLE_MEMORY=1GiB), and the allocator still works after. */
        void *big = alloc((size_t)2 << 30, dev, stream);
        CHECK(big == NULL, "2 GiB on a 1 GiB device");
        void *small = alloc(n, dev, stream);
        CHECK(small != NULL, "allocation after an OOM");
        dfree(small, n, dev, stream);

        /* emptyCache: every cached segment goes back to the device. */
        CHECK(used(dev) > 0, "the cache holds memory before empty_cache");
        reset();
        CHECK(used(dev) == 0, "device %d still has %zu bytes after empty_cache", dev, used(dev));
        CHECK(contexts(dev) == 1, "device %d has %d contexts", dev, contexts(dev));
        for (int other = dev + 1; other < ndev; other++)
            CHECK(contexts(other) == 0, "using device %d made a context on device %d", dev, other);
    }
    if (g_fails == 0)
        printf("torch-harness: ok (%d devices)\n", ndev);
    return g_fails != 0;
}
