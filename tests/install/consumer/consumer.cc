// The C consumer compiled as C++: world.h (through mpi.h) must not need MPI's C++ bindings.
#include "consumer.c"
