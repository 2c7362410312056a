/* no_dlclose.c: dlclose that unloads nothing, preloaded (LD_PRELOAD) into the processes of the
 * ASan+UBSan build's tests that start Open MPI (tests/CMakeLists.txt), never installed.
 *
 * Why: Open MPI's components (mca_*.so) allocate memory they never free, and unload themselves
 * at MPI_Finalize. LeakSanitizer reports at exit, when a frame in an unloaded component is an
 * address in no module, so scripts/lsan.supp's leak:mca_ cannot match it; the slow unwinder
 * found a loaded Open MPI frame further up each stack, at 2.3 times the CPU over the ASan
 * stage's MPI tests (every allocation's stack walked by DWARF tables). With the components kept
 * loaded, the frame that called malloc names its component, and the fast unwinder, which stops
 * at the first frame without a frame pointer, is enough. Keeping a library loaded changes no
 * behaviour a test checks: a later dlopen of it finds it loaded, as it would without the close.
 *
 * Built without the sanitizers: it is preloaded into every process of those tests (mpiexec,
 * Open MPI's daemon, shells), most of them not instrumented, where a library that needs the
 * ASan runtime cannot load. */
#include <stddef.h>

int dlclose(void *handle);

int dlclose(void *handle) {
    (void)handle;
    return 0;
}
