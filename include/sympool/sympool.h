/**
 * @file sympool.h
 * @brief Everything that needs no MPI. Include world.h, symmetric.h and collectives.h for the rest.
 */
#ifndef SYMPOOL_SYMPOOL_H
#define SYMPOOL_SYMPOOL_H

#include "sympool/history.h"
#include "sympool/mempool.h"
#include "sympool/pool.h"
#include "sympool/stats.h"
#include "sympool/status.h"
#include "sympool/summary.h"
#include "sympool/torch.h"

#define SP_VERSION_MAJOR 0
#define SP_VERSION_MINOR 1
#define SP_VERSION_PATCH 0

#endif /* SYMPOOL_SYMPOOL_H */
