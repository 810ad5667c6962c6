/*
 * roar preload tracer: an LD_PRELOAD shim that records namespace operations (open,
 * close of writable fds, rename, link, unlink, mkdir, exec, spawn, fork, chdir, dup)
 * with the task tag active on the calling thread, into a per-process log whose
 * format is described in roar_log.h.
 *
 * Every hook follows one template: resolve the real function (cached dlsym), call it,
 * then record only what happened, saving and restoring errno around the record.
 * read/write/mmap are never interposed: that is what keeps per-I/O cost at zero.
 * Whether a writable fd modified its file is decided at close from fstat.
 *
 * Hot-path rules: no malloc, no lock shared between threads (space is reserved with a
 * CAS on the mapped header), async-signal-safe calls only, errno preserved.  Growing
 * the log (a new 256 KiB chunk; on tmpfs also a 16 or 64 KiB extent of allocated pages)
 * takes a spin lock that no signal handler can wait on
 * (a re-entrancy flag makes a nested hook pass through and count a drop).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "roar_log.h"

#ifndef RENAME_EXCHANGE /* (glibc before 2.28) */
#define RENAME_EXCHANGE (1 << 1)
#endif

#define EXPORT __attribute__((visibility("default")))
#define TLS __thread __attribute__((tls_model("initial-exec")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

extern char **environ;

/* ------------------------------------------------------------------ real calls */

#define REAL_DECL(ret, name, args) \
    typedef ret(*name##_fn) args;  \
    static name##_fn real_##name;

REAL_DECL(int, open, (const char *, int, ...))
REAL_DECL(int, open64, (const char *, int, ...))
REAL_DECL(int, openat, (int, const char *, int, ...))
REAL_DECL(int, openat64, (int, const char *, int, ...))
REAL_DECL(int, __open_2, (const char *, int))
REAL_DECL(int, __open64_2, (const char *, int))
REAL_DECL(int, __openat_2, (int, const char *, int))
REAL_DECL(int, __openat64_2, (int, const char *, int))
REAL_DECL(int, creat, (const char *, mode_t))
REAL_DECL(int, creat64, (const char *, mode_t))
REAL_DECL(FILE *, fopen, (const char *, const char *))
REAL_DECL(FILE *, fopen64, (const char *, const char *))
REAL_DECL(FILE *, freopen, (const char *, const char *, FILE *))
REAL_DECL(FILE *, freopen64, (const char *, const char *, FILE *))
REAL_DECL(int, close, (int))
REAL_DECL(int, fclose, (FILE *))
REAL_DECL(int, rename, (const char *, const char *))
REAL_DECL(int, renameat, (int, const char *, int, const char *))
REAL_DECL(int, renameat2, (int, const char *, int, const char *, unsigned int))
REAL_DECL(int, link, (const char *, const char *))
REAL_DECL(int, linkat, (int, const char *, int, const char *, int))
REAL_DECL(int, symlink, (const char *, const char *))
REAL_DECL(int, symlinkat, (const char *, int, const char *))
REAL_DECL(int, unlink, (const char *))
REAL_DECL(int, unlinkat, (int, const char *, int))
REAL_DECL(int, remove, (const char *))
REAL_DECL(int, truncate, (const char *, off_t))
REAL_DECL(int, truncate64, (const char *, off64_t))
REAL_DECL(int, mkdir, (const char *, mode_t))
REAL_DECL(int, mkdirat, (int, const char *, mode_t))
REAL_DECL(int, rmdir, (const char *))
REAL_DECL(int, execve, (const char *, char *const[], char *const[]))
REAL_DECL(int, execvpe, (const char *, char *const[], char *const[]))
REAL_DECL(int, posix_spawn, (pid_t *, const char *, const posix_spawn_file_actions_t *,
                             const posix_spawnattr_t *, char *const[], char *const[]))
REAL_DECL(int, posix_spawnp, (pid_t *, const char *, const posix_spawn_file_actions_t *,
                              const posix_spawnattr_t *, char *const[], char *const[]))
REAL_DECL(pid_t, fork, (void))
REAL_DECL(int, chdir, (const char *))
REAL_DECL(int, fchdir, (int))
REAL_DECL(int, dup, (int))
REAL_DECL(int, dup2, (int, int))
REAL_DECL(int, dup3, (int, int, int))
REAL_DECL(int, fcntl, (int, int, ...))
REAL_DECL(int, fcntl64, (int, int, ...))
REAL_DECL(int, close_range, (unsigned int, unsigned int, int))
REAL_DECL(void, closefrom, (int))
REAL_DECL(int, mkstemp, (char *))
REAL_DECL(int, mkstemp64, (char *))
REAL_DECL(int, mkostemp, (char *, int))
REAL_DECL(int, mkostemp64, (char *, int))
REAL_DECL(int, mkstemps, (char *, int))
REAL_DECL(int, mkstemps64, (char *, int))
REAL_DECL(int, mkostemps, (char *, int, int))
REAL_DECL(int, mkostemps64, (char *, int, int))
REAL_DECL(char *, mkdtemp, (char *))

/* dlsym is resolved lazily too, because other libraries' constructors may call a hook
 * before ours has run. */
static inline void *real_fn(void **slot, const char *name) {
    void *f = __atomic_load_n(slot, __ATOMIC_RELAXED);
    if (LIKELY(f)) return f;
    f = dlsym(RTLD_NEXT, name);
    __atomic_store_n(slot, f, __ATOMIC_RELAXED);
    return f;
}

#define REAL(name) ((name##_fn)real_fn((void **)&real_##name, #name))

/* ------------------------------------------------------------------ state */

#define FD_STATE_MAX 65536 /* fds tracked for write-at-close detection */
#define FD_PATH_MAX 4096   /* fds whose path is kept (openat dirfds, close records) */
#define FD_PATH_LEN 500
#define TAG_SLOTS 64

enum { TRACK_NONE = 0, TRACK_COMPARE = 1, TRACK_MODIFIED = 2 };

struct fd_state {
    uint8_t track;
    uint8_t writable; /* opened to write: looked at by the task boundaries (see below) */
    int64_t size, mtime_ns, ctime_ns;
};

struct fd_path {
    uint32_t seq; /* odd while being written */
    uint16_t len; /* 0: unknown */
    char path[FD_PATH_LEN];
};

struct tag_buf {
    uint16_t len;
    char s[ROAR_MAX_TAG + 1];
};

static struct {
    int active; /* a session directory is set and the log is open */
    int configured;
    uint32_t pid, ppid;
    char session_dir[PATH_MAX];
    char lib_path[PATH_MAX];
    char log_path[PATH_MAX];
    struct roar_log_header *hdr;
    char *chunks[ROAR_MAX_CHUNKS];
    uint32_t nchunks; /* highest chunk index mapped + 1 */
    uint64_t file_size;
    uint64_t backed; /* data bytes whose pages are allocated (see back_to) */
    uint64_t start_mono, start_wall;
    int grow_lock;
    uint64_t dropped_nolog;
    int tracked_fds;
    int writable_fds;
    int max_fd; /* highest fd ever remembered: bounds close_range scans */
} g;

static struct fd_state fd_states[FD_STATE_MAX];
static struct fd_path fd_paths[FD_PATH_MAX];

/* Directories whose files are never lineage (an engine's own logs, roar's own task log),
 * set by roar_quiet_dir: a descriptor held open to one of them is not looked at at each
 * task boundary (a Ray worker writes its stdout and stderr files at every task). */
#define QUIET_MAX 8
static struct {
    int n;
    uint16_t len[QUIET_MAX];
    char dir[QUIET_MAX][FD_PATH_LEN]; /* each ends with '/' */
} quiet;

EXPORT int roar_quiet_dir(const char *dir);

/* cwd cache: two buffers and an index, so a reader never sees a half-written path
 * unless two chdir calls race with one read. */
static struct {
    char buf[2][PATH_MAX];
    uint16_t len[2];
    int cur;
} cwd;

/* Task tags.  Begin/end take a spin lock (they are per task, not per event); the
 * hot path reads the thread's own tag, or the process fallback through a seqlock. */
static struct {
    int lock;
    int active;          /* threads inside a task */
    struct tag_buf slot[TAG_SLOTS];
    int slot_used[TAG_SLOTS];
    int has_base;        /* inherited (exec/fork) or set with roar_process_tag */
    struct tag_buf base;
    uint32_t seq;        /* fallback seqlock */
    int fb_valid;
    struct tag_buf fb;
} tags;

static TLS int t_busy;
/* Set by the vfork trampoline: see in_vfork_child(). */
static TLS int t_vfork __attribute__((used));
static TLS uint32_t t_tid;
static TLS int t_has_tag;
static TLS int t_adopted; /* t_tag was lent by another thread (roar_thread_adopt) */
static TLS int t_slot = -1;
static TLS struct tag_buf t_tag;

/* ------------------------------------------------------------------ small helpers */

static inline uint64_t now_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint32_t cur_tid(void) {
    if (UNLIKELY(!t_tid)) t_tid = (uint32_t)syscall(SYS_gettid);
    return t_tid;
}

static size_t cstrlen(const char *s) { return s ? strlen(s) : 0; }

static char *put_u64(char *p, uint64_t v) {
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n) *p++ = tmp[--n];
    return p;
}

static int sys_open(const char *path, int flags, int mode) {
    return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

static void sys_close(int fd) { syscall(SYS_close, fd); }

static int stat_to(int dirfd, const char *path, int atflags, struct stat *st) {
    return (int)syscall(SYS_newfstatat, dirfd, path, st, atflags);
}

static int64_t ts_ns(struct timespec t) { return (int64_t)t.tv_sec * 1000000000ll + t.tv_nsec; }

static void drop(void) {
    if (g.hdr)
        __atomic_add_fetch(&g.hdr->dropped, 1, __ATOMIC_RELAXED);
    else
        __atomic_add_fetch(&g.dropped_nolog, 1, __ATOMIC_RELAXED);
}

static int writable(int flags) { return (flags & O_ACCMODE) != O_RDONLY; }

static int needs_mode(int flags) {
    return (flags & O_CREAT) || ((flags & O_TMPFILE) == O_TMPFILE);
}

/* ------------------------------------------------------------------ the log */

static void spin_lock(int *l) {
    while (__atomic_exchange_n(l, 1, __ATOMIC_ACQUIRE)) sched_yield();
}

static void spin_unlock(int *l) { __atomic_store_n(l, 0, __ATOMIC_RELEASE); }

#define ROAR_TMPFS_MAGIC 0x01021994 /* linux/magic.h */
/* Both divide ROAR_CHUNK: an extent never reaches past the chunk its record is in. */
#define ROAR_EXTENT_FIRST (16u * 1024u)
#define ROAR_EXTENT (64u * 1024u)
_Static_assert(ROAR_CHUNK % ROAR_EXTENT == 0 && ROAR_CHUNK % ROAR_EXTENT_FIRST == 0,
               "an extent must not reach past its record's chunk");

/* On tmpfs a log's pages are allocated ahead of the reservations, an extent at a time, and
 * hdr.reserved never passes g.backed: a page of a MAP_SHARED mapping that a full tmpfs cannot
 * back raises SIGBUS when first touched (in the traced program, or in the reader), so a full
 * tmpfs must fail here, where the event is dropped instead.  Extents, not whole chunks: most
 * processes write a few records, and allocating (zeroing, then freeing) a chunk's 64 pages
 * for each was a third of a short process's tracing cost.  On disk file systems nothing is
 * allocated ahead (g.backed is unbounded): fallocate there costs more than the whole rest of
 * a process's tracing (ext4: ~1 ms a log), and disks rarely fill up. */
static int back_to(uint64_t end) {
    int ok = -1;
    if (t_busy > 1) return -1; /* a signal handler interrupted a grow on this thread */
    t_busy++;
    spin_lock(&g.grow_lock);
    uint64_t b = g.backed;
    if (end <= b) {
        ok = 0;
    } else {
        uint64_t step = b < ROAR_EXTENT ? ROAR_EXTENT_FIRST : ROAR_EXTENT;
        uint64_t to = (end + step - 1) / step * step;
        int fd = sys_open(g.log_path, O_RDWR | O_CLOEXEC, 0);
        if (fd >= 0) {
            if (syscall(SYS_fallocate, fd, 0, (off_t)(ROAR_HEADER_SIZE + b), (off_t)(to - b)) ==
                0) {
                /* fallocate may have grown the file: chunk_get must never shrink it. */
                if (g.file_size < ROAR_HEADER_SIZE + to) g.file_size = ROAR_HEADER_SIZE + to;
                __atomic_store_n(&g.backed, to, __ATOMIC_RELEASE);
                ok = 0;
            }
            sys_close(fd);
        }
    }
    spin_unlock(&g.grow_lock);
    t_busy--;
    return ok;
}

static char *chunk_get(uint64_t k) {
    char *c;
    if (UNLIKELY(k >= ROAR_MAX_CHUNKS)) return NULL;
    c = __atomic_load_n(&g.chunks[k], __ATOMIC_ACQUIRE);
    if (LIKELY(c)) return c;
    if (t_busy > 1) return NULL; /* a signal handler interrupted a grow on this thread */
    t_busy++;
    spin_lock(&g.grow_lock);
    c = g.chunks[k];
    if (!c) {
        uint64_t need = ROAR_HEADER_SIZE + (k + 1) * (uint64_t)ROAR_CHUNK;
        /* No fd is held between grows: programs that close every fd (daemons,
         * close_range before exec) cannot break the log. */
        int fd = sys_open(g.log_path, O_RDWR | O_CLOEXEC, 0);
        if (fd >= 0) {
            if (g.file_size >= need || syscall(SYS_ftruncate, fd, (off_t)need) == 0) {
                if (g.file_size < need) g.file_size = need;
                void *m = mmap(NULL, ROAR_CHUNK, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                               (off_t)(ROAR_HEADER_SIZE + k * (uint64_t)ROAR_CHUNK));
                if (m != MAP_FAILED) {
                    c = m;
                    __atomic_store_n(&g.chunks[k], c, __ATOMIC_RELEASE);
                    if (k + 1 > g.nchunks) g.nchunks = (uint32_t)(k + 1);
                }
            }
            sys_close(fd);
        }
    }
    spin_unlock(&g.grow_lock);
    t_busy--;
    return c;
}

static inline void rec_open_word(void *at, uint32_t size, uint16_t op, uint16_t state) {
    uint64_t w = size | ((uint64_t)op << 32) | ((uint64_t)state << 48);
    __atomic_store_n((uint64_t *)at, w, __ATOMIC_RELAXED);
}

/* Reserve `size` bytes (multiple of 8) that do not cross a chunk boundary. */
static struct roar_record *reserve(uint32_t size) {
    struct roar_log_header *h = g.hdr;
    uint64_t cur, start, end_of_chunk;
    if (UNLIKELY(!h)) return NULL;
    cur = __atomic_load_n(&h->reserved, __ATOMIC_RELAXED);
    for (;;) {
        end_of_chunk = (cur / ROAR_CHUNK + 1) * (uint64_t)ROAR_CHUNK;
        start = cur + size > end_of_chunk ? end_of_chunk : cur;
        if (UNLIKELY(start + size > __atomic_load_n(&g.backed, __ATOMIC_ACQUIRE)) &&
            back_to(start + size) != 0)
            return NULL; /* nothing reserved: the log stays readable to its end */
        if (__atomic_compare_exchange_n(&h->reserved, &cur, start + size, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            break;
    }
    if (start != cur) { /* fill the end of the previous chunk so readers can skip it */
        char *c = chunk_get(cur / ROAR_CHUNK);
        if (c)
            rec_open_word(c + cur % ROAR_CHUNK, (uint32_t)(end_of_chunk - cur), ROAR_OP_PAD,
                          ROAR_STATE_COMMITTED);
    }
    char *c = chunk_get(start / ROAR_CHUNK);
    if (UNLIKELY(!c)) return NULL;
    return (struct roar_record *)(c + start % ROAR_CHUNK);
}

/* ------------------------------------------------------------------ records */

/* A path as given, optionally joined to a prefix (cwd or a dirfd's path). */
struct rpath {
    const char *pre;
    size_t prelen;
    const char *s;
    size_t slen;
};

struct ev {
    uint16_t op;
    uint32_t flags, mode, rflags;
    int32_t fd, err;
    int64_t result;
    uint32_t pid, ppid, tid; /* 0: the cached ones */
    const struct stat *st;
    struct rpath p1, p2;
    char *const *argv; /* replaces p2 */
};

/* A non-NULL prefix means "join", even when it is empty (the root directory). */
static size_t rpath_len(const struct rpath *p) {
    size_t n = p->pre ? p->prelen + 1 + p->slen : p->slen;
    return n > ROAR_MAX_PATH ? ROAR_MAX_PATH : n;
}

static char *rpath_put(char *dst, const struct rpath *p, size_t n) {
    size_t pre = p->prelen < n ? p->prelen : n;
    memcpy(dst, p->pre, pre);
    if (p->pre && pre < n) dst[pre++] = '/';
    memcpy(dst + pre, p->s, n - pre);
    dst[n] = 0;
    return dst + n + 1;
}

static size_t argv_len(char *const *argv, int *trunc) {
    size_t n = 0;
    for (; argv && *argv; argv++) {
        size_t l = strlen(*argv) + 1;
        if (n + l > ROAR_MAX_ARGV) {
            *trunc = 1;
            break;
        }
        n += l;
    }
    return n ? n - 1 : 0; /* the last NUL is the record's terminator */
}

/* The tag to stamp on a record: the thread's own, else the process fallback. */
static uint16_t current_tag(char *out, uint32_t *rflags) {
    if (t_has_tag) {
        memcpy(out, t_tag.s, t_tag.len);
        return t_tag.len;
    }
    for (int tries = 0; tries < 64; tries++) {
        uint32_t s1 = __atomic_load_n(&tags.seq, __ATOMIC_ACQUIRE);
        if (s1 & 1) continue;
        uint16_t len = 0;
        if (tags.fb_valid) {
            len = tags.fb.len;
            memcpy(out, tags.fb.s, len);
        }
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&tags.seq, __ATOMIC_RELAXED) == s1) {
            if (len) *rflags |= ROAR_RF_TAG_INHERITED;
            return len;
        }
    }
    return 0;
}

static void emit(struct ev *e) {
    char tag[ROAR_MAX_TAG + 1];
    uint32_t rflags = e->rflags;
    uint16_t tag_len = current_tag(tag, &rflags);
    size_t l1 = rpath_len(&e->p1), l2;
    int trunc = 0;
    if (e->argv) {
        l2 = argv_len(e->argv, &trunc);
        if (trunc) rflags |= ROAR_RF_ARGV_TRUNC;
    } else {
        l2 = rpath_len(&e->p2);
    }
    if (l1 == ROAR_MAX_PATH || (!e->argv && l2 == ROAR_MAX_PATH)) rflags |= ROAR_RF_PATH_TRUNC;
    uint32_t size = (uint32_t)((ROAR_RECORD_FIXED + tag_len + 1 + l1 + 1 + l2 + 1 + 7) & ~7ul);

    struct roar_record *r = reserve(size);
    if (UNLIKELY(!r)) {
        drop();
        return;
    }
    rec_open_word(r, size, e->op, ROAR_STATE_RESERVED);
    r->pid = e->pid ? e->pid : g.pid;
    r->ppid = e->ppid ? e->ppid : g.ppid;
    r->tid = e->tid ? e->tid : cur_tid();
    r->err = e->err;
    r->result = e->result;
    r->flags = e->flags;
    r->mode = e->mode;
    r->fd = e->fd;
    /* One clock read per record: wall time is derived from the pair taken when the
     * log was created. */
    r->mono_ns = now_ns(CLOCK_MONOTONIC);
    r->wall_ns = g.start_wall + (r->mono_ns - g.start_mono);
    if (e->st) {
        rflags |= ROAR_RF_STAT;
        r->st_dev = e->st->st_dev;
        r->st_ino = e->st->st_ino;
        r->st_size = (uint64_t)e->st->st_size;
        r->st_mtime_ns = ts_ns(e->st->st_mtim);
        r->st_ctime_ns = ts_ns(e->st->st_ctim);
    } else {
        r->st_dev = r->st_ino = r->st_size = 0;
        r->st_mtime_ns = r->st_ctime_ns = 0;
    }
    r->rflags = rflags;
    r->tag_len = tag_len;
    r->path_len = (uint16_t)l1;
    r->path2_len = (uint16_t)l2;
    r->_pad = 0;
    char *p = (char *)r + ROAR_RECORD_FIXED;
    memcpy(p, tag, tag_len);
    p[tag_len] = 0;
    p = rpath_put(p + tag_len + 1, &e->p1, l1);
    if (e->argv) {
        char *end = p + l2;
        for (char *const *a = e->argv; *a && p < end; a++) {
            size_t l = strlen(*a);
            if (l > (size_t)(end - p)) l = (size_t)(end - p);
            memcpy(p, *a, l);
            p += l;
            *p++ = 0;
        }
        *end = 0;
    } else {
        rpath_put(p, &e->p2, l2);
    }
    __atomic_store_n(&r->state, ROAR_STATE_COMMITTED, __ATOMIC_RELEASE);
}

/* A vfork child runs on its parent's memory (this thread, its TLS, our tables) until it
 * execs, so it must not change anything the parent will read.  The vfork trampoline
 * marks the thread; the first hook after that asks the kernel which process it is in
 * (in the parent, once vfork has returned, that clears the mark). */
static inline int in_vfork_child(void) {
    if (LIKELY(!t_vfork)) return 0;
    if ((uint32_t)syscall(SYS_getpid) == g.pid) {
        t_vfork = 0;
        return 0;
    }
    return 1;
}

static inline int own_memory(void) { return !in_vfork_child(); }

/* Hooks record only when a session is active, we are not already inside one, and this
 * is not a vfork child (whose exec is recorded by do_exec with its own ids). */
static inline int recording(void) { return LIKELY(g.active) && !t_busy && own_memory(); }

#define ENTER(saved) \
    int saved = errno; \
    t_busy++
#define LEAVE(saved) \
    t_busy--;         \
    errno = saved

/* ------------------------------------------------------------------ paths */

static void rpath_abs(struct rpath *p, const char *s) {
    p->s = s ? s : "";
    p->slen = cstrlen(s);
    p->pre = NULL;
    p->prelen = 0;
    if (s && s[0] != '/') {
        int c = __atomic_load_n(&cwd.cur, __ATOMIC_ACQUIRE);
        p->pre = cwd.buf[c];
        p->prelen = cwd.len[c];
    }
}

/* Join a path to the directory an fd refers to.  `tmp` (PATH_MAX) backs the prefix
 * when the fd's path is not in the table and must be read from /proc. */
static void rpath_at(struct rpath *p, int dirfd, const char *s, char *tmp, uint32_t *rflags) {
    rpath_abs(p, s);
    if (!s || s[0] == '/' || dirfd == AT_FDCWD) return;
    if (dirfd >= 0 && dirfd < FD_PATH_MAX) {
        struct fd_path *fp = &fd_paths[dirfd];
        uint32_t s1 = __atomic_load_n(&fp->seq, __ATOMIC_ACQUIRE);
        if (!(s1 & 1) && fp->len) {
            size_t n = fp->len;
            memcpy(tmp, fp->path, n);
            if (__atomic_load_n(&fp->seq, __ATOMIC_ACQUIRE) == s1) {
                p->pre = tmp;
                p->prelen = n;
                return;
            }
        }
    }
    char link[32] = "/proc/self/fd/";
    put_u64(link + 14, (uint64_t)dirfd)[0] = 0;
    ssize_t n = syscall(SYS_readlinkat, AT_FDCWD, link, tmp, PATH_MAX - 1);
    if (n > 0) {
        p->pre = tmp;
        p->prelen = (size_t)n;
    } else {
        *rflags |= ROAR_RF_DIRFD_UNKNOWN;
        p->pre = NULL;
        p->prelen = 0;
    }
}

static void fd_remember(int fd, const struct rpath *p, uint8_t track, uint8_t writable,
                        const struct stat *st) {
    if (fd < 0) return;
    if (fd > g.max_fd) g.max_fd = fd;
    if (fd < FD_STATE_MAX) {
        struct fd_state *fs = &fd_states[fd];
        if (fs->track && !track) __atomic_sub_fetch(&g.tracked_fds, 1, __ATOMIC_RELAXED);
        if (!fs->track && track) __atomic_add_fetch(&g.tracked_fds, 1, __ATOMIC_RELAXED);
        if (fs->writable && !writable) __atomic_sub_fetch(&g.writable_fds, 1, __ATOMIC_RELAXED);
        if (!fs->writable && writable) __atomic_add_fetch(&g.writable_fds, 1, __ATOMIC_RELAXED);
        fs->track = track;
        fs->writable = writable;
        if (st) {
            fs->size = st->st_size;
            fs->mtime_ns = ts_ns(st->st_mtim);
            fs->ctime_ns = ts_ns(st->st_ctim);
        }
    }
    if (fd < FD_PATH_MAX) {
        struct fd_path *fp = &fd_paths[fd];
        __atomic_add_fetch(&fp->seq, 1, __ATOMIC_ACQ_REL);
        size_t n = p ? rpath_len(p) : 0;
        if (n && n < FD_PATH_LEN) {
            rpath_put(fp->path, p, n);
            fp->len = (uint16_t)n;
        } else {
            fp->len = 0;
        }
        __atomic_add_fetch(&fp->seq, 1, __ATOMIC_RELEASE);
    }
}

static void fd_copy(int from, int to) {
    if (from < 0 || to < 0 || from == to) return;
    struct rpath p = {0};
    if (from < FD_PATH_MAX && fd_paths[from].len) {
        p.s = fd_paths[from].path;
        p.slen = fd_paths[from].len;
    }
    struct fd_state saved = from < FD_STATE_MAX ? fd_states[from] : (struct fd_state){0};
    fd_remember(to, p.slen ? &p : NULL, saved.track, saved.writable, NULL);
    if (to < FD_STATE_MAX) {
        fd_states[to].size = saved.size;
        fd_states[to].mtime_ns = saved.mtime_ns;
        fd_states[to].ctime_ns = saved.ctime_ns;
    }
}

/* ------------------------------------------------------------------ open/close */

struct pre_open {
    int have;    /* whether the path existed before is known */
    int existed;
    int have_st; /* st is the previous version's identity (freopen only) */
    struct stat st;
};

/* Whether an O_CREAT open creates its file decides "created" versus "overwritten".
 * Asking with O_EXCL first answers that with no extra syscall for a new file (the
 * usual case for outputs); only an existing file costs one failed open, after which
 * the program's own open runs unchanged, so its result and errno are the real ones. */
static inline int probe_excl(int flags) {
    return recording() && writable(flags) && (flags & O_CREAT) && !(flags & O_EXCL) &&
           !(flags & O_DIRECTORY) && (flags & O_TMPFILE) != O_TMPFILE;
}

#define PROBED(pre, flags, CALL_EXCL, CALL)     \
    int fd;                                     \
    struct pre_open pre = {0};                  \
    if (probe_excl(flags)) {                    \
        int saved_ = errno;                     \
        fd = CALL_EXCL;                         \
        pre.have = 1;                           \
        if (fd < 0) {                           \
            pre.have = pre.existed = errno == EEXIST; \
            errno = saved_;                     \
            fd = CALL;                          \
        }                                       \
    } else {                                    \
        fd = CALL;                              \
    }

/* freopen cannot be retried (the stream is gone after a failure): stat instead. */
static void open_before(int dirfd, const char *path, int flags, struct pre_open *pre) {
    pre->have = pre->existed = pre->have_st = 0;
    if (!recording() || !writable(flags) || !path) return;
    if (((flags & O_CREAT) && !(flags & O_EXCL)) || (flags & O_TRUNC)) {
        int saved = errno;
        pre->have = 1;
        pre->existed = pre->have_st = stat_to(dirfd, path, 0, &pre->st) == 0;
        errno = saved;
    }
}

static void open_after(int dirfd, const char *path, int flags, mode_t mode, int fd,
                       const struct pre_open *pre, uint32_t rflags) {
    if (!recording()) return;
    ENTER(saved);
    char tmp[PATH_MAX];
    struct ev e = {.op = ROAR_OP_OPEN, .flags = (uint32_t)flags, .mode = mode, .fd = dirfd,
                   .result = fd, .err = fd < 0 ? saved : 0};
    rpath_at(&e.p1, dirfd, path, tmp, &rflags);
    uint8_t track = TRACK_NONE, can_write = fd >= 0 && writable(flags);
    struct stat st;
    const struct stat *baseline = NULL;
    if (fd >= 0 && (flags & O_TMPFILE) == O_TMPFILE) {
        track = TRACK_MODIFIED; /* anonymous until linked: never an input */
    } else if (fd >= 0 && writable(flags)) {
        int existed = pre->have ? pre->existed : !(flags & O_EXCL);
        if (existed) rflags |= ROAR_RF_EXISTED;
        if (pre->have_st) e.st = &pre->st;
        if (!existed || (flags & O_TRUNC)) {
            /* Created or truncated: this open record already says "written", so its close
             * would add nothing (a third of the records of a task that writes files). */
            track = TRACK_NONE;
        } else if (fstat(fd, &st) == 0) {
            /* Opened for update: the state now is the version before any write, the
             * baseline that close compares with. */
            e.st = baseline = &st;
            track = TRACK_COMPARE;
        } else {
            track = TRACK_MODIFIED;
        }
    } else if (fd >= 0 && !(flags & O_DIRECTORY) && fstat(fd, &st) == 0 &&
               S_ISREG(st.st_mode)) {
        /* Read: the version the task opened.  The recorder takes the digest of this
         * state, never of whatever the file holds by the time it is hashed. */
        e.st = &st;
    }
    e.rflags = rflags;
    emit(&e);
    if (fd >= 0) fd_remember(fd, &e.p1, track, can_write, baseline);
    LEAVE(saved);
}

static int fd_changed(const struct fd_state *fs, const struct stat *st) {
    return st->st_size != fs->size || ts_ns(st->st_mtim) != fs->mtime_ns ||
           ts_ns(st->st_ctim) != fs->ctime_ns;
}

static void close_emit(int fd, const struct stat *st, uint32_t rflags);

/* Record the state of a writable fd that is about to be closed.  Called before the
 * real close so fstat still works. */
static void close_record(int fd) {
    if (fd < 0 || fd >= FD_STATE_MAX || !fd_states[fd].track) return;
    struct fd_state *fs = &fd_states[fd];
    struct stat st;
    if (fs->track == TRACK_MODIFIED)
        close_emit(fd, NULL, ROAR_RF_MODIFIED); /* known already: the hash says the rest */
    else if (fstat(fd, &st) == 0)
        close_emit(fd, &st, fd_changed(fs, &st) ? ROAR_RF_MODIFIED : 0);
    else
        close_emit(fd, NULL, 0);
}

/* A close record: the file's state (NULL: unknown) as the descriptor is closed or, at a
 * task boundary, as it stays open. */
static void close_emit(int fd, const struct stat *st, uint32_t rflags) {
    struct ev e = {.op = ROAR_OP_CLOSE, .fd = fd, .rflags = rflags, .st = st};
    char tmp[PATH_MAX];
    if (fd < FD_PATH_MAX && fd_paths[fd].len) {
        e.p1.s = fd_paths[fd].path;
        e.p1.slen = fd_paths[fd].len;
    } else {
        char link[32] = "/proc/self/fd/";
        put_u64(link + 14, (uint64_t)fd)[0] = 0;
        ssize_t n = syscall(SYS_readlinkat, AT_FDCWD, link, tmp, PATH_MAX - 1);
        e.p1.s = tmp;
        e.p1.slen = n > 0 ? (size_t)n : 0;
    }
    emit(&e);
}

static void fd_forget(int fd) {
    if (fd < 0) return;
    if (fd < FD_STATE_MAX && fd_states[fd].track) {
        fd_states[fd].track = 0;
        __atomic_sub_fetch(&g.tracked_fds, 1, __ATOMIC_RELAXED);
    }
    if (fd < FD_STATE_MAX && fd_states[fd].writable) {
        fd_states[fd].writable = 0;
        __atomic_sub_fetch(&g.writable_fds, 1, __ATOMIC_RELAXED);
    }
    if (fd < FD_PATH_MAX && fd_paths[fd].len) {
        __atomic_add_fetch(&fd_paths[fd].seq, 1, __ATOMIC_ACQ_REL);
        fd_paths[fd].len = 0;
        __atomic_add_fetch(&fd_paths[fd].seq, 1, __ATOMIC_RELEASE);
    }
}

static inline int tracked(int fd) { return fd >= 0 && fd < FD_STATE_MAX && fd_states[fd].track; }

/* The mode argument exists only when the flags create a file. */
#define VA_MODE(flags, mode)                 \
    mode_t mode = 0;                         \
    if (needs_mode(flags)) {                 \
        va_list ap;                          \
        va_start(ap, flags);                 \
        mode = va_arg(ap, mode_t);           \
        va_end(ap);                          \
    }

#define OPEN_HOOK(name)                                                            \
    EXPORT int name(const char *path, int flags, ...) {                            \
        VA_MODE(flags, mode)                                                       \
        PROBED(pre, flags, REAL(name)(path, flags | O_EXCL, mode),                 \
               REAL(name)(path, flags, mode))                                      \
        open_after(AT_FDCWD, path, flags, mode, fd, &pre, 0);                      \
        return fd;                                                                 \
    }

OPEN_HOOK(open)
OPEN_HOOK(open64)

#define OPENAT_HOOK(name)                                                          \
    EXPORT int name(int dirfd, const char *path, int flags, ...) {                 \
        VA_MODE(flags, mode)                                                       \
        PROBED(pre, flags, REAL(name)(dirfd, path, flags | O_EXCL, mode),          \
               REAL(name)(dirfd, path, flags, mode))                               \
        open_after(dirfd, path, flags, mode, fd, &pre, 0);                         \
        return fd;                                                                 \
    }

OPENAT_HOOK(openat)
OPENAT_HOOK(openat64)

/* The _FORTIFY_SOURCE entry points: no mode argument, so never O_CREAT (glibc aborts). */
#define OPEN2_HOOK(name)                                    \
    EXPORT int name(const char *path, int flags) {          \
        struct pre_open pre = {0};                          \
        int fd = REAL(name)(path, flags);                   \
        open_after(AT_FDCWD, path, flags, 0, fd, &pre, 0);  \
        return fd;                                          \
    }

OPEN2_HOOK(__open_2)
OPEN2_HOOK(__open64_2)

#define OPENAT2_HOOK(name)                                      \
    EXPORT int name(int dirfd, const char *path, int flags) {   \
        struct pre_open pre = {0};                              \
        int fd = REAL(name)(dirfd, path, flags);                \
        open_after(dirfd, path, flags, 0, fd, &pre, 0);         \
        return fd;                                              \
    }

OPENAT2_HOOK(__openat_2)
OPENAT2_HOOK(__openat64_2)

#define CREAT_HOOK(name)                                                              \
    EXPORT int name(const char *path, mode_t mode) {                                  \
        int flags = O_CREAT | O_WRONLY | O_TRUNC;                                     \
        PROBED(pre, flags, REAL(open)(path, flags | O_EXCL, mode), REAL(name)(path, mode)) \
        open_after(AT_FDCWD, path, flags, mode, fd, &pre, 0);                         \
        return fd;                                                                    \
    }

CREAT_HOOK(creat)
CREAT_HOOK(creat64)

static int fopen_flags(const char *m) {
    int flags;
    if (!m) return O_RDONLY;
    switch (m[0]) {
    case 'w': flags = O_WRONLY | O_CREAT | O_TRUNC; break;
    case 'a': flags = O_WRONLY | O_CREAT | O_APPEND; break;
    default: flags = O_RDONLY; break;
    }
    for (const char *c = m + 1; *c && *c != ','; c++) {
        if (*c == '+') flags = (flags & ~O_ACCMODE) | O_RDWR;
        if (*c == 'x') flags |= O_EXCL;
        if (*c == 'e') flags |= O_CLOEXEC;
    }
    return flags;
}

/* The same probe for stdio: mode "w" becomes "wx" (before any ",ccs=" suffix). */
static const char *fopen_excl_mode(const char *m, char *buf, size_t n) {
    size_t l = strcspn(m, ",");
    if (strlen(m) + 2 > n) return NULL;
    memcpy(buf, m, l);
    buf[l] = 'x';
    strcpy(buf + l + 1, m + l);
    return buf;
}

#define FOPEN_HOOK(name)                                                              \
    EXPORT FILE *name(const char *path, const char *m) {                              \
        int flags = fopen_flags(m);                                                   \
        char xm[64];                                                                  \
        const char *xmode = m ? fopen_excl_mode(m, xm, sizeof xm) : NULL;             \
        FILE *f;                                                                      \
        struct pre_open pre = {0};                                                    \
        if (xmode && probe_excl(flags)) {                                             \
            int saved_ = errno;                                                       \
            f = REAL(name)(path, xmode);                                              \
            pre.have = 1;                                                             \
            if (!f) {                                                                 \
                pre.have = pre.existed = errno == EEXIST;                             \
                errno = saved_;                                                       \
                f = REAL(name)(path, m);                                              \
            }                                                                         \
        } else {                                                                      \
            f = REAL(name)(path, m);                                                  \
        }                                                                             \
        open_after(AT_FDCWD, path, flags, 0666, f ? fileno(f) : -1, &pre,             \
                   ROAR_RF_FOPEN);                                                    \
        return f;                                                                     \
    }

FOPEN_HOOK(fopen)
FOPEN_HOOK(fopen64)

/* Flushing before fstat is what fclose would do first anyway; a flush error is
 * reported exactly as fclose would report it. */
static int flush_for_close(FILE *f, int *flush_err) {
    int fd = fileno(f);
    *flush_err = 0;
    if (!recording() || !tracked(fd)) return fd;
    if (fflush(f) == EOF) *flush_err = errno ? errno : EIO;
    return fd;
}

#define FREOPEN_HOOK(name)                                                        \
    EXPORT FILE *name(const char *path, const char *m, FILE *stream) {            \
        int flush_err, oldfd = stream ? flush_for_close(stream, &flush_err) : -1; \
        int flags = fopen_flags(m);                                               \
        struct pre_open pre;                                                      \
        if (recording() && tracked(oldfd)) {                                      \
            ENTER(saved);                                                         \
            close_record(oldfd);                                               \
            LEAVE(saved);                                                         \
        }                                                                         \
        if (path) open_before(AT_FDCWD, path, flags, &pre);                       \
        FILE *f = REAL(name)(path, m, stream);                                    \
        if (path) {                                                               \
            int saved = errno;                                                    \
            if (oldfd >= 0 && (!f || fileno(f) != oldfd)) fd_forget(oldfd);       \
            errno = saved;                                                        \
            open_after(AT_FDCWD, path, flags, 0666, f ? fileno(f) : -1, &pre,     \
                       ROAR_RF_FOPEN);                                            \
        }                                                                         \
        return f;                                                                 \
    }

FREOPEN_HOOK(freopen)
FREOPEN_HOOK(freopen64)

EXPORT int close(int fd) {
    if (recording() && tracked(fd)) {
        ENTER(saved);
        close_record(fd);
        LEAVE(saved);
    }
    int r = REAL(close)(fd);
    int saved = errno;
    if (own_memory()) fd_forget(fd);
    errno = saved;
    return r;
}

EXPORT int fclose(FILE *f) {
    int flush_err = 0, fd = f ? flush_for_close(f, &flush_err) : -1;
    if (recording() && tracked(fd)) {
        ENTER(saved);
        close_record(fd);
        LEAVE(saved);
    }
    int r = REAL(fclose)(f);
    int saved = errno;
    if (own_memory()) fd_forget(fd);
    errno = saved;
    if (flush_err && r == 0) {
        errno = flush_err;
        return EOF;
    }
    return r;
}

/* ------------------------------------------------------------------ namespace ops */

static void record2(uint16_t op, int dfd1, const char *p1, int dfd2, const char *p2,
                    uint32_t flags, int r) {
    if (!recording()) return;
    ENTER(saved);
    char t1[PATH_MAX], t2[PATH_MAX];
    struct ev e = {.op = op, .flags = flags, .result = r, .err = r < 0 ? saved : 0};
    rpath_at(&e.p1, dfd1, p1, t1, &e.rflags);
    if (p2) rpath_at(&e.p2, dfd2, p2, t2, &e.rflags);
    emit(&e);
    LEAVE(saved);
}

EXPORT int rename(const char *a, const char *b) {
    int r = REAL(rename)(a, b);
    record2(ROAR_OP_RENAME, AT_FDCWD, a, AT_FDCWD, b, 0, r);
    return r;
}

EXPORT int renameat(int da, const char *a, int db, const char *b) {
    int r = REAL(renameat)(da, a, db, b);
    record2(ROAR_OP_RENAME, da, a, db, b, 0, r);
    return r;
}

EXPORT int renameat2(int da, const char *a, int db, const char *b, unsigned int flags) {
    int r = REAL(renameat2)(da, a, db, b, flags);
    record2(ROAR_OP_RENAME, da, a, db, b, flags, r);
    return r;
}

EXPORT int link(const char *a, const char *b) {
    int r = REAL(link)(a, b);
    record2(ROAR_OP_LINK, AT_FDCWD, a, AT_FDCWD, b, 0, r);
    return r;
}

EXPORT int linkat(int da, const char *a, int db, const char *b, int flags) {
    int r = REAL(linkat)(da, a, db, b, flags);
    record2(ROAR_OP_LINK, da, a, db, b, (uint32_t)flags, r);
    return r;
}

/* The target of a symlink is text, not a path relative to our cwd: keep it as is. */
static void record_symlink(const char *target, int dfd, const char *lp, int r) {
    if (!recording()) return;
    ENTER(saved);
    char t[PATH_MAX];
    struct ev e = {.op = ROAR_OP_SYMLINK, .result = r, .err = r < 0 ? saved : 0};
    e.p1.s = target ? target : "";
    e.p1.slen = cstrlen(target);
    rpath_at(&e.p2, dfd, lp, t, &e.rflags);
    emit(&e);
    LEAVE(saved);
}

EXPORT int symlink(const char *target, const char *lp) {
    int r = REAL(symlink)(target, lp);
    record_symlink(target, AT_FDCWD, lp, r);
    return r;
}

EXPORT int symlinkat(const char *target, int dfd, const char *lp) {
    int r = REAL(symlinkat)(target, dfd, lp);
    record_symlink(target, dfd, lp, r);
    return r;
}

EXPORT int unlink(const char *p) {
    int r = REAL(unlink)(p);
    record2(ROAR_OP_UNLINK, AT_FDCWD, p, AT_FDCWD, NULL, 0, r);
    return r;
}

EXPORT int unlinkat(int d, const char *p, int flags) {
    int r = REAL(unlinkat)(d, p, flags);
    record2((flags & AT_REMOVEDIR) ? ROAR_OP_RMDIR : ROAR_OP_UNLINK, d, p, AT_FDCWD, NULL,
            (uint32_t)flags, r);
    return r;
}

EXPORT int remove(const char *p) {
    int r = REAL(remove)(p);
    record2(ROAR_OP_UNLINK, AT_FDCWD, p, AT_FDCWD, NULL, 0, r);
    return r;
}

EXPORT int truncate(const char *p, off_t len) {
    int r = REAL(truncate)(p, len);
    record2(ROAR_OP_TRUNCATE, AT_FDCWD, p, AT_FDCWD, NULL, 0, r);
    return r;
}

EXPORT int truncate64(const char *p, off64_t len) {
    int r = REAL(truncate64)(p, len);
    record2(ROAR_OP_TRUNCATE, AT_FDCWD, p, AT_FDCWD, NULL, 0, r);
    return r;
}

EXPORT int mkdir(const char *p, mode_t m) {
    int r = REAL(mkdir)(p, m);
    record2(ROAR_OP_MKDIR, AT_FDCWD, p, AT_FDCWD, NULL, m, r);
    return r;
}

EXPORT int mkdirat(int d, const char *p, mode_t m) {
    int r = REAL(mkdirat)(d, p, m);
    record2(ROAR_OP_MKDIR, d, p, AT_FDCWD, NULL, m, r);
    return r;
}

EXPORT int rmdir(const char *p) {
    int r = REAL(rmdir)(p);
    record2(ROAR_OP_RMDIR, AT_FDCWD, p, AT_FDCWD, NULL, 0, r);
    return r;
}

/* ------------------------------------------------------------------ cwd */

static void cwd_refresh(void) {
    int next = !__atomic_load_n(&cwd.cur, __ATOMIC_RELAXED);
    if (syscall(SYS_getcwd, cwd.buf[next], sizeof cwd.buf[next]) > 0) {
        cwd.len[next] = (uint16_t)strlen(cwd.buf[next]);
        /* The root is "/", but joins add their own '/'. */
        if (cwd.len[next] == 1) cwd.len[next] = 0, cwd.buf[next][0] = 0;
        __atomic_store_n(&cwd.cur, next, __ATOMIC_RELEASE);
    }
}

static void record_chdir(int r) {
    if (!own_memory()) return; /* a vfork child's cwd is not its parent's */
    if (r == 0) cwd_refresh();
    if (!recording()) return;
    ENTER(saved);
    int c = __atomic_load_n(&cwd.cur, __ATOMIC_ACQUIRE);
    struct ev e = {.op = ROAR_OP_CHDIR, .result = r, .err = r < 0 ? saved : 0};
    e.p1.s = cwd.len[c] ? cwd.buf[c] : "/";
    e.p1.slen = cwd.len[c] ? cwd.len[c] : 1;
    emit(&e);
    LEAVE(saved);
}

EXPORT int chdir(const char *p) {
    int r = REAL(chdir)(p);
    int saved = errno;
    record_chdir(r);
    errno = saved;
    return r;
}

EXPORT int fchdir(int fd) {
    int r = REAL(fchdir)(fd);
    int saved = errno;
    record_chdir(r);
    errno = saved;
    return r;
}

/* ------------------------------------------------------------------ dup */

static void record_dup(int old, int r) {
    if (r < 0 || !own_memory()) return;
    int saved = errno;
    int was_tracked = tracked(old);
    fd_copy(old, r);
    if (recording() && was_tracked) {
        t_busy++;
        struct ev e = {.op = ROAR_OP_DUP, .fd = old, .result = r};
        emit(&e);
        t_busy--;
    }
    errno = saved;
}

EXPORT int dup(int old) {
    int r = REAL(dup)(old);
    record_dup(old, r);
    return r;
}

/* dup2/dup3 close `new` first: a tracked writable fd there is closed here. */
static void before_dup2(int old, int new) {
    if (old != new && recording() && tracked(new)) {
        ENTER(saved);
        close_record(new);
        LEAVE(saved);
    }
}

EXPORT int dup2(int old, int new) {
    before_dup2(old, new);
    int r = REAL(dup2)(old, new);
    if (r >= 0 && old != new && own_memory()) {
        int saved = errno;
        fd_forget(new);
        errno = saved;
    }
    record_dup(old, r);
    return r;
}

EXPORT int dup3(int old, int new, int flags) {
    before_dup2(old, new);
    int r = REAL(dup3)(old, new, flags);
    if (r >= 0 && own_memory()) {
        int saved = errno;
        fd_forget(new);
        errno = saved;
    }
    record_dup(old, r);
    return r;
}

/* fcntl's third argument is an int, a long or a pointer depending on cmd; passing it on
 * as a pointer-sized value is what every caller's ABI allows. */
#define FCNTL_HOOK(name)                                                  \
    EXPORT int name(int fd, int cmd, ...) {                               \
        va_list ap;                                                       \
        va_start(ap, cmd);                                                \
        void *arg = va_arg(ap, void *);                                   \
        va_end(ap);                                                       \
        int r = REAL(name)(fd, cmd, arg);                                 \
        if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) record_dup(fd, r);  \
        return r;                                                         \
    }

FCNTL_HOOK(fcntl)
FCNTL_HOOK(fcntl64)

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* close_range/closefrom close many fds in one call: record the writable ones first. */
static void before_close_range(unsigned first, unsigned last) {
    if (!recording() || !__atomic_load_n(&g.tracked_fds, __ATOMIC_RELAXED)) return;
    ENTER(saved);
    for (unsigned fd = first; fd <= last && fd < FD_STATE_MAX && (int)fd <= g.max_fd; fd++)
        if (fd_states[fd].track) close_record((int)fd);
    LEAVE(saved);
}

static void after_close_range(unsigned first, unsigned last) {
    if (!own_memory()) return;
    int saved = errno;
    for (unsigned fd = first; fd <= last && (int)fd <= g.max_fd; fd++) fd_forget((int)fd);
    errno = saved;
}

EXPORT int close_range(unsigned int first, unsigned int last, int flags) {
    int closing = !(flags & CLOSE_RANGE_CLOEXEC);
    if (closing) before_close_range(first, last);
    int r = REAL(close_range)(first, last, flags);
    if (r == 0 && closing) after_close_range(first, last);
    return r;
}

EXPORT void closefrom(int low) {
    unsigned first = low < 0 ? 0 : (unsigned)low;
    before_close_range(first, ~0u);
    REAL(closefrom)(low);
    after_close_range(first, ~0u);
}

/* mkstemp and friends open their file inside glibc, out of our hooks' reach. */
static int record_mkstemp(char *tmpl, int fd, int extra_flags) {
    struct pre_open pre = {.have = 1};
    open_after(AT_FDCWD, tmpl, O_RDWR | O_CREAT | O_EXCL | extra_flags, 0600, fd, &pre, 0);
    return fd;
}

EXPORT int mkstemp(char *t) { return record_mkstemp(t, REAL(mkstemp)(t), 0); }
EXPORT int mkstemp64(char *t) { return record_mkstemp(t, REAL(mkstemp64)(t), 0); }
EXPORT int mkostemp(char *t, int fl) { return record_mkstemp(t, REAL(mkostemp)(t, fl), fl); }
EXPORT int mkostemp64(char *t, int fl) {
    return record_mkstemp(t, REAL(mkostemp64)(t, fl), fl);
}
EXPORT int mkstemps(char *t, int sl) { return record_mkstemp(t, REAL(mkstemps)(t, sl), 0); }
EXPORT int mkstemps64(char *t, int sl) {
    return record_mkstemp(t, REAL(mkstemps64)(t, sl), 0);
}
EXPORT int mkostemps(char *t, int sl, int fl) {
    return record_mkstemp(t, REAL(mkostemps)(t, sl, fl), fl);
}
EXPORT int mkostemps64(char *t, int sl, int fl) {
    return record_mkstemp(t, REAL(mkostemps64)(t, sl, fl), fl);
}

EXPORT char *mkdtemp(char *t) {
    char *r = REAL(mkdtemp)(t);
    record2(ROAR_OP_MKDIR, AT_FDCWD, t, AT_FDCWD, NULL, 0700, r ? 0 : -1);
    return r;
}

/* vfork cannot be wrapped by a C function (the child would return through, and
 * clobber, the frame the parent later returns through), so a two-instruction
 * trampoline marks the thread and tail-jumps to the real vfork. */
#if defined(__x86_64__)
static void *real_vfork_ptr __attribute__((used));
__asm__(".text\n"
        ".globl vfork\n"
        ".type vfork, @function\n"
        "vfork:\n"
        "    movq t_vfork@gottpoff(%rip), %rax\n"
        "    movl $1, %fs:(%rax)\n"
        "    jmp *real_vfork_ptr(%rip)\n"
        ".size vfork, .-vfork\n");
#endif

/* ------------------------------------------------------------------ exec / spawn */

/* Would the loader ignore LD_PRELOAD for this program?  Static (no PT_INTERP) or
 * setuid/setgid to someone else.  Raw syscalls only: this may run in a vfork child. */
static uint32_t probe_untraceable(const char *path, int depth) {
    struct stat st;
    if (!path || stat_to(AT_FDCWD, path, 0, &st) != 0) return 0;
    if (((st.st_mode & S_ISUID) && st.st_uid != geteuid()) ||
        ((st.st_mode & S_ISGID) && st.st_gid != getegid()))
        return ROAR_RF_UNTRACEABLE | ROAR_RF_SETUID;
    int fd = sys_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return 0;
    uint32_t res = 0;
    Elf64_Ehdr eh;
    ssize_t n = syscall(SYS_pread64, fd, &eh, sizeof eh, 0);
    if (n >= 2 && ((char *)&eh)[0] == '#' && ((char *)&eh)[1] == '!' && depth == 0) {
        char interp[256];
        size_t i = 0, j = 2;
        const char *b = (const char *)&eh;
        while (j < (size_t)n && (b[j] == ' ' || b[j] == '\t')) j++;
        while (j < (size_t)n && b[j] != ' ' && b[j] != '\n' && b[j] != '\t' && i < 255)
            interp[i++] = b[j++];
        interp[i] = 0;
        sys_close(fd);
        return i ? probe_untraceable(interp, 1) : 0;
    }
    if (n == (ssize_t)sizeof eh && memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
        eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_phentsize == sizeof(Elf64_Phdr)) {
        int interp = 0;
        Elf64_Phdr ph[16];
        for (unsigned i = 0; i < eh.e_phnum && !interp; i += 16) {
            unsigned cnt = eh.e_phnum - i < 16 ? eh.e_phnum - i : 16;
            ssize_t m = syscall(SYS_pread64, fd, ph, cnt * sizeof(Elf64_Phdr),
                                (off_t)(eh.e_phoff + i * sizeof(Elf64_Phdr)));
            if (m != (ssize_t)(cnt * sizeof(Elf64_Phdr))) break;
            for (unsigned k = 0; k < cnt; k++)
                if (ph[k].p_type == PT_INTERP) interp = 1;
        }
        if (!interp) res = ROAR_RF_UNTRACEABLE;
    }
    sys_close(fd);
    return res;
}

/* PATH lookup for the record only; the real execvpe/posix_spawnp do the real search. */
static const char *path_search(const char *file, char *buf, const char *pathenv) {
    if (!file || strchr(file, '/')) return file;
    const char *p = pathenv ? pathenv : "/usr/local/bin:/usr/bin:/bin";
    size_t fl = strlen(file);
    while (*p) {
        const char *e = strchr(p, ':');
        size_t dl = e ? (size_t)(e - p) : strlen(p);
        if (dl + 1 + fl < PATH_MAX) {
            memcpy(buf, dl ? p : ".", dl ? dl : 1);
            size_t o = dl ? dl : 1;
            buf[o] = '/';
            memcpy(buf + o + 1, file, fl + 1);
            if (syscall(SYS_faccessat, AT_FDCWD, buf, X_OK) == 0) return buf;
        }
        if (!e) break;
        p = e + 1;
    }
    return file;
}

static const char *env_get(char *const *envp, const char *name, size_t nl) {
    for (; envp && *envp; envp++)
        if (!strncmp(*envp, name, nl) && (*envp)[nl] == '=') return *envp + nl + 1;
    return NULL;
}

/* Does LD_PRELOAD (space or colon separated) already name our library? */
static int preload_has_us(const char *v) {
    size_t ll = strlen(g.lib_path);
    for (const char *p = v; p && *p;) {
        while (*p == ' ' || *p == ':') p++;
        const char *e = p;
        while (*e && *e != ' ' && *e != ':') e++;
        if ((size_t)(e - p) == ll && !memcmp(p, g.lib_path, ll)) return 1;
        p = e;
    }
    return 0;
}

#define EXEC_ENV_EXTRA 4
#define PRELOAD_BUF (PATH_MAX + 4096)

struct exec_env {
    char preload[PRELOAD_BUF];
    char session[PATH_MAX + 32];
    char tag[ROAR_MAX_TAG + 32];
};

/* Build the child's environment on the stack (this may run in a vfork child, so no
 * shared state is touched): the caller's entries, minus ROAR_TASK_TAG, with our tag,
 * LD_PRELOAD and session dir re-added when a launcher dropped them. */
static void build_env(char **out, size_t cap, char *const *envp, struct exec_env *b) {
    size_t n = 0;
    const char *pre = env_get(envp, "LD_PRELOAD", 10);
    int need_preload = !pre || !preload_has_us(pre);
    int need_session = !env_get(envp, "ROAR_SESSION_DIR", 16);
    for (char *const *e = envp; e && *e && n + EXEC_ENV_EXTRA + 1 < cap; e++) {
        if (!strncmp(*e, "ROAR_TASK_TAG=", 14)) continue;
        if (need_preload && !strncmp(*e, "LD_PRELOAD=", 11)) continue;
        out[n++] = *e;
    }
    if (need_preload) {
        char *p = b->preload;
        size_t ll = strlen(g.lib_path), ol = pre ? strlen(pre) : 0;
        memcpy(p, "LD_PRELOAD=", 11);
        memcpy(p + 11, g.lib_path, ll);
        p[11 + ll] = 0;
        if (ol && 11 + ll + 1 + ol < PRELOAD_BUF) {
            p[11 + ll] = ':';
            memcpy(p + 12 + ll, pre, ol + 1);
        }
        out[n++] = p;
    }
    if (need_session) {
        size_t sl = strlen(g.session_dir);
        memcpy(b->session, "ROAR_SESSION_DIR=", 17);
        memcpy(b->session + 17, g.session_dir, sl + 1);
        out[n++] = b->session;
    }
    uint32_t rf = 0;
    uint16_t tl = current_tag(b->tag + 14, &rf);
    if (tl) {
        memcpy(b->tag, "ROAR_TASK_TAG=", 14);
        b->tag[14 + tl] = 0;
        out[n++] = b->tag;
    }
    out[n] = NULL;
}

static size_t env_count(char *const *envp) {
    size_t n = 0;
    while (envp && envp[n]) n++;
    return n;
}

static void record_exec(uint16_t op, const char *path, char *const argv[], int64_t result,
                        int err, uint32_t rflags) {
    struct ev e = {.op = op, .result = result, .err = err, .rflags = rflags, .argv = argv};
    e.pid = (uint32_t)syscall(SYS_getpid);
    e.ppid = (uint32_t)syscall(SYS_getppid);
    e.tid = (uint32_t)syscall(SYS_gettid);
    rpath_abs(&e.p1, path);
    if (!argv) e.argv = (char *const[]){NULL};
    emit(&e);
}

static int do_exec(const char *file, char *const argv[], char *const envp[], int search) {
    if (!g.active || t_busy) {
        return search ? REAL(execvpe)(file, argv, envp) : REAL(execve)(file, argv, envp);
    }
    char pbuf[PATH_MAX];
    const char *path = search ? path_search(file, pbuf, env_get(envp, "PATH", 4)) : file;
    int saved = errno;
    t_busy++;
    record_exec(ROAR_OP_EXEC, path, argv, 0, 0, probe_untraceable(path, 0));
    t_busy--;
    size_t cap = env_count(envp) + EXEC_ENV_EXTRA + 1;
    char *env[cap];
    struct exec_env b;
    build_env(env, cap, envp, &b);
    errno = saved;
    int r = search ? REAL(execvpe)(file, argv, env) : REAL(execve)(file, argv, env);
    saved = errno;
    t_busy++;
    record_exec(ROAR_OP_EXEC_FAIL, path, argv, r, saved, 0);
    t_busy--;
    errno = saved;
    return r;
}

EXPORT int execve(const char *p, char *const argv[], char *const envp[]) {
    return do_exec(p, argv, envp, 0);
}

EXPORT int execv(const char *p, char *const argv[]) { return do_exec(p, argv, environ, 0); }

EXPORT int execvp(const char *f, char *const argv[]) { return do_exec(f, argv, environ, 1); }

EXPORT int execvpe(const char *f, char *const argv[], char *const envp[]) {
    return do_exec(f, argv, envp, 1);
}

/* execl*: collect the variadic argv on the stack. */
#define COLLECT_ARGS(arg0, ap, argv, with_env, envp)                          \
    size_t argc_ = 0;                                                         \
    /* glibc declares arg nonnull, but callers do pass NULL (empty argv). */  \
    const char *volatile a0_ = arg0;                                          \
    va_start(ap, arg0);                                                       \
    if (a0_)                                                                  \
        for (argc_ = 1; va_arg(ap, char *); argc_++) {}                       \
    va_end(ap);                                                               \
    char *argv[argc_ + 1];                                                    \
    argv[0] = (char *)arg0;                                                   \
    va_start(ap, arg0);                                                       \
    for (size_t i_ = 1; i_ <= argc_; i_++) argv[i_] = va_arg(ap, char *);     \
    if (with_env) envp = va_arg(ap, char *const *);                           \
    va_end(ap)

EXPORT int execl(const char *p, const char *arg, ...) {
    va_list ap;
    char *const *envp = environ;
    COLLECT_ARGS(arg, ap, argv, 0, envp);
    return do_exec(p, argv, envp, 0);
}

EXPORT int execlp(const char *f, const char *arg, ...) {
    va_list ap;
    char *const *envp = environ;
    COLLECT_ARGS(arg, ap, argv, 0, envp);
    return do_exec(f, argv, envp, 1);
}

EXPORT int execle(const char *p, const char *arg, ...) {
    va_list ap;
    char *const *envp = NULL;
    COLLECT_ARGS(arg, ap, argv, 1, envp);
    return do_exec(p, argv, envp, 0);
}

static int do_spawn(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                    const posix_spawnattr_t *at, char *const argv[], char *const envp[],
                    int search) {
    if (!g.active || t_busy)
        return search ? REAL(posix_spawnp)(pid, file, fa, at, argv, envp)
                      : REAL(posix_spawn)(pid, file, fa, at, argv, envp);
    size_t cap = env_count(envp) + EXEC_ENV_EXTRA + 1;
    char *env[cap];
    struct exec_env b;
    build_env(env, cap, envp, &b);
    pid_t child = -1;
    int r = search ? REAL(posix_spawnp)(&child, file, fa, at, argv, env)
                   : REAL(posix_spawn)(&child, file, fa, at, argv, env);
    if (pid && r == 0) *pid = child;
    int saved = errno;
    char pbuf[PATH_MAX];
    const char *path = search ? path_search(file, pbuf, env_get(envp, "PATH", 4)) : file;
    t_busy++;
    struct ev e = {.op = ROAR_OP_SPAWN, .result = r == 0 ? child : -1, .err = r,
                   .rflags = probe_untraceable(path, 0), .argv = argv};
    rpath_abs(&e.p1, path);
    if (!argv) e.argv = (char *const[]){NULL};
    emit(&e);
    t_busy--;
    errno = saved;
    return r;
}

EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                       const posix_spawnattr_t *at, char *const argv[], char *const envp[]) {
    return do_spawn(pid, path, fa, at, argv, envp, 0);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                        const posix_spawnattr_t *at, char *const argv[], char *const envp[]) {
    return do_spawn(pid, file, fa, at, argv, envp, 1);
}

/* ------------------------------------------------------------------ log lifecycle */

static void write_start_record(uint32_t origin) {
    char exe[PATH_MAX];
    ssize_t n = syscall(SYS_readlinkat, AT_FDCWD, "/proc/self/exe", exe, sizeof exe - 1);
    exe[n > 0 ? n : 0] = 0;
    /* argv from /proc/self/cmdline: NUL-separated already. */
    char cmd[ROAR_MAX_ARGV + 1];
    ssize_t cl = 0;
    if (origin == ROAR_ORIGIN_EXEC) {
        int fd = sys_open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC, 0);
        if (fd >= 0) {
            ssize_t m;
            while (cl < ROAR_MAX_ARGV &&
                   (m = syscall(SYS_read, fd, cmd + cl, ROAR_MAX_ARGV - cl)) > 0)
                cl += m;
            sys_close(fd);
        }
    }
    cmd[cl] = 0;
    char *argv[256];
    size_t na = 0;
    for (ssize_t i = 0; i < cl && na < 255; na++) {
        argv[na] = cmd + i;
        i += (ssize_t)strlen(cmd + i) + 1;
    }
    argv[na] = NULL;
    struct ev e = {.op = ROAR_OP_START, .result = origin, .argv = argv};
    e.p1.s = exe;
    e.p1.slen = strlen(exe);
    emit(&e);
}

static int log_open_raw(uint32_t origin) {
    char *p = g.log_path;
    size_t sl = strlen(g.session_dir);
    uint64_t mono = now_ns(CLOCK_MONOTONIC), wall = now_ns(CLOCK_REALTIME);
    if (sl + 64 >= sizeof g.log_path) return -1;
    memcpy(p, g.session_dir, sl);
    p += sl;
    memcpy(p, "/roar-", 6);
    p = put_u64(p + 6, g.pid);
    *p++ = '-';
    p = put_u64(p, mono);
    memcpy(p, ".log", 5);
    int fd = sys_open(g.log_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    uint64_t size = ROAR_HEADER_SIZE + (uint64_t)ROAR_CHUNK;
    void *h = MAP_FAILED, *c = MAP_FAILED;
    struct statfs fs;
    int on_tmpfs = syscall(SYS_fstatfs, fd, &fs) == 0 && fs.f_type == ROAR_TMPFS_MAGIC;
    /* The header and a first extent allocated (see back_to), the chunk only sized. */
    if ((!on_tmpfs || syscall(SYS_fallocate, fd, 0, (off_t)0,
                              (off_t)(ROAR_HEADER_SIZE + ROAR_EXTENT_FIRST)) == 0) &&
        syscall(SYS_ftruncate, fd, (off_t)size) == 0) {
        h = mmap(NULL, ROAR_HEADER_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        c = mmap(NULL, ROAR_CHUNK, PROT_READ | PROT_WRITE, MAP_SHARED, fd, ROAR_HEADER_SIZE);
    }
    sys_close(fd);
    if (h == MAP_FAILED || c == MAP_FAILED) {
        if (h != MAP_FAILED) munmap(h, ROAR_HEADER_SIZE);
        if (c != MAP_FAILED) munmap(c, ROAR_CHUNK);
        /* Ours (O_EXCL): an empty file would read as a corrupt log. */
        syscall(SYS_unlinkat, AT_FDCWD, g.log_path, 0);
        return -1;
    }
    struct roar_log_header *hdr = h;
    memcpy(hdr->magic, ROAR_LOG_MAGIC, 8);
    hdr->version = ROAR_LOG_VERSION;
    hdr->header_size = ROAR_HEADER_SIZE;
    hdr->chunk_size = ROAR_CHUNK;
    hdr->origin = origin;
    hdr->pid = g.pid;
    hdr->ppid = g.ppid;
    hdr->start_mono_ns = mono;
    hdr->start_wall_ns = wall;
    hdr->dropped = __atomic_exchange_n(&g.dropped_nolog, 0, __ATOMIC_RELAXED);
    g.file_size = size;
    __atomic_store_n(&g.backed, on_tmpfs ? ROAR_EXTENT_FIRST : UINT64_MAX, __ATOMIC_RELEASE);
    g.start_mono = mono;
    g.start_wall = wall;
    g.chunks[0] = c;
    g.nchunks = 1;
    __atomic_store_n(&g.hdr, hdr, __ATOMIC_RELEASE);
    return 0;
}

/* Called at start-up and in a fork's child, where the program's errno must stay as it was:
 * a failure here (a full session file system) is the shim's, not the program's. */
static int log_open(uint32_t origin) {
    int saved = errno;
    int r = log_open_raw(origin);
    errno = saved;
    return r;
}

static void log_unmap(void) {
    for (uint32_t k = 0; k < g.nchunks; k++) {
        if (g.chunks[k]) munmap(g.chunks[k], ROAR_CHUNK);
        g.chunks[k] = NULL;
    }
    g.nchunks = 0;
    if (g.hdr) munmap(g.hdr, ROAR_HEADER_SIZE);
    g.hdr = NULL;
}

static void tag_copy(struct tag_buf *dst, const char *s) {
    size_t n = cstrlen(s);
    if (n > ROAR_MAX_TAG) n = ROAR_MAX_TAG;
    memcpy(dst->s, s, n);
    dst->s[n] = 0;
    dst->len = (uint16_t)n;
}

/* Recompute the process fallback: the single active task's tag, else the base tag.
 * Called with tags.lock held. */
static void fallback_update(void) {
    const struct tag_buf *src = NULL;
    if (tags.active == 1) {
        for (int i = 0; i < TAG_SLOTS; i++)
            if (tags.slot_used[i]) src = &tags.slot[i];
    } else if (tags.has_base) {
        src = &tags.base;
    }
    if (tags.active == 1 && !src && tags.has_base) src = &tags.base;
    __atomic_add_fetch(&tags.seq, 1, __ATOMIC_ACQ_REL);
    tags.fb_valid = src != NULL;
    if (src) tags.fb = *src;
    __atomic_add_fetch(&tags.seq, 1, __ATOMIC_RELEASE);
}

static void after_fork_child(void) {
    if (!g.configured) return;
    /* The child has one thread: this one.  Its task becomes the process's base tag. */
    char tag[ROAR_MAX_TAG + 1];
    uint32_t rf = 0;
    uint16_t tl = current_tag(tag, &rf);
    tag[tl] = 0;
    log_unmap();
    g.active = 0;
    g.pid = (uint32_t)syscall(SYS_getpid);
    g.ppid = (uint32_t)syscall(SYS_getppid);
    t_tid = 0;
    t_has_tag = 0;
    t_slot = -1;
    tags.lock = 0;
    tags.active = 0;
    memset(tags.slot_used, 0, sizeof tags.slot_used);
    tags.has_base = tl > 0;
    if (tl) tag_copy(&tags.base, tag);
    fallback_update();
    g.grow_lock = 0;
    if (log_open(ROAR_ORIGIN_FORK) == 0) {
        g.active = 1;
        t_busy++;
        write_start_record(ROAR_ORIGIN_FORK);
        t_busy--;
    }
}

EXPORT pid_t fork(void) {
    pid_t r = REAL(fork)();
    if (r != 0 && recording()) {
        ENTER(saved);
        struct ev e = {.op = ROAR_OP_FORK, .result = r, .err = r < 0 ? saved : 0};
        emit(&e);
        LEAVE(saved);
    }
    return r;
}

static void resolve_all(void) {
    (void)REAL(open); (void)REAL(open64); (void)REAL(openat); (void)REAL(openat64);
    (void)REAL(__open_2); (void)REAL(__open64_2); (void)REAL(__openat_2);
    (void)REAL(__openat64_2); (void)REAL(creat); (void)REAL(creat64); (void)REAL(fopen);
    (void)REAL(fopen64); (void)REAL(freopen); (void)REAL(freopen64); (void)REAL(close);
    (void)REAL(fclose); (void)REAL(rename); (void)REAL(renameat); (void)REAL(renameat2);
    (void)REAL(link); (void)REAL(linkat); (void)REAL(symlink); (void)REAL(symlinkat);
    (void)REAL(unlink); (void)REAL(unlinkat); (void)REAL(remove); (void)REAL(truncate);
    (void)REAL(truncate64); (void)REAL(mkdir); (void)REAL(mkdirat); (void)REAL(rmdir);
    (void)REAL(execve); (void)REAL(execvpe); (void)REAL(posix_spawn);
    (void)REAL(posix_spawnp); (void)REAL(fork); (void)REAL(chdir); (void)REAL(fchdir);
    (void)REAL(dup); (void)REAL(dup2); (void)REAL(dup3); (void)REAL(fcntl);
    (void)REAL(fcntl64); (void)REAL(close_range); (void)REAL(closefrom);
#if defined(__x86_64__)
    real_vfork_ptr = dlsym(RTLD_NEXT, "vfork");
#endif
}

static int env_true(const char *v) { return v && *v && strcmp(v, "0") && strcasecmp(v, "false"); }

__attribute__((constructor(101))) static void roar_init(void) {
    resolve_all();
    Dl_info info;
    if (dladdr((void *)&roar_init, &info) && info.dli_fname &&
        strlen(info.dli_fname) < sizeof g.lib_path)
        strcpy(g.lib_path, info.dli_fname);
    const char *dir = getenv("ROAR_SESSION_DIR");
    if (!dir || !*dir || strlen(dir) >= sizeof g.session_dir - 64) return;
    if (env_true(getenv("ROAR_TRACER_OFF"))) return;
    strcpy(g.session_dir, dir);
    roar_quiet_dir(dir); /* roar's own: the task logs producers keep open there */
    g.pid = (uint32_t)syscall(SYS_getpid);
    g.ppid = (uint32_t)syscall(SYS_getppid);
    cwd_refresh();
    const char *tag = getenv("ROAR_TASK_TAG");
    if (tag && *tag) {
        tags.has_base = 1;
        tag_copy(&tags.base, tag);
        fallback_update();
    }
    g.configured = 1;
    pthread_atfork(NULL, NULL, after_fork_child);
    if (log_open(ROAR_ORIGIN_EXEC) != 0) {
        drop();
        return;
    }
    g.active = 1;
    t_busy++;
    write_start_record(ROAR_ORIGIN_EXEC);
    t_busy--;
}

/* On a normal exit, writable fds still open (e.g. a shell's `>>` redirection on fd 1)
 * get their final state recorded; after a kill there is no exit record. */
__attribute__((destructor)) static void roar_fini(void) {
    if (!recording()) return;
    ENTER(saved);
    if (__atomic_load_n(&g.tracked_fds, __ATOMIC_RELAXED) > 0)
        for (int fd = 0; fd < FD_STATE_MAX && fd <= g.max_fd; fd++)
            if (fd_states[fd].track) close_record(fd);
    struct ev e = {.op = ROAR_OP_EXIT};
    emit(&e);
    LEAVE(saved);
}

/* ------------------------------------------------------------------ task API */

EXPORT int roar_version(void) { return ROAR_LOG_VERSION; }

EXPORT int roar_active(void) { return g.active; }

EXPORT const char *roar_log_path(void) { return g.hdr ? g.log_path : NULL; }

/* Where this process's next record goes in its log (hdr.reserved): where a task that
 * begins now begins, without the file's header read back through a new descriptor. */
EXPORT uint64_t roar_log_reserved(void) {
    return g.hdr ? __atomic_load_n(&g.hdr->reserved, __ATOMIC_ACQUIRE) : 0;
}

EXPORT uint64_t roar_dropped(void) {
    return (g.hdr ? __atomic_load_n(&g.hdr->dropped, __ATOMIC_RELAXED) : 0) +
           __atomic_load_n(&g.dropped_nolog, __ATOMIC_RELAXED);
}

/* Whether fd's file is known to be in a quiet directory. */
static int fd_quiet(int fd) {
    if (fd >= FD_PATH_MAX) return 0;
    const struct fd_path *fp = &fd_paths[fd];
    for (int i = 0; i < quiet.n; i++)
        if (fp->len > quiet.len[i] && !memcmp(fp->path, quiet.dir[i], quiet.len[i])) return 1;
    return 0;
}

/* A file a descriptor opened before a task began is written through within it with no
 * open or close of its own (a logger's file, results an actor appends to over its calls).
 * At each task boundary every file open to write that changed since the previous one gets
 * a close record, its descriptor left open, under the tag current here: the task's as it
 * ends, the fallback's as one begins.  Its state now is what the next boundary and its
 * close compare with.  Nothing to do (one load) where no descriptor is open to write. */
static void boundary_writes(void) {
    if (!recording() || !__atomic_load_n(&g.writable_fds, __ATOMIC_RELAXED)) return;
    ENTER(saved);
    int top = g.max_fd < FD_STATE_MAX ? g.max_fd : FD_STATE_MAX - 1;
    for (int fd = 0; fd <= top; fd++) {
        struct fd_state *fs = &fd_states[fd];
        struct stat st;
        /* (TRACK_MODIFIED: an O_TMPFILE, no file of its own until linked and closed.) */
        if (!fs->writable || fs->track == TRACK_MODIFIED) continue;
        if (fd_quiet(fd)) { /* for good: the next boundaries skip it at no cost */
            fs->writable = 0;
            __atomic_sub_fetch(&g.writable_fds, 1, __ATOMIC_RELAXED);
            continue;
        }
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        /* TRACK_NONE: created or truncated since the last boundary, which its open record
         * already says. */
        if (fs->track == TRACK_COMPARE && fd_changed(fs, &st))
            close_emit(fd, &st, ROAR_RF_MODIFIED);
        if (fs->track == TRACK_NONE) __atomic_add_fetch(&g.tracked_fds, 1, __ATOMIC_RELAXED);
        fs->track = TRACK_COMPARE;
        fs->size = st.st_size;
        fs->mtime_ns = ts_ns(st.st_mtim);
        fs->ctime_ns = ts_ns(st.st_ctim);
    }
    LEAVE(saved);
}

static void record_task(uint16_t op) {
    if (!recording()) return;
    ENTER(saved);
    struct ev e = {.op = op};
    emit(&e);
    LEAVE(saved);
}

/* Begin a task on the calling thread.  Returns 0, or -1 if the tag is empty or too
 * long (the caller's tag is then not applied). */
EXPORT int roar_task_begin(const char *tag) {
    size_t n = cstrlen(tag);
    if (!n || n > ROAR_MAX_TAG || t_adopted) return -1;
    boundary_writes();
    spin_lock(&tags.lock);
    if (!t_has_tag) {
        tags.active++;
        t_slot = -1;
        for (int i = 0; i < TAG_SLOTS; i++)
            if (!tags.slot_used[i]) {
                tags.slot_used[i] = 1;
                t_slot = i;
                break;
            }
    }
    if (t_slot >= 0) tag_copy(&tags.slot[t_slot], tag);
    tag_copy(&t_tag, tag);
    t_has_tag = 1;
    fallback_update();
    spin_unlock(&tags.lock);
    record_task(ROAR_OP_TASK_BEGIN);
    return 0;
}

EXPORT int roar_task_end(void) {
    if (!t_has_tag || t_adopted) return -1;
    boundary_writes();
    record_task(ROAR_OP_TASK_END);
    spin_lock(&tags.lock);
    tags.active--;
    if (t_slot >= 0) tags.slot_used[t_slot] = 0;
    t_slot = -1;
    t_has_tag = 0;
    fallback_update();
    spin_unlock(&tags.lock);
    return 0;
}

/* Files in `dir` (absolute) are never lineage: see `quiet`.  0, or -1 where it is not
 * absolute, too long, or QUIET_MAX are set already.  Called once per worker, before its
 * tasks (not thread-safe against a boundary running meanwhile). */
EXPORT int roar_quiet_dir(const char *dir) {
    size_t n = cstrlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    if (!n || dir[0] != '/' || n + 2 > FD_PATH_LEN) return -1;
    for (int i = 0; i < quiet.n; i++) /* (set again: a worker's second configuration) */
        if (quiet.len[i] == n + (n > 1) && !memcmp(quiet.dir[i], dir, n)) return 0;
    if (quiet.n >= QUIET_MAX) return -1;
    memcpy(quiet.dir[quiet.n], dir, n);
    if (n > 1) quiet.dir[quiet.n][n++] = '/';
    quiet.len[quiet.n++] = (uint16_t)n;
    return 0;
}

/* ------------------------------------------------------------------ written paths */

/* Appends `len` bytes of `p` and a NUL to buf; 0, or -1 where they do not fit. */
static int put_path(char *buf, size_t cap, size_t *used, const char *p, size_t len) {
    if (cap - *used < len + 1) return -1;
    memcpy(buf + *used, p, len);
    buf[*used + len] = 0;
    *used += len + 1;
    return 0;
}

/* The paths this process may have written since `from` (roar_log_reserved() as a task
 * began), each NUL-terminated, into buf: opened to write, created or truncated, renamed or
 * linked onto, truncated, closed modified.  tracelog.written_since reads the same from the
 * log file; read here from the process's own mapping, a task's end in a process just
 * forked (Airflow's) is spared opening, copying and parsing the file in Python.  Returns
 * the bytes used; -1 where the log cannot say (events dropped, a process started, a path
 * relative to a directory not known, a record not committed yet or damaged); -2 where
 * buf is too small.  Reads only: no system call, no allocation, errno untouched. */
EXPORT long roar_written_since(uint64_t from, char *buf, size_t cap) {
    struct roar_log_header *h = g.hdr;
    size_t used = 0;
    if (!h || __atomic_load_n(&h->dropped, __ATOMIC_RELAXED)) return -1;
    uint64_t end = __atomic_load_n(&h->reserved, __ATOMIC_ACQUIRE);
    for (uint64_t off = from; off + 8 <= end;) {
        char *c = off / ROAR_CHUNK < ROAR_MAX_CHUNKS
                      ? __atomic_load_n(&g.chunks[off / ROAR_CHUNK], __ATOMIC_ACQUIRE)
                      : NULL;
        if (!c) return -1;
        struct roar_record *r = (struct roar_record *)(c + off % ROAR_CHUNK);
        if (__atomic_load_n(&r->state, __ATOMIC_ACQUIRE) != ROAR_STATE_COMMITTED) return -1;
        uint32_t size = r->size;
        if (size < 8 || size % 8 || off % ROAR_CHUNK + size > ROAR_CHUNK || off + size > end)
            return -1;
        off += size;
        if (r->op == ROAR_OP_PAD) continue;
        if (size < ROAR_RECORD_FIXED ||
            ROAR_RECORD_FIXED + (size_t)r->tag_len + r->path_len + r->path2_len + 2 > size)
            return -1;
        const char *tag = (const char *)r + ROAR_RECORD_FIXED;
        const char *path = tag + r->tag_len + 1;
        const char *path2 = path + r->path_len + 1;
        int list = r->op == ROAR_OP_EXEC || r->op == ROAR_OP_EXEC_FAIL ||
                   r->op == ROAR_OP_SPAWN || r->op == ROAR_OP_START || r->op == ROAR_OP_OBJECT;
        if (memchr(tag, 0, r->tag_len) || memchr(path, 0, r->path_len) ||
            (!list && memchr(path2, 0, r->path2_len)))
            return -1; /* damaged: a name no system call accepts */
        if (r->op == ROAR_OP_FORK || r->op == ROAR_OP_SPAWN || r->op == ROAR_OP_EXEC ||
            r->op == ROAR_OP_EXEC_FAIL || (r->rflags & ROAR_RF_DIRFD_UNKNOWN))
            return -1; /* its writes are in another log, or its path is not known */
        int rc = 0;
        if (r->op == ROAR_OP_OPEN) {
            if (writable((int)r->flags) || (r->flags & (O_CREAT | O_TRUNC)))
                rc = put_path(buf, cap, &used, path, r->path_len);
        } else if (r->op == ROAR_OP_RENAME || r->op == ROAR_OP_LINK) {
            rc = put_path(buf, cap, &used, path2, r->path2_len);
            if (!rc && r->op == ROAR_OP_RENAME && (r->flags & RENAME_EXCHANGE))
                rc = put_path(buf, cap, &used, path, r->path_len); /* each holds the other's */
        } else if (r->op == ROAR_OP_TRUNCATE ||
                   (r->op == ROAR_OP_CLOSE && (r->rflags & ROAR_RF_MODIFIED))) {
            rc = put_path(buf, cap, &used, path, r->path_len);
        }
        if (rc) return -2;
    }
    return (long)used;
}

/* The calling thread is roar's own (recording, hashing, sending lineage): from now on
 * its file operations are not recorded, so a task running meanwhile in the same process
 * (whose tag is the process fallback) is never charged with them. */
EXPORT int roar_thread_ignore(void) {
    t_busy++;
    return 0;
}

/* Undo one roar_thread_ignore: roar's work done briefly on a task's own thread (the
 * versions taken as a task ends) is ignored for that long only. */
EXPORT int roar_thread_unignore(void) {
    if (t_busy > 0) t_busy--;
    return 0;
}

/* The process's own tag, used by threads outside any task (NULL clears it). */
EXPORT int roar_process_tag(const char *tag) {
    if (tag && cstrlen(tag) > ROAR_MAX_TAG) return -1;
    spin_lock(&tags.lock);
    tags.has_base = tag && *tag;
    if (tags.has_base) tag_copy(&tags.base, tag);
    fallback_update();
    spin_unlock(&tags.lock);
    return 0;
}

/* The tag records of the calling thread get now (its own, else the process fallback),
 * copied into buf with a NUL; returns its length, 0 when there is none. */
EXPORT int roar_thread_tag(char *buf, size_t n) {
    char tag[ROAR_MAX_TAG + 1];
    uint32_t rflags = 0;
    uint16_t len = current_tag(tag, &rflags);
    if (!buf || n <= len) return len ? -1 : 0;
    memcpy(buf, tag, len);
    buf[len] = 0;
    return len;
}

/* A pool thread doing work for a task (an S3 transfer's I/O threads) records under that
 * task's tag, lent by the thread that handed the work over: no TASK_BEGIN, and the task
 * count that picks the process fallback is untouched.  NULL or "" gives the tag back. */
EXPORT int roar_thread_adopt(const char *tag) {
    size_t n = tag ? cstrlen(tag) : 0;
    if (n > ROAR_MAX_TAG || (t_has_tag && !t_adopted)) return -1;
    if (!n) {
        t_has_tag = t_adopted = 0;
        return 0;
    }
    tag_copy(&t_tag, tag);
    t_has_tag = t_adopted = 1;
    return 0;
}

/* An object-store access seen by an in-process hook (roar_core's botocore hook): uri
 * (s3://bucket/key), kind (ROAR_OBJ_*), and its fields as NUL-separated key=value
 * strings; size in bytes or -1.  Stamped with the calling thread's tag like a file. */
EXPORT int roar_object(uint32_t kind, const char *uri, const char *fields, size_t fields_len,
                       int64_t size) {
    if (!recording() || !uri) return -1;
    ENTER(saved);
    struct ev e = {.op = ROAR_OP_OBJECT, .flags = kind, .result = size};
    e.p1.s = uri;
    e.p1.slen = cstrlen(uri);
    e.p2.s = fields;
    e.p2.slen = fields ? fields_len : 0;
    emit(&e);
    LEAVE(saved);
    return 0;
}

/* Records are in the page cache as soon as they are written (readable by other
 * processes, kept after a kill); flush also makes them durable on disk. */
EXPORT int roar_flush(void) {
    int rc = 0;
    if (!g.hdr) return 0;
    for (uint32_t k = 0; k < g.nchunks; k++)
        if (g.chunks[k] && msync(g.chunks[k], ROAR_CHUNK, MS_SYNC) != 0) rc = -1;
    if (msync(g.hdr, ROAR_HEADER_SIZE, MS_SYNC) != 0) rc = -1;
    return rc;
}
