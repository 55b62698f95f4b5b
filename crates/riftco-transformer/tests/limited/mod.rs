//! Runs a test body in a child process under a memory limit and a timeout.
//!
//! `limited("name", || body)` re-executes the test binary with `--exact name` and the
//! environment variable `RIFTCO_LIMITED_CHILD=name`; the child sets `RLIMIT_AS` to
//! [`MEMORY_LIMIT_BYTES`] before it runs (`pre_exec`), runs the body, and the parent fails when
//! the child fails, is killed by a signal (an abort, the kernel) or runs past
//! [`TIMEOUT_S`] (it is then killed). A body that would allocate without bound or block
//! therefore fails the test instead of taking the machine down or hanging the run.
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Address-space limit of the child, in bytes.
pub const MEMORY_LIMIT_BYTES: u64 = 4_000_000_000;
/// Wall-clock limit of the child, in seconds.
pub const TIMEOUT_S: u64 = 120;

const CHILD_ENV: &str = "RIFTCO_LIMITED_CHILD";

pub fn limited(name: &str, body: impl FnOnce()) {
    if std::env::var(CHILD_ENV).as_deref() == Ok(name) {
        body();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                let lim = libc::rlimit {
                    rlim_cur: MEMORY_LIMIT_BYTES as libc::rlim_t,
                    rlim_max: MEMORY_LIMIT_BYTES as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(TIMEOUT_S) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{name}: the child ran past {TIMEOUT_S} s and was killed\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.success(),
        "{name}: the child under a {MEMORY_LIMIT_BYTES}-byte address-space limit failed \
         ({status})\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What the child reported (its stderr), for the parent's --no-capture output.
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    // The child must have run the test (not filtered it out).
    assert!(
        stdout.contains("1 passed"),
        "{name}: the child did not run the test\n{stdout}"
    );
}
