/* A native program as the CUDA driver would run one under CUDA_INJECTION64_PATH: it loads
 * the named library and calls its InitializeInjection, then works 20 ms and exits (or, given
 * "die", is killed with SIGKILL). */
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const char *path = getenv("CUDA_INJECTION64_PATH");
    if (path) {
        void *library = dlopen(path, RTLD_NOW);
        if (!library) { fprintf(stderr, "%s\n", dlerror()); return 2; }
        int (*initialize)(void) = (int (*)(void))dlsym(library, "InitializeInjection");
        if (!initialize || !initialize()) return 3;
    }
    usleep(20000);
    if (argc > 1 && strcmp(argv[1], "die") == 0) kill(getpid(), SIGKILL);
    return 0;
}
