/*
 * main.c: the `sympool` command: dispatches to info, replay and plot (one file each).
 * Options that configure the library (--conf, --capacity) are applied by the subcommand through
 * the environment before its first sympool call, since the option table is read once.
 */
#include <stdio.h>
#include <string.h>

#include "tools/cli.h"

static void usage(FILE *out) {
    fprintf(
        out,
        "usage: sympool <command> [args]\n"
        "  info                                backend, devices, options (with sources), versions\n"
        "  replay TRACE [options]              replay a PyTorch memory snapshot through sympool\n"
        "      --conf KEY:VALUE,...            allocator options (PyTorch syntax)\n"
        "      --capacity SIZE                 emulated device size (e.g. 80GiB); OOMs are "
        "reported\n"
        "      --snapshot OUT                  write our snapshot of the replay (.pickle or "
        ".json)\n"
        "      --json                          one JSON object on stdout\n"
        "      --repeat N                      replay N times, report the median time per event\n"
        "  plot SNAPSHOT -o OUT.svg [-d DEV]   memory timeline (allocated and reserved over time)\n"
        "  help                                this text\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "info") == 0)
        return sp_cli_info(argc - 1, argv + 1);
    if (strcmp(cmd, "replay") == 0)
        return sp_cli_replay(argc - 1, argv + 1);
    if (strcmp(cmd, "plot") == 0)
        return sp_cli_plot(argc - 1, argv + 1);
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "sympool: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
