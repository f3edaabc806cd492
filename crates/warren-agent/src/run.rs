//! What every command run reports, whatever drives its I/O: the foreground exec and the
//! terminal (async, in the agent) and a function call (blocking, in its call environment)
//! all account output, its cap, the timeout and the exit through one [`Run`].

use std::time::{Duration, Instant};
use warren_proto::{Event, Frame, Kind};

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

/// Counts output and keeps the first `cap` bytes.
#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct Pump {
    cap: u64,
    kept: u64,
    total: u64,
}

impl Pump {
    pub fn new(cap: u64) -> Self {
        Pump {
            cap,
            kept: 0,
            total: 0,
        }
    }
    /// The part of `n` new bytes to keep.
    pub fn take(&mut self, n: usize) -> usize {
        let keep = (self.cap - self.kept).min(n as u64);
        self.kept += keep;
        self.total += n as u64;
        keep as usize
    }
    /// The part of `n` new bytes to keep when at most `room` more may be kept anywhere; the
    /// rest is counted as dropped.
    pub fn take_within(&mut self, n: usize, room: u64) -> usize {
        let keep = (self.cap - self.kept).min(n as u64).min(room);
        self.kept += keep;
        self.total += n as u64;
        keep as usize
    }
    pub fn full(&self) -> bool {
        self.kept >= self.cap
    }
    pub fn total(&self) -> u64 {
        self.total
    }
    pub fn truncated(&self) -> bool {
        self.total > self.kept
    }
}

/// The final event of a command: how it ended and what its output amounted to. A command
/// whose end was never seen is reported as killed.
pub(crate) fn exit_event(
    exit: Option<Exit>,
    timed_out: bool,
    stdout: &Pump,
    stderr: &Pump,
    duration: Duration,
) -> Event {
    let (exit_code, signal) = match exit {
        Some(Exit::Code(c)) => (Some(c), None),
        Some(Exit::Signal(s)) => (None, Some(s)),
        None => (None, Some(libc::SIGKILL)),
    };
    Event::Exited(warren_types::ExitInfo {
        exit_code,
        signal,
        timed_out,
        stdout_bytes: stdout.total(),
        stderr_bytes: stderr.total(),
        stdout_truncated: stdout.truncated(),
        stderr_truncated: stderr.truncated(),
        duration_us: duration.as_micros() as u64,
        oom_killed: false,
    })
}

/// A command that could not start reports like a shell would: 127 (not found) or 126.
pub(crate) fn spawn_failed(argv0: &str, err: &std::io::Error) -> (i32, String) {
    let code = if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    (code, format!("warren: cannot run {argv0}: {err}\n"))
}

/// One command run as reported on one stream: its output under the cap, its timeout and
/// its exit.
pub(crate) struct Run {
    stream: u32,
    started: Instant,
    pub stdout: Pump,
    pub stderr: Pump,
    exit: Option<Exit>,
    timed_out: bool,
}

impl Run {
    /// A run starting now, keeping up to `cap` bytes of each output.
    pub fn new(stream: u32, cap: u64) -> Run {
        Run {
            stream,
            started: Instant::now(),
            stdout: Pump::new(cap),
            stderr: Pump::new(cap),
            exit: None,
            timed_out: false,
        }
    }

    /// When the run started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Accounts `data` read from the command's stdout or stderr; the frame to send with the
    /// part under the cap, if any.
    pub fn output(&mut self, kind: Kind, data: &[u8]) -> Option<Frame> {
        let pump = match kind {
            Kind::Stderr => &mut self.stderr,
            _ => &mut self.stdout,
        };
        let keep = pump.take(data.len());
        (keep > 0).then(|| Frame::new(self.stream, kind, data[..keep].to_vec()))
    }

    /// The report of a command that could not start: its message on stderr (under the cap;
    /// the frame is sent even when empty) and the final event.
    pub fn spawn_failed(mut self, argv0: &str, err: &std::io::Error) -> (Frame, Event) {
        let (code, msg) = spawn_failed(argv0, err);
        let keep = self.stderr.take(msg.len());
        let frame = Frame::new(self.stream, Kind::Stderr, msg.as_bytes()[..keep].to_vec());
        self.exit = Some(Exit::Code(code));
        (frame, self.finish())
    }

    /// The command ended.
    pub fn exited(&mut self, exit: Exit) {
        self.exit = Some(exit);
    }

    pub fn exit(&self) -> Option<Exit> {
        self.exit
    }

    /// The command ran out of time (it is being killed).
    pub fn time_out(&mut self) {
        self.timed_out = true;
    }

    pub fn timed_out(&self) -> bool {
        self.timed_out
    }

    /// The final event.
    pub fn finish(&self) -> Event {
        exit_event(
            self.exit,
            self.timed_out,
            &self.stdout,
            &self.stderr,
            self.started.elapsed(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit_info(ev: Event) -> warren_types::ExitInfo {
        match ev {
            Event::Exited(x) => x,
            other => panic!("not an exit: {other:?}"),
        }
    }

    #[test]
    fn a_pump_keeps_up_to_its_cap_and_counts_the_rest() {
        let mut p = Pump::new(10);
        assert_eq!(p.take(4), 4);
        assert!(!p.truncated() && !p.full());
        assert_eq!(p.take(8), 6, "only what fits under the cap is kept");
        assert!(p.full() && p.truncated());
        assert_eq!(p.take(100), 0);
        assert_eq!(p.total(), 112);
        let mut none = Pump::new(0);
        assert_eq!(none.take(5), 0);
        assert!(none.truncated());
    }

    #[test]
    fn output_exactly_at_the_cap_is_whole_and_not_truncated() {
        let mut r = Run::new(7, 6);
        let f = r.output(Kind::Stdout, b"abc").unwrap();
        assert_eq!(
            (f.stream, f.kind, &f.payload[..]),
            (7, Kind::Stdout, &b"abc"[..])
        );
        let f = r.output(Kind::Stdout, b"def").unwrap();
        assert_eq!(&f.payload[..], b"def");
        assert!(r.stdout.full());
        r.exited(Exit::Code(0));
        let x = exit_info(r.finish());
        assert_eq!((x.stdout_bytes, x.stdout_truncated), (6, false));
        assert_eq!(x.exit_code, Some(0));
    }

    #[test]
    fn output_over_the_cap_is_cut_counted_and_marked() {
        let mut r = Run::new(1, 5);
        // A chunk that crosses the cap is cut where the cap is.
        assert_eq!(
            &r.output(Kind::Stderr, b"1234").unwrap().payload[..],
            b"1234"
        );
        let f = r.output(Kind::Stderr, b"5678").unwrap();
        assert_eq!((f.kind, &f.payload[..]), (Kind::Stderr, &b"5"[..]));
        // Past the cap nothing is sent, but everything is counted.
        assert!(r.output(Kind::Stderr, b"9999999").is_none());
        // The other stream has a cap of its own.
        assert_eq!(&r.output(Kind::Stdout, b"xy").unwrap().payload[..], b"xy");
        r.exited(Exit::Code(3));
        let x = exit_info(r.finish());
        assert_eq!((x.stderr_bytes, x.stderr_truncated), (15, true));
        assert_eq!((x.stdout_bytes, x.stdout_truncated), (2, false));
    }

    #[test]
    fn a_cap_of_zero_sends_nothing_and_an_empty_read_is_no_frame() {
        let mut r = Run::new(1, 0);
        assert!(r.output(Kind::Stdout, b"data").is_none());
        let mut r2 = Run::new(1, 10);
        assert!(r2.output(Kind::Stdout, b"").is_none());
        let x = exit_info(r.finish());
        assert_eq!((x.stdout_bytes, x.stdout_truncated), (4, true));
    }

    #[test]
    fn a_command_that_cannot_start_reports_like_a_shell() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        let (frame, ev) = Run::new(4, 1 << 20).spawn_failed("nope", &missing);
        assert_eq!((frame.stream, frame.kind), (4, Kind::Stderr));
        let msg = String::from_utf8(frame.payload.to_vec()).unwrap();
        assert!(msg.starts_with("warren: cannot run nope: "), "{msg}");
        let x = exit_info(ev);
        assert_eq!(
            (x.exit_code, x.signal, x.timed_out),
            (Some(127), None, false)
        );
        assert_eq!(x.stderr_bytes, msg.len() as u64);

        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let (frame, ev) = Run::new(4, 3).spawn_failed("/bin/x", &denied);
        assert_eq!(&frame.payload[..], b"war", "the message obeys the cap too");
        let x = exit_info(ev);
        assert_eq!((x.exit_code, x.stderr_truncated), (Some(126), true));
        // With a cap of 0 an empty frame still goes out (the client sees the stream).
        let (frame, _) = Run::new(4, 0).spawn_failed("x", &denied);
        assert!(frame.payload.is_empty());
    }

    #[test]
    fn an_exit_reports_the_pumps_and_how_the_command_ended() {
        let mut r = Run::new(1, 2);
        r.output(Kind::Stdout, b"12345");
        r.time_out();
        r.exited(Exit::Signal(9));
        assert!(r.timed_out());
        let x = exit_info(r.finish());
        assert_eq!((x.exit_code, x.signal, x.timed_out), (None, Some(9), true));
        assert_eq!((x.stdout_bytes, x.stdout_truncated), (5, true));
        assert_eq!((x.stderr_bytes, x.stderr_truncated), (0, false));
        // An end never seen is a kill.
        let x = exit_info(Run::new(1, 2).finish());
        assert_eq!((x.exit_code, x.signal), (None, Some(libc::SIGKILL)));
    }
}
