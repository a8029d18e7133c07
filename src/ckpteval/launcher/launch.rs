//! A sandboxed command's start, natively: what `ckpteval.sandbox_driver.spawn._child` does in a
//! forked copy of the driver, done by a small static program that the driver spawns (vfork and
//! exec: no copy of the driver's memory, no Python run before the command's exec). The driver
//! uses it for plain programs as root (no Python file, no result channel, not rootless); the
//! steps and their order are `_child`'s, and tests/test_sandbox_launcher.py compares what a
//! command sees on both paths. The driver has already given it a new session, the command's
//! stdin, stdout and stderr, and default SIGINT, SIGPIPE and SIGXFSZ (posix_spawn).
//!
//! argv: launch REPORT FILTER_HEX CWD UID STAGE
//!              NROOTS (ROOT OPTIONS NPATHS PATH...)...  NSETTINGS (PATH TEXT)...
//!              NRLIMITS (RESOURCE SOFT HARD)...  -- PROGRAM ARG...
//! REPORT: where a failure of the isolation is written (then exit 127, as `_child`);
//! FILTER_HEX: the seccomp filter's instructions (`_kernel_state_filter`), in hex;
//! STAGE and the roots: `isolation._STAGE` and `_covers` (each root covered by a fresh tmpfs
//! with those options, showing only its paths); the settings: `isolation._ipc_settings`.
//! What the isolation is (which paths, sizes, limits) is the driver's, passed in: this program
//! only carries it out.

use std::ffi::{CString, OsStr};
use std::io::Write;
use std::os::raw::{c_char, c_int, c_long, c_ulong, c_void};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};

extern "C" {
    fn unshare(flags: c_int) -> c_int;
    fn mount(
        source: *const c_char,
        target: *const c_char,
        fstype: *const c_char,
        flags: c_ulong,
        data: *const c_void,
    ) -> c_int;
    fn prctl(option: c_int, arg2: c_ulong, arg3: c_ulong, arg4: c_ulong, arg5: c_ulong) -> c_int;
    fn setrlimit(resource: c_int, rlim: *const [u64; 2]) -> c_int;
    fn setgroups(size: usize, list: *const u32) -> c_int;
    fn setresgid(rgid: u32, egid: u32, sgid: u32) -> c_int;
    fn setresuid(ruid: u32, euid: u32, suid: u32) -> c_int;
    fn chdir(path: *const c_char) -> c_int;
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char)
        -> c_int;
    fn syscall(number: c_long, ...) -> c_long;
    fn close(fd: c_int) -> c_int;
    static environ: *const *const c_char;
}

const CLONE_NEWNS: c_int = 0x0002_0000;
const CLONE_NEWIPC: c_int = 0x0800_0000;
const MS_NOSUID: c_ulong = 2;
const MS_NODEV: c_ulong = 4;
const MS_BIND: c_ulong = 4096;
const MS_MOVE: c_ulong = 8192;
const MS_REC: c_ulong = 16384;
const MS_PRIVATE: c_ulong = 1 << 18;
const PR_SET_NO_NEW_PRIVS: c_int = 38;
const PR_SET_SECCOMP: c_int = 22;
const SECCOMP_MODE_FILTER: c_ulong = 2;
const SYS_RT_SIGACTION: c_long = 13;
const SYS_CLOSE_RANGE: c_long = 436;

#[repr(C)]
struct SockFprog {
    len: u16,
    filter: *const u8,
}

fn c(text: &str) -> CString {
    CString::new(text).unwrap_or_else(|_| fail_usage("a NUL byte in an argument"))
}

fn fail_usage(what: &str) -> ! {
    let _ = writeln!(std::io::stderr(), "ckpteval-launch: {what}");
    std::process::exit(127)
}

/// Python's words for a failed call: `[Errno N] what: reason`, as `OSError(errno, what)`.
fn failed(err: &std::io::Error, what: &str) -> String {
    format!(
        "[Errno {}] {what}: {}",
        err.raw_os_error().unwrap_or(0),
        strerror(err)
    )
}

/// ... and for a failed call on a file: `[Errno N] reason: 'name'` (`name` as Python shows it).
fn failed_on(err: &std::io::Error, name: &str) -> String {
    format!(
        "[Errno {}] {}: {name}",
        err.raw_os_error().unwrap_or(0),
        strerror(err)
    )
}

fn strerror(err: &std::io::Error) -> String {
    // "Operation not permitted (os error 1)" -> "Operation not permitted", as Python says it
    let text = err.to_string();
    match text.rfind(" (os error") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
}

fn check(result: c_int, what: &str) -> Result<(), String> {
    if result == 0 {
        Ok(())
    } else {
        Err(failed(&std::io::Error::last_os_error(), what))
    }
}

fn do_mount(
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: c_ulong,
    data: Option<&str>,
) -> Result<(), String> {
    let (source, target) = (source.map(c), c(target));
    let (fstype, data) = (fstype.map(c), data.map(c));
    let ptr = |v: &Option<CString>| v.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    let result = unsafe {
        mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data) as *const c_void,
        )
    };
    check(result, &format!("mount {}", target.to_string_lossy()))
}

fn write_small(path: &str, text: &str) -> Result<(), String> {
    let io = |e: std::io::Error| failed_on(&e, &format!("'{path}'"));
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io)?;
    file.write_all(text.as_bytes()).map_err(io)
}

/// `isolation._cover`: a fresh tmpfs over `root` showing only `paths` of what was there, built
/// on `stage`.
fn cover(stage: &str, root: &str, paths: &[String], options: &str) -> Result<(), String> {
    let tmpfs = Some("tmpfs");
    do_mount(tmpfs, stage, tmpfs, MS_NOSUID | MS_NODEV, Some(options))?;
    for path in paths {
        let staged = format!("{stage}{}", &path[root.len()..]);
        let io = |e: std::io::Error| failed_on(&e, &format!("'{staged}'"));
        let is_dir = std::path::Path::new(path).is_dir();
        let dir = if is_dir {
            std::path::Path::new(&staged)
        } else {
            std::path::Path::new(&staged)
                .parent()
                .unwrap_or(std::path::Path::new(stage))
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(io)?;
        if !is_dir {
            let mut file = std::fs::OpenOptions::new();
            file.create(true)
                .write(true)
                .mode(0o600)
                .open(&staged)
                .map_err(io)?;
        }
        do_mount(Some(path), &staged, None, MS_BIND | MS_REC, None)?;
    }
    do_mount(Some(stage), root, None, MS_MOVE, None)
}

fn hex(text: &str) -> Vec<u8> {
    let digit = |b: u8| match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => fail_usage("the filter is not lowercase hex"),
    };
    text.as_bytes()
        .chunks(2)
        .map(|p| digit(p[0]) << 4 | digit(p[1]))
        .collect()
}

struct Plan {
    report: String,
    filter: Vec<u8>,
    cwd: String,
    uid: u32,
    stage: String,
    covers: Vec<(String, String, Vec<String>)>,
    settings: Vec<(String, String)>,
    rlimits: Vec<(c_int, u64, u64)>,
    argv: Vec<CString>,
}

fn plan() -> Plan {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| {
            a.into_string()
                .unwrap_or_else(|_| fail_usage("an argument is not UTF-8"))
        })
        .collect();
    let mut it = args.into_iter();
    let mut next = || it.next().unwrap_or_else(|| fail_usage("too few arguments"));
    // a number; -1 is RLIM_INFINITY, as Python's `resource.setrlimit` takes it
    let num = |s: String| {
        s.parse::<i64>()
            .unwrap_or_else(|_| fail_usage("a number expected")) as u64
    };
    let (report, filter, cwd) = (next(), hex(&next()), next());
    let (uid, stage) = (num(next()) as u32, next());
    let covers = (0..num(next()))
        .map(|_| {
            let (root, options) = (next(), next());
            let paths = (0..num(next())).map(|_| next()).collect();
            (root, options, paths)
        })
        .collect();
    let settings = (0..num(next())).map(|_| (next(), next())).collect();
    let rlimits = (0..num(next()))
        .map(|_| (num(next()) as c_int, num(next()), num(next())))
        .collect();
    if next() != "--" {
        fail_usage("-- expected before the program");
    }
    let argv: Vec<CString> = std::iter::from_fn(|| it.next()).map(|a| c(&a)).collect();
    if argv.is_empty() {
        fail_usage("no program");
    }
    Plan {
        report,
        filter,
        cwd,
        uid,
        stage,
        covers,
        settings,
        rlimits,
        argv,
    }
}

/// `_oom_first`, `_isolate`, `no_new_privs` and `_refuse_kernel_state`, in `_child`'s order.
fn isolate(plan: &Plan) -> Result<(), String> {
    let _ = write_small("/proc/self/oom_score_adj", "1000\n"); // as `_oom_first`: best effort
    check(
        unsafe { unshare(CLONE_NEWNS | CLONE_NEWIPC) },
        "unshare(CLONE_NEWNS | CLONE_NEWIPC)",
    )?;
    do_mount(None, "/", None, MS_REC | MS_PRIVATE, None)?;
    for (root, options, paths) in &plan.covers {
        cover(&plan.stage, root, paths, options)?;
    }
    for (path, text) in &plan.settings {
        write_small(path, text)?; // `_limit_ipc`
    }
    check(
        unsafe { prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) },
        "prctl(PR_SET_NO_NEW_PRIVS)",
    )?;
    let fprog = SockFprog {
        len: (plan.filter.len() / 8) as u16,
        filter: plan.filter.as_ptr(),
    };
    let result = unsafe {
        prctl(
            PR_SET_SECCOMP,
            SECCOMP_MODE_FILTER,
            &fprog as *const SockFprog as c_ulong,
            0,
            0,
        )
    };
    check(result, "prctl(PR_SET_SECCOMP)")
}

/// Every signal's action the default, as in a forked child (the driver gives back at its start
/// every signal its caller ignored, and ignores none but SIGINT, SIGPIPE and SIGXFSZ, which
/// `_child` resets): an ignored signal survives exec, and here glibc's posix_spawn ignored its
/// two internal ones and Rust's start-up SIGPIPE. The raw system call: glibc's `sigaction`
/// refuses its internal signals.
fn default_signals() {
    let action = [0u64; 4]; // handler SIG_DFL, no flags, no restorer, an empty mask
    for signum in 1..=64 {
        if signum != 9 && signum != 19 {
            unsafe {
                syscall(
                    SYS_RT_SIGACTION,
                    signum as c_long,
                    action.as_ptr(),
                    std::ptr::null::<u64>(),
                    8 as c_long,
                )
            };
        }
    }
}

/// The rest of `_child`: directory, rlimits, no groups, the sandbox uid, exec. An error here is
/// the program's (a shell's 127 with `sandbox: cannot run ...` on its stderr), as in `_child`.
fn become_program(plan: &Plan) -> Result<std::convert::Infallible, String> {
    check(
        unsafe { chdir(c(&plan.cwd).as_ptr()) },
        &format!("chdir '{}'", plan.cwd),
    )?;
    for &(resource, soft, hard) in &plan.rlimits {
        check(unsafe { setrlimit(resource, &[soft, hard]) }, "setrlimit")?;
    }
    let uid = plan.uid;
    check(unsafe { setgroups(0, std::ptr::null()) }, "setgroups")?;
    check(unsafe { setresgid(uid, uid, uid) }, "setresgid")?;
    check(unsafe { setresuid(uid, uid, uid) }, "setresuid")?;
    default_signals();
    let argv: Vec<*const c_char> = plan
        .argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let program = plan.argv[0].as_bytes();
    // os.execvpe: a name with a slash as it is, else each directory of the command's PATH
    // (os.defpath without one); the first error other than "not found" is raised, else the last
    let searched = !program.contains(&b'/');
    let candidates: Vec<Vec<u8>> = if !searched {
        vec![program.to_vec()]
    } else {
        let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
        path.as_bytes()
            .split(|&b| b == b':')
            .map(|dir| {
                if dir.is_empty() {
                    program.to_vec()
                } else {
                    [dir, b"/", program].concat()
                }
            })
            .collect()
    };
    let (mut saved, mut last) = (None, None);
    for full in candidates {
        let name = if searched {
            bytes_repr(&full)
        } else {
            str_repr(&full)
        };
        let full = CString::new(full).unwrap_or_else(|_| fail_usage("a NUL byte in PATH"));
        unsafe { execve(full.as_ptr(), argv.as_ptr(), environ) };
        let err = std::io::Error::last_os_error();
        let missing = matches!(err.raw_os_error(), Some(2) | Some(20)); // ENOENT, ENOTDIR
        if !missing && saved.is_none() {
            saved = Some((err, name));
        } else {
            last = Some((err, name));
        }
    }
    let (err, name) = saved
        .or(last)
        .unwrap_or_else(|| fail_usage("nothing to execute"));
    Err(failed_on(&err, &name))
}

/// Python's repr of a path: `'name'`, or `b'name'` for one os.execvpe found on PATH (it searches
/// with bytes).
fn str_repr(text: &[u8]) -> String {
    format!("'{}'", OsStr::from_bytes(text).to_string_lossy())
}

fn bytes_repr(text: &[u8]) -> String {
    let quote = if text.contains(&b'\'') && !text.contains(&b'"') {
        b'"'
    } else {
        b'\''
    };
    let mut out = String::from("b");
    out.push(quote as char);
    for &b in text {
        match b {
            b'\\' => out.push_str("\\\\"),
            b'\t' => out.push_str("\\t"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            _ if b == quote => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => out.push_str(&format!("\\x{b:02x}")),
        }
    }
    out.push(quote as char);
    out
}

fn main() {
    // every descriptor from 3 up, as `_keep_fds` (the driver's are close-on-exec besides)
    if unsafe {
        syscall(
            SYS_CLOSE_RANGE,
            3 as c_ulong,
            !0u32 as c_ulong,
            0 as c_ulong,
        )
    } != 0
    {
        for fd in 3..65536 {
            unsafe { close(fd) };
        }
    }
    let plan = plan();
    if let Err(message) = isolate(&plan) {
        // the sandbox's failure, not the program's: say so to the driver (`_isolation_report`)
        if let Ok(mut file) = std::fs::File::create(&plan.report) {
            let _ = writeln!(file, "{message}");
        }
        std::process::exit(127);
    }
    let Err(message) = become_program(&plan);
    let name = plan.argv[0].to_string_lossy();
    let _ = writeln!(std::io::stderr(), "sandbox: cannot run {name}: {message}");
    std::process::exit(127);
}
