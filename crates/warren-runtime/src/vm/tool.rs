//! Running host tools (qemu-img, mkfs.ext4, cp, ldd, strip) from the daemon.
//!
//! The daemon's reaper thread collects every child, so `std::process::Command::output()`
//! would race it for the exit status: tools are started through [`crate::reaper::spawn_wait`]
//! with their output in temporary files.

use std::os::fd::AsRawFd;
use std::path::Path;

use crate::reaper::{spawn_wait, ChildExit};
use crate::RuntimeError;

fn seq() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Runs `program args...`; returns its stdout, or an error with its stderr.
pub async fn run(program: &Path, args: &[String]) -> Result<String, RuntimeError> {
    let tmp = std::env::temp_dir();
    let n = seq();
    let out_path = tmp.join(format!("warren-tool-{}-{n}.out", std::process::id()));
    let err_path = tmp.join(format!("warren-tool-{}-{n}.err", std::process::id()));
    let result = async {
        let out = std::fs::File::create(&out_path)
            .map_err(|e| RuntimeError::io(format!("create {}", out_path.display()), e))?;
        let err = std::fs::File::create(&err_path)
            .map_err(|e| RuntimeError::io(format!("create {}", err_path.display()), e))?;
        let devnull =
            std::fs::File::open("/dev/null").map_err(|e| RuntimeError::io("open /dev/null", e))?;
        let prog = program.display().to_string();
        let mut argv = vec![prog.clone()];
        argv.extend_from_slice(args);
        let (_, done) = spawn_wait(
            &prog,
            &argv,
            &["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()],
            &[
                (devnull.as_raw_fd(), 0),
                (out.as_raw_fd(), 1),
                (err.as_raw_fd(), 2),
            ],
        )?;
        drop((out, err, devnull));
        let exit = done.await.unwrap_or(ChildExit::Signal(libc::SIGKILL));
        let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
        if exit.success() {
            Ok(stdout)
        } else {
            let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
            Err(RuntimeError::Vmm(crate::VmmError::Tool {
                program: program.to_path_buf(),
                exit: format!("{exit:?}"),
                stderr: stderr.trim().to_string(),
            }))
        }
    }
    .await;
    let _ = std::fs::remove_file(&out_path);
    let _ = std::fs::remove_file(&err_path);
    result
}

/// [`run`] with string arguments.
pub async fn run_str(program: &str, args: &[&str]) -> Result<String, RuntimeError> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    run(Path::new(program), &args).await
}
