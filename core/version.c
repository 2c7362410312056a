/* sp_version: the version this library was built as (sympool/version.h, generated from
 * CMakeLists.txt's project(VERSION)); the Python package reads it here rather than keeping a copy. */
#include "core/core.h"
#include "sympool/version.h"

SP_EXPORT const char *sp_version(void) {
    return SP_VERSION_STRING;
}
