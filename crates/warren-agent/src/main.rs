//! `warren-agent`: the process at the root of every sandbox.
//!
//! In a VM it is the guest's init (see [`vm`]): it builds the root filesystem from its disks
//! and serves the same protocol over a virtio-serial port.
//!
//! It is started by the node daemon with the control socket on fd 3 and nothing else. For a
//! container it first builds the sandbox (see [`setup`]): unshares the namespaces, waits for
//! the daemon to write its id maps, forks PID 1 of the new pid namespace and builds the root
//! filesystem; then PID 1 serves calls (see [`serve`]) until the sandbox is deleted.
//!
//! The agent is non-dumpable and keeps nothing on the sandbox's filesystem: processes in the
//! sandbox cannot read its memory or fds, or forge its calls. It must never exit while the
//! sandbox lives: its exit ends the pid namespace and so the sandbox.

mod cell;
mod cells;
mod error;
mod exec;
mod files;
mod guest_net;
mod held;
mod ports;
mod reaper;
mod run;
mod serve;
mod setup;
mod spare;
mod tarball;
mod users;
mod vm;
mod warm;
mod wire;
mod zygote;

use std::os::fd::OwnedFd;
use warren_proto::{Frame, Init, InitReply, PROTOCOL_VERSION};
use wire::send_init as send;

pub use warren_proto::{CONTROL_FD, RECONNECT_FD};

/// Creates a user namespace for the daemon to map and keep (it idmaps image layers with it
/// before any sandbox exists), then waits until the daemon hangs up.
fn hold_userns(mut ctl: std::os::unix::net::UnixStream) -> ! {
    use std::io::{Read, Write};
    let code = match warren_sys::ns::unshare(warren_sys::ns::Namespaces::CLONE_NEWUSER) {
        Ok(()) => {
            let _ = ctl.write_all(b"u");
            let mut b = [0u8; 1];
            while matches!(ctl.read(&mut b), Ok(n) if n > 0) {}
            0
        }
        Err(e) => {
            let _ = ctl.write_all(format!("!{e}").as_bytes());
            1
        }
    };
    std::process::exit(code)
}

/// Mounts the sandbox's own devpts for its first terminal (`warren-agent devpts`): the daemon
/// starts it with the sandbox's user namespace on fd 4 and mount namespace on fd 5, from
/// outside the sandbox's pid namespace, so nothing in the sandbox sees or reaches it. Answers
/// `o` (mounted, or already there) or `!` and the error, then exits.
fn mount_devpts(mut ctl: std::os::unix::net::UnixStream) -> ! {
    use std::io::Write;
    let r = (|| -> error::Result<()> {
        let user = warren_sys::fd::inherited(DEVPTS_USERNS_FD)?;
        let mnt = warren_sys::fd::inherited(DEVPTS_MNTNS_FD)?;
        setup::mount_devpts_in(&user, &mnt)
    })();
    let (reply, code) = match r {
        Ok(()) => ("o".to_string(), 0),
        Err(e) => (format!("!{e}"), 1),
    };
    let _ = ctl.write_all(reply.as_bytes());
    std::process::exit(code)
}

/// Where `warren-agent devpts` finds the sandbox's namespaces.
const DEVPTS_USERNS_FD: i32 = CONTROL_FD + 1;
const DEVPTS_MNTNS_FD: i32 = CONTROL_FD + 2;

fn main() {
    // PID 1 of a whole machine: the init of a VM guest (a container's PID 1 is forked from
    // an agent that already runs, never exec'd).
    if std::process::id() == 1 {
        vm::main();
    }
    let _ = warren_sys::process::set_non_dumpable();
    // The agent answers the daemon while the sandbox's own commands may flood its CPU share:
    // a short time slice lets it run as soon as it wakes (commands get the default back).
    warren_sys::process::set_time_slice(warren_sys::process::SHORT_TIME_SLICE_NS);
    let ctl: OwnedFd = match warren_sys::fd::inherited(CONTROL_FD) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("warren-agent: {e} (this program is started by warrend)");
            std::process::exit(2);
        }
    };
    let devpts = std::env::args().nth(1).as_deref() == Some("devpts");
    let keep: &[i32] = if devpts {
        &[DEVPTS_USERNS_FD, DEVPTS_MNTNS_FD]
    } else {
        &[]
    };
    warren_sys::fd::close_fds_from(CONTROL_FD + 1, keep);
    let _ = warren_sys::fd::set_cloexec(&ctl, true);
    let mut ctl = std::os::unix::net::UnixStream::from(ctl);
    if devpts {
        mount_devpts(ctl);
    }
    if std::env::args().nth(1).as_deref() == Some("hold-userns") {
        hold_userns(ctl);
    }

    let first = match Frame::read_blocking(&mut ctl).and_then(|f| f.parse::<Init>()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("warren-agent: bad start-up message: {e}");
            std::process::exit(2);
        }
    };
    match first {
        Init::Container { version, config } => {
            if version != PROTOCOL_VERSION {
                send(
                    &mut ctl,
                    &InitReply::Failed {
                        message: format!(
                            "agent speaks protocol {PROTOCOL_VERSION}, daemon {version}"
                        ),
                    },
                );
                std::process::exit(2);
            }
            match setup::container(&mut ctl, &config) {
                Ok(()) => {}
                Err(e) => {
                    send(
                        &mut ctl,
                        &InitReply::Failed {
                            message: e.to_string(),
                        },
                    );
                    std::process::exit(1);
                }
            }
            // Only PID 1 gets here.
            send(
                &mut ctl,
                &InitReply::Ready {
                    version: PROTOCOL_VERSION,
                },
            );
            // A function container's agent builds namespaces for every call, so the filter
            // (which refuses that) goes onto each call environment instead of the agent.
            let function = config.function.is_some().then_some(&*config);
            serve::run(ctl, config.seccomp && function.is_none(), function);
        }
        other => {
            send(
                &mut ctl,
                &InitReply::Failed {
                    message: format!("unexpected start-up message {other:?}"),
                },
            );
            std::process::exit(2);
        }
    }
}
