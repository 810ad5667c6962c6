/*
 * Tracer benchmark workload (compiled by bench/bench_tracer.py with `cc -O2`).
 *
 *   workload files N DIR        write N files of 4 KiB into DIR (created), then read each back
 *   workload rw K DIR [SIZE]    8 files in DIR; K pwrite/pread calls of SIZE bytes (4096) in all
 *
 * Prints one line on stdout:
 *   ROARBENCH launch_ns=<spawn to main, -1 if unknown> work_ns=<the loop above> ops=<count>
 * launch_ns needs ROARBENCH_T0_NS: CLOCK_MONOTONIC nanoseconds taken by the parent just
 * before it spawned us, so it covers exec, dynamic loading and any preload constructor.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NFILES_RW 8
#define RW_SLOTS 16

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void die(const char *what, const char *path) {
    fprintf(stderr, "workload: %s %s: %s\n", what, path ? path : "", strerror(errno));
    exit(2);
}

static void make_dir(const char *dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) die("mkdir", dir);
}

static long long files(long n, const char *dir, char *buf, size_t size) {
    char path[4096];
    make_dir(dir);
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%06ld", dir, i);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) die("open for writing", path);
        if (write(fd, buf, size) != (ssize_t)size) die("write", path);
        if (close(fd) != 0) die("close", path);
    }
    for (long i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/f%06ld", dir, i);
        int fd = open(path, O_RDONLY);
        if (fd < 0) die("open for reading", path);
        if (read(fd, buf, size) != (ssize_t)size) die("read", path);
        if (close(fd) != 0) die("close", path);
    }
    return 2 * n;
}

static long long rw(long k, const char *dir, char *buf, size_t size) {
    char path[4096];
    int fds[NFILES_RW];
    make_dir(dir);
    for (int f = 0; f < NFILES_RW; f++) {
        snprintf(path, sizeof path, "%s/rw%d", dir, f);
        fds[f] = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (fds[f] < 0) die("open", path);
        if (ftruncate(fds[f], (off_t)(size * RW_SLOTS)) != 0) die("ftruncate", path);
    }
    /* Rounds of 8 writes (one per file) then 8 reads, cycling over 16 slots per file. */
    for (long i = 0; i < k; i++) {
        int fd = fds[i % NFILES_RW];
        off_t off = (off_t)(((i / (2 * NFILES_RW)) % RW_SLOTS) * size);
        ssize_t r = ((i / NFILES_RW) & 1) ? pread(fd, buf, size, off)
                                          : pwrite(fd, buf, size, off);
        if (r != (ssize_t)size) die("pread/pwrite", dir);
    }
    for (int f = 0; f < NFILES_RW; f++)
        if (close(fds[f]) != 0) die("close", dir);
    return k;
}

int main(int argc, char **argv) {
    long long t_main = now_ns();
    if (argc < 4 || (strcmp(argv[1], "files") && strcmp(argv[1], "rw"))) {
        fprintf(stderr, "usage: %s files N DIR | %s rw K DIR [SIZE]\n", argv[0], argv[0]);
        return 64;
    }
    long n = strtol(argv[2], NULL, 10);
    size_t size = argc > 4 ? (size_t)strtoul(argv[4], NULL, 10) : 4096;
    if (n < 0 || size == 0 || size > (1 << 20)) {
        fprintf(stderr, "workload: bad count or size\n");
        return 64;
    }
    char *buf = malloc(size);
    if (!buf) die("malloc", NULL);
    for (size_t i = 0; i < size; i++) buf[i] = (char)('a' + i % 26);

    const char *t0s = getenv("ROARBENCH_T0_NS");
    long long launch = t0s ? t_main - strtoll(t0s, NULL, 10) : -1;

    long long t0 = now_ns();
    long long ops = argv[1][0] == 'f' ? files(n, argv[3], buf, size) : rw(n, argv[3], buf, size);
    long long work = now_ns() - t0;

    printf("ROARBENCH launch_ns=%lld work_ns=%lld ops=%lld\n", launch, work, ops);
    free(buf);
    return 0;
}
