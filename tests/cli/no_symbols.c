/*
 * no_symbols.c: a shared library with none of the functions `sympool info` asks NCCL and MPI
 * for. tests/cli/cli_libraries.sh puts copies of it under their sonames first on
 * LD_LIBRARY_PATH, so that info finds a library by the name it loads and no version in it.
 */
int sp_no_symbols_here(void);
int sp_no_symbols_here(void) {
    return 0;
}
