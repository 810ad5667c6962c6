/*
 * Test driver: performs the file operations named on its command line, calling the
 * exact libc entry points the shim interposes, so tests can predict the trace.
 *
 *   ops_helper CMD ARGS... [CMD ARGS...]...
 *
 * Open-flag strings: r=O_RDONLY w=O_WRONLY +=O_RDWR c=O_CREAT t=O_TRUNC x=O_EXCL
 * a=O_APPEND d=O_DIRECTORY.  "fd" is the last opened fd, "fp" the last FILE*,
 * "dirfd" the last directory opened with `dir`.  Each failing call prints
 * "ERR <cmd> <errno>" and goes on, so errno handling can be checked.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
extern int __open_2(const char *, int);
extern int __open64_2(const char *, int);
extern int __openat_2(int, const char *, int);
extern int __openat64_2(int, const char *, int);

static int fd = -1, dirfd_ = AT_FDCWD;
static FILE *fp;

static int flags_of(const char *s) {
    int f = 0, acc = O_RDONLY;
    for (; *s; s++) switch (*s) {
        case 'w': acc = O_WRONLY; break;
        case '+': acc = O_RDWR; break;
        case 'c': f |= O_CREAT; break;
        case 't': f |= O_TRUNC; break;
        case 'x': f |= O_EXCL; break;
        case 'a': f |= O_APPEND; break;
        case 'd': f |= O_DIRECTORY; break;
        }
    return f | acc;
}

static void chk(const char *cmd, long r) {
    if (r < 0) printf("ERR %s %d\n", cmd, errno);
}

static int wait_child(pid_t p) {
    int st = 0;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    for (int i = 1; i < argc; i++) {
        const char *c = argv[i];
#define A(k) argv[i + (k)]
#define IS(s) (!strcmp(c, s))
        if (IS("open")) { fd = open(A(1), flags_of(A(2)), 0644); chk(c, fd); i += 2; }
        else if (IS("open64")) { fd = open64(A(1), flags_of(A(2)), 0644); chk(c, fd); i += 2; }
        else if (IS("openat")) { fd = openat(dirfd_, A(1), flags_of(A(2)), 0644); chk(c, fd); i += 2; }
        else if (IS("openat64")) { fd = openat64(dirfd_, A(1), flags_of(A(2)), 0644); chk(c, fd); i += 2; }
        else if (IS("__open_2")) { fd = __open_2(A(1), flags_of(A(2))); chk(c, fd); i += 2; }
        else if (IS("__open64_2")) { fd = __open64_2(A(1), flags_of(A(2))); chk(c, fd); i += 2; }
        else if (IS("__openat_2")) { fd = __openat_2(dirfd_, A(1), flags_of(A(2))); chk(c, fd); i += 2; }
        else if (IS("__openat64_2")) { fd = __openat64_2(dirfd_, A(1), flags_of(A(2))); chk(c, fd); i += 2; }
        else if (IS("creat")) { fd = creat(A(1), 0644); chk(c, fd); i += 1; }
        else if (IS("creat64")) { fd = creat64(A(1), 0644); chk(c, fd); i += 1; }
        else if (IS("dir")) { dirfd_ = open(A(1), O_RDONLY | O_DIRECTORY); chk(c, dirfd_); i += 1; }
        else if (IS("write")) { chk(c, write(fd, A(1), strlen(A(1)))); i += 1; }
        else if (IS("close")) { chk(c, close(fd)); }
        else if (IS("fopen")) { fp = fopen(A(1), A(2)); chk(c, fp ? 0 : -1); i += 2; }
        else if (IS("fopen64")) { fp = fopen64(A(1), A(2)); chk(c, fp ? 0 : -1); i += 2; }
        else if (IS("freopen")) { fp = freopen(A(1), A(2), fp); chk(c, fp ? 0 : -1); i += 2; }
        else if (IS("fputs")) { fputs(A(1), fp); i += 1; }
        else if (IS("fclose")) { chk(c, fclose(fp)); }
        else if (IS("rename")) { chk(c, rename(A(1), A(2))); i += 2; }
        else if (IS("renameat")) { chk(c, renameat(dirfd_, A(1), dirfd_, A(2))); i += 2; }
        else if (IS("renameat2")) { chk(c, renameat2(dirfd_, A(1), dirfd_, A(2), 0)); i += 2; }
        else if (IS("link")) { chk(c, link(A(1), A(2))); i += 2; }
        else if (IS("linkat")) { chk(c, linkat(dirfd_, A(1), dirfd_, A(2), 0)); i += 2; }
        else if (IS("symlink")) { chk(c, symlink(A(1), A(2))); i += 2; }
        else if (IS("symlinkat")) { chk(c, symlinkat(A(1), dirfd_, A(2))); i += 2; }
        else if (IS("unlink")) { chk(c, unlink(A(1))); i += 1; }
        else if (IS("unlinkat")) { chk(c, unlinkat(dirfd_, A(1), 0)); i += 1; }
        else if (IS("unlinkat-dir")) { chk(c, unlinkat(dirfd_, A(1), AT_REMOVEDIR)); i += 1; }
        else if (IS("remove")) { chk(c, remove(A(1))); i += 1; }
        else if (IS("truncate")) { chk(c, truncate(A(1), atol(A(2)))); i += 2; }
        else if (IS("truncate64")) { chk(c, truncate64(A(1), atol(A(2)))); i += 2; }
        else if (IS("mkdir")) { chk(c, mkdir(A(1), 0755)); i += 1; }
        else if (IS("mkdirat")) { chk(c, mkdirat(dirfd_, A(1), 0755)); i += 1; }
        else if (IS("rmdir")) { chk(c, rmdir(A(1))); i += 1; }
        else if (IS("chdir")) { chk(c, chdir(A(1))); i += 1; }
        else if (IS("fchdir")) { chk(c, fchdir(dirfd_)); }
        else if (IS("dup")) { int n = dup(fd); chk(c, n); if (n >= 0) fd = n; }
        else if (IS("dup2")) { int n = dup2(fd, atoi(A(1))); chk(c, n); if (n >= 0) fd = n; i += 1; }
        else if (IS("dup3")) { int n = dup3(fd, atoi(A(1)), O_CLOEXEC); chk(c, n); if (n >= 0) fd = n; i += 1; }
        else if (IS("fork-open")) { /* child opens A(1) and exits */
            pid_t p = fork();
            if (p == 0) { int f = open(A(1), O_RDONLY); if (f >= 0) close(f); _exit(0); }
            printf("CHILD %d\n", (int)p);
            wait_child(p);
            i += 1;
        }
        else if (IS("vfork-exec")) { /* the rest of argv is the program to run */
            pid_t p = vfork();
            if (p == 0) { execv(A(1), &argv[i + 2]); _exit(127); }
            printf("CHILD %d\n", (int)p);
            return wait_child(p);
        }
        else if (IS("fork-exec")) {
            pid_t p = fork();
            if (p == 0) { execv(A(1), &argv[i + 2]); _exit(127); }
            printf("CHILD %d\n", (int)p);
            return wait_child(p);
        }
        else if (IS("execve")) { execve(A(1), &argv[i + 2], environ); chk(c, -1); return 127; }
        else if (IS("execv")) { execv(A(1), &argv[i + 2]); chk(c, -1); return 127; }
        else if (IS("execvp")) { execvp(A(1), &argv[i + 2]); chk(c, -1); return 127; }
        else if (IS("execvpe")) { execvpe(A(1), &argv[i + 2], environ); chk(c, -1); return 127; }
        else if (IS("execl")) { execl(A(1), A(1), A(2), (char *)NULL); chk(c, -1); return 127; }
        else if (IS("execlp")) { execlp(A(1), A(1), A(2), (char *)NULL); chk(c, -1); return 127; }
        else if (IS("execle")) {
            char *env[] = {"ONLY=1", NULL}; /* a sanitised environment */
            execle(A(1), A(1), A(2), (char *)NULL, env);
            chk(c, -1);
            return 127;
        }
        else if (IS("posix_spawn") || IS("posix_spawnp")) {
            pid_t p;
            int r = IS("posix_spawn") ? posix_spawn(&p, A(1), NULL, NULL, &argv[i + 2], environ)
                                      : posix_spawnp(&p, A(1), NULL, NULL, &argv[i + 2], environ);
            if (r) { errno = r; chk(c, -1); return 127; }
            printf("CHILD %d\n", (int)p);
            return wait_child(p);
        }
        else if (IS("sleep")) { usleep(atoi(A(1)) * 1000); i += 1; }
        else if (IS("signal-ready")) { printf("READY\n"); i += 0; }
        else if (IS("loop-open")) { /* open+close A(1) forever (killed by the test) */
            for (long n = 0;; n++) {
                int f = open(A(1), O_RDONLY);
                if (f >= 0) close(f);
                if (n == 1000) printf("READY\n");
            }
        }
        else { fprintf(stderr, "unknown op %s\n", c); return 2; }
    }
    return 0;
}
