/*
 * main.c — the jdt-train command line (placeholder until the CLI lands; see issue 2).
 */
#include "core/core.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("jdt-train %s\n", JDT_VERSION_STRING);
        return 0;
    }
    fprintf(stderr, "usage: jdt-train [train] CONFIG [key.path=value ...]\n");
    return 2;
}
