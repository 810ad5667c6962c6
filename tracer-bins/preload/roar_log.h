/*
 * roar trace log format, version 1.  This header is the single description of the
 * format: the shim writes it, roar_core/tracelog.py reads it, and
 * tests/tracer/test_format.py checks the two agree (sizes, offsets, op codes).
 *
 * One log per process image: $ROAR_SESSION_DIR/roar-<pid>-<mono_ns>.log.  A process
 * that execs gets a new log (the new image loads the shim again); a forked child
 * gets a new log on its first record.
 *
 * The file is a 4 KiB header followed by chunks of ROAR_CHUNK bytes, each mapped
 * MAP_SHARED on its own so that growing the log never moves memory another thread
 * is writing to, and so that records written before a SIGKILL are in the page cache
 * and readable afterwards.  Records never span a chunk; the space left at the end
 * of a chunk is filled with a ROAR_OP_PAD record.
 *
 * Writers reserve space with a CAS on hdr.reserved (lock-free, no thread ever waits
 * on another to record), write the first 8 bytes {size, op, state=RESERVED}, fill
 * the record, and finally store state=COMMITTED with release order.  A reader
 * therefore sees, for each reservation, one of:
 *   - state == COMMITTED: a whole record;
 *   - state == RESERVED: a torn record (the process died while writing it): skipped,
 *     counted as dropped;
 *   - all zero: the writer died between reserving and writing the first word; the
 *     reader scans forward 8 bytes at a time for the next committed record.
 * hdr.reserved says where the reserved space ends, even after a SIGKILL.
 *
 * All integers are little-endian (native; the shim is built per platform).
 */
#ifndef ROAR_LOG_H
#define ROAR_LOG_H

#include <stdint.h>

#define ROAR_LOG_MAGIC "ROARLOG\0"
#define ROAR_LOG_VERSION 1u
#define ROAR_HEADER_SIZE 4096u
#define ROAR_CHUNK (256u * 1024u)
#define ROAR_MAX_CHUNKS 65536u

/* Process origin (hdr.origin). */
#define ROAR_ORIGIN_EXEC 1u /* the shim was loaded at program start */
#define ROAR_ORIGIN_FORK 2u /* a child of fork() in a traced process */

struct roar_log_header {
    char magic[8];           /*   0: ROAR_LOG_MAGIC */
    uint32_t version;        /*   8: ROAR_LOG_VERSION */
    uint32_t header_size;    /*  12: ROAR_HEADER_SIZE */
    uint32_t chunk_size;     /*  16: ROAR_CHUNK */
    uint32_t origin;         /*  20: ROAR_ORIGIN_* */
    uint32_t pid;            /*  24 */
    uint32_t ppid;           /*  28 */
    uint64_t start_mono_ns;  /*  32: CLOCK_MONOTONIC at log creation */
    uint64_t start_wall_ns;  /*  40: CLOCK_REALTIME at log creation */
    uint64_t reserved;       /*  48: bytes reserved after the header (atomic) */
    uint64_t dropped;        /*  56: records the shim could not write (atomic) */
    uint32_t flags;          /*  64: ROAR_HDR_* */
    uint32_t _pad;           /*  68 */
    /* 72..4095: zero. */
};

#define ROAR_HDR_DISABLED 1u /* ROAR_TRACER_OFF was set: the log stays empty */

/* Record state (second half of the first 8 bytes). */
#define ROAR_STATE_RESERVED 0x5253u /* "SR" */
#define ROAR_STATE_COMMITTED 0x4D43u /* "CM" */

/*
 * Fixed part of every record, 112 bytes, followed by the variable part:
 *   tag[tag_len] NUL, path[path_len] NUL, path2[path2_len] NUL
 * padded to a multiple of 8.  Lengths exclude the NUL.  For exec/spawn/start
 * records path2 holds argv as NUL-separated strings (cut at ROAR_MAX_ARGV bytes,
 * ROAR_RF_ARGV_TRUNC).  Paths are made absolute at record time: relative paths are
 * joined to the cached cwd or to the dirfd's path; they are not normalised and
 * symlinks are not resolved (the reader does that).
 */
struct roar_record {
    uint32_t size;        /*   0: whole record in bytes, multiple of 8 */
    uint16_t op;          /*   4: ROAR_OP_* */
    uint16_t state;       /*   6: ROAR_STATE_* */
    uint32_t pid;         /*   8 */
    uint32_t ppid;        /*  12 */
    uint32_t tid;         /*  16 */
    int32_t err;          /*  20: errno when the call failed, else 0 */
    int64_t result;       /*  24: return value (fd, 0, -1, child pid) */
    uint32_t flags;       /*  32: open flags, rename/at flags */
    uint32_t mode;        /*  36: creation mode */
    int32_t fd;           /*  40: fd the op acted on (close, dup: old fd) */
    uint32_t rflags;      /*  44: ROAR_RF_* */
    uint64_t mono_ns;     /*  48: CLOCK_MONOTONIC */
    uint64_t wall_ns;     /*  56: CLOCK_REALTIME, derived: start_wall_ns + (mono_ns - start_mono_ns) */
    uint64_t st_dev;      /*  64: stat fields, valid with ROAR_RF_STAT */
    uint64_t st_ino;      /*  72 */
    uint64_t st_size;     /*  80 */
    int64_t st_mtime_ns;  /*  88 */
    int64_t st_ctime_ns;  /*  96 */
    uint16_t tag_len;     /* 104 */
    uint16_t path_len;    /* 106 */
    uint16_t path2_len;   /* 108 */
    uint16_t _pad;        /* 110 */
};

#define ROAR_RECORD_FIXED 112u

/* Operations. */
#define ROAR_OP_PAD 0u        /* filler up to a chunk boundary; skip */
#define ROAR_OP_OPEN 1u       /* open/open64/openat/creat/fopen/freopen and __*_2 */
#define ROAR_OP_CLOSE 2u      /* close/fclose of an fd opened writable; stat = at close */
#define ROAR_OP_RENAME 3u     /* path -> path2 */
#define ROAR_OP_LINK 4u       /* hard link path -> path2 (path2 is the new name) */
#define ROAR_OP_SYMLINK 5u    /* path2 is the new link, path its target text */
#define ROAR_OP_UNLINK 6u     /* unlink/unlinkat/remove of a non-directory */
#define ROAR_OP_TRUNCATE 7u   /* truncate(path) */
#define ROAR_OP_MKDIR 8u
#define ROAR_OP_RMDIR 9u      /* rmdir, unlinkat(AT_REMOVEDIR) */
#define ROAR_OP_EXEC 10u      /* before any exec call: path = program, path2 = argv */
#define ROAR_OP_EXEC_FAIL 11u /* exec returned: err says why */
#define ROAR_OP_SPAWN 12u     /* posix_spawn[p]: result = child pid or -1 */
#define ROAR_OP_FORK 13u      /* fork/vfork in the parent: result = child pid */
#define ROAR_OP_CHDIR 14u     /* chdir/fchdir: path = new cwd */
#define ROAR_OP_TASK_BEGIN 15u /* tag = the task now active on this thread */
#define ROAR_OP_TASK_END 16u
#define ROAR_OP_START 17u     /* first record of a log: path = executable, path2 = argv */
#define ROAR_OP_EXIT 18u      /* process exiting normally (destructor); absent after a kill */
#define ROAR_OP_DUP 19u       /* fd -> result */
#define ROAR_OP_OBJECT 20u    /* object-store access (roar_object): path = URI, path2 = NUL-
                               * separated key=value fields, flags = ROAR_OBJ_*, result =
                               * size or -1 */
#define ROAR_OP_MAX 20u

/* Object access kinds (flags of ROAR_OP_OBJECT). */
#define ROAR_OBJ_READ 1u   /* a GET (whole or ranged) */
#define ROAR_OBJ_WRITE 2u  /* a PUT, a completed multipart upload, a copy's target */
#define ROAR_OBJ_DELETE 3u
#define ROAR_OBJ_DIGEST 4u /* the blake3 of a body read earlier, once it was read whole */
#define ROAR_OBJ_UNSEEN 5u /* S3 I/O the hook cannot see: path = the client's name */

/* Record flags. */
#define ROAR_RF_STAT 0x1u          /* st_* fields are valid (a read-only open of a regular file: its state as opened) */
#define ROAR_RF_EXISTED 0x2u       /* open for writing: the path existed before (stat = its state then) */
#define ROAR_RF_MODIFIED 0x4u      /* close: created, truncated, or size/mtime/ctime differ from open */
#define ROAR_RF_UNTRACEABLE 0x8u   /* exec/spawn of a static or setuid binary */
#define ROAR_RF_SETUID 0x10u       /* ... because it is setuid/setgid */
#define ROAR_RF_PATH_TRUNC 0x20u   /* a path did not fit and was cut */
#define ROAR_RF_ARGV_TRUNC 0x40u   /* argv did not fit and was cut */
#define ROAR_RF_TAG_INHERITED 0x80u /* tag came from the process fallback/inheritance */
#define ROAR_RF_FOPEN 0x100u       /* made by fopen/freopen (flags derived from mode) */
#define ROAR_RF_DIRFD_UNKNOWN 0x200u /* relative to a dirfd whose path was unknown */

#define ROAR_MAX_TAG 255u
#define ROAR_MAX_PATH 8192u
#define ROAR_MAX_ARGV 4096u

#endif
