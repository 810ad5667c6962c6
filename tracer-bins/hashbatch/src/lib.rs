//! Batch hashing of small files for `roar_core.hashing`.
//!
//! For files of a few KiB the interpreter's per-file work (objects, calls, attribute
//! lookups) costs as much as the open/read/close/stat syscalls themselves; here a whole
//! batch is one call, made with the GIL released.  One attempt per file: the caller
//! compares the stat after the read with its own before it, and redoes in Python any file
//! that changed or failed, so retries and error reporting live in one place.

use std::ffi::CStr;
use std::os::raw::c_char;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bumped whenever `HashOut`, `StatOut` or an entry point changes; the Python side checks it.
const ABI: u32 = 3;

#[repr(C)]
pub struct HashOut {
    /// 0: hashed; otherwise the step that failed: 1 open (or stat before), 2 read, 3 stat
    /// after, 4 not a regular file (before or after); `roar_hash_files_exited` only: 5
    /// changed during the read (the state after is given), 6 larger than its `max_size`.
    pub status: i32,
    pub errno: i32,
    pub nbytes: u64,
    /// CLOCK_REALTIME just before the read, to tell how settled the file's ctime was.
    pub read_at_ns: i64,
    pub dev: u64,
    pub ino: u64,
    pub size: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub hex: [u8; 64],
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn now_ns() -> i64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Reads `fd` to its end into `buf`.  The first read asks for `size + 1` bytes: a short
/// read is the end of a file that did not grow, so most files take one read.
fn read_all(fd: i32, size: usize, buf: &mut Vec<u8>) -> Result<(), i32> {
    buf.clear();
    buf.reserve(size + 1);
    loop {
        let room = buf.capacity() - buf.len();
        let got = unsafe {
            libc::read(fd, buf.as_mut_ptr().add(buf.len()) as *mut libc::c_void, room)
        };
        if got < 0 {
            match errno() {
                libc::EINTR => continue,
                e => return Err(e),
            }
        }
        if got == 0 {
            return Ok(());
        }
        unsafe { buf.set_len(buf.len() + got as usize) };
        if buf.len() <= size {
            return Ok(());
        }
        if buf.len() == buf.capacity() {
            buf.reserve(buf.len());
        }
    }
}

fn state_of(st: &libc::stat64, out: &mut HashOut) {
    out.dev = st.st_dev;
    out.ino = st.st_ino;
    out.size = st.st_size;
    out.mtime_ns = st.st_mtime * 1_000_000_000 + st.st_mtime_nsec;
    out.ctime_ns = st.st_ctime * 1_000_000_000 + st.st_ctime_nsec;
}

/// The path's stat where it is a regular file (the path, not an fd: a rename over it shows
/// as another inode); else `out` says why: `failed` where the stat failed, 4 where it is
/// not a regular file.
fn regular_stat(path: &CStr, failed: i32, out: &mut HashOut) -> Option<libc::stat64> {
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    if unsafe { libc::stat64(path.as_ptr(), &mut st) } != 0 {
        out.status = failed;
        out.errno = errno();
        return None;
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        out.status = 4;
        return None;
    }
    Some(st)
}

/// What a write or a replacement changes: the fields of the caller's `FileState`.
fn state_key(st: &libc::stat64) -> (u64, u64, i64, i64, i64, i64, i64) {
    (st.st_dev, st.st_ino, st.st_size, st.st_mtime, st.st_mtime_nsec, st.st_ctime,
     st.st_ctime_nsec)
}

/// `before`: where the caller has no stat of the file, the largest size to read; the path
/// is stat'ed here before it is opened (a FIFO or a device is never opened) and its stat
/// after the read must agree.
fn hash_one(path: &CStr, size: usize, before: Option<i64>, buf: &mut Vec<u8>,
            out: &mut HashOut) {
    let mut size = size;
    let first = match before {
        None => None,
        Some(max_size) => {
            let Some(st) = regular_stat(path, 1, out) else { return };
            if st.st_size > max_size {
                out.status = 6;
                return;
            }
            size = st.st_size as usize;
            Some(st)
        }
    };
    // O_NONBLOCK: should a FIFO replace the file since the caller's stat, open must not hang.
    let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK;
    let fd = unsafe { libc::open(path.as_ptr(), flags) };
    if fd < 0 {
        out.status = 1;
        out.errno = errno();
        return;
    }
    out.read_at_ns = now_ns();
    let read = read_all(fd, size, buf);
    unsafe { libc::close(fd) };
    if let Err(e) = read {
        out.status = 2;
        out.errno = e;
        return;
    }
    out.nbytes = buf.len() as u64;
    out.hex.copy_from_slice(blake3::hash(buf).to_hex().as_bytes());
    let Some(st) = regular_stat(path, 3, out) else { return };
    state_of(&st, out);
    if let Some(first) = first {
        if state_key(&first) != state_key(&st) || out.nbytes != st.st_size as u64 {
            out.status = 5;
        }
    }
}

/// The loop of both entry points: `what(i)` is file i's (size, before) for `hash_one`.
///
/// # Safety
/// `paths` holds `n` NUL-terminated strings back to back; `out` has `n` entries.
unsafe fn hash_each(paths: *const c_char, n: usize, out: *mut HashOut,
                    what: impl Fn(usize) -> (usize, Option<i64>)) {
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut p = paths;
    for i in 0..n {
        let path = CStr::from_ptr(p);
        p = p.add(path.to_bytes().len() + 1);
        let o = &mut *out.add(i);
        o.status = 0;
        o.errno = 0;
        let (size, before) = what(i);
        hash_one(path, size, before, &mut buf, o);
        if buf.capacity() > 1 << 20 {
            buf = Vec::with_capacity(64 * 1024); // one file that grew: do not keep its buffer
        }
    }
}

/// Hashes `n` files: their NUL-terminated paths follow one another in `paths`, `sizes`
/// holds each one's size as last stat'ed, and one `HashOut` per file goes to `out`.
///
/// # Safety
/// `paths` holds `n` NUL-terminated strings back to back; `sizes` and `out` have `n` entries.
#[no_mangle]
pub unsafe extern "C" fn roar_hash_files(
    paths: *const c_char,
    sizes: *const i64,
    n: usize,
    out: *mut HashOut,
) {
    hash_each(paths, n, out, |i| ((*sizes.add(i)).max(0) as usize, None));
}

/// Hashes `n` files as `roar_hash_files` does, for a caller that has not stat'ed them
/// (files whose writers have exited, hashed beside a thread busy in Python, where a stat
/// per file in Python would wait for that thread each time): each path is stat'ed before
/// it is opened, and a file whose stat after the read differs is status 5.  Files of more
/// than `max_size` bytes are status 6, not read.
///
/// # Safety
/// `paths` holds `n` NUL-terminated strings back to back; `out` has `n` entries.
#[no_mangle]
pub unsafe extern "C" fn roar_hash_files_exited(
    paths: *const c_char,
    n: usize,
    max_size: i64,
    out: *mut HashOut,
) {
    hash_each(paths, n, out, |_| (0, Some(max_size)));
}

/// One path's lstat for `roar_lstat_files`: `errno` 0 where it succeeded.
#[repr(C)]
pub struct StatOut {
    pub errno: i32,
    pub mode: u32,
    pub dev: u64,
    pub ino: u64,
    pub size: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

fn lstat_one(path: &CStr, o: &mut StatOut) {
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    if unsafe { libc::lstat64(path.as_ptr(), &mut st) } != 0 {
        *o = StatOut { errno: errno(), mode: 0, dev: 0, ino: 0, size: 0, mtime_ns: 0,
                       ctime_ns: 0 };
        return;
    }
    *o = StatOut {
        errno: 0,
        mode: st.st_mode,
        dev: st.st_dev,
        ino: st.st_ino,
        size: st.st_size,
        mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
        ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
    };
}

/// Paths per thread below which `roar_lstat_files` stays on the caller's thread.
const LSTAT_PER_THREAD: usize = 1024;
/// Paths a thread takes at a time from those left.
const LSTAT_BLOCK: usize = 64;

/// lstat of `n` paths (NUL-terminated, back to back), one `StatOut` each: a task's end
/// looks at every file it touched, and from Python each look cost an object with twenty
/// fields beside the syscall.  Many paths are shared by up to 4 threads, the caller's one
/// of them.
///
/// # Safety
/// `paths` holds `n` NUL-terminated strings back to back; `out` has `n` entries.
#[no_mangle]
pub unsafe extern "C" fn roar_lstat_files(paths: *const c_char, n: usize, out: *mut StatOut) {
    let mut names = Vec::with_capacity(n);
    let mut p = paths;
    for _ in 0..n {
        let path = CStr::from_ptr(p);
        p = p.add(path.to_bytes().len() + 1);
        names.push(path);
    }
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get()).min(4);
    let threads = (n / LSTAT_PER_THREAD).clamp(1, cpus);
    let next = AtomicUsize::new(0);
    let out_at = out as usize; // each entry is written by the one thread that took its block
    let work = || loop {
        let start = next.fetch_add(LSTAT_BLOCK, Ordering::Relaxed);
        if start >= n {
            break;
        }
        for (i, path) in names.iter().enumerate().take(n.min(start + LSTAT_BLOCK)).skip(start) {
            lstat_one(path, &mut *(out_at as *mut StatOut).add(i));
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            // A thread that cannot be made (a pids limit) is no error, and never a panic,
            // which would abort the caller (`roar-core run` must exit with its command's
            // code): the threads made, the caller's included, take every block.
            if std::thread::Builder::new().spawn_scoped(scope, &work).is_err() {
                break;
            }
        }
        work();
    });
}

#[no_mangle]
pub extern "C" fn roar_hashbatch_abi() -> u32 {
    ABI
}
