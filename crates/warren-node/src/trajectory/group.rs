//! Group commit: appends queue here, and one writer at a time writes everything waiting as
//! one group (one sync of the log files, one index transaction; see [`super::journal`]) and
//! then answers each append of it. An answer therefore still means the entry is on disk.
//!
//! Who writes a group: an append that finds no group being written writes it itself, on its
//! own thread (tokio's `block_in_place` on a multi-threaded runtime), so a lone caller waits
//! for its own write and sync only. Handing the group to a writer thread and the answer back
//! costs two thread wake-ups, which on a small VM is about as long as the sync itself. Appends
//! that arrive while a group is being written queue up, and the writer thread takes all of
//! them as the next group once that one is done: a busy node still shares one sync among
//! many appends. The writer thread also makes volatile index commits durable, off every
//! caller's path.
//!
//! Written here rather than taken from a crate: the group is tied to the journal's own
//! durability rule (volatile index commits made durable by count and by age), and the
//! leader-writes-inline path needs to know the tokio runtime it runs on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// What writes groups: the journal's files and index.
pub(crate) trait Sink<A>: Send + Sync + 'static {
    /// Writes one group (barriers carry no append); returns whether its index commit was
    /// volatile (to be made durable later by [`Sink::make_durable`]).
    fn write(&self, group: &[&A]) -> Result<bool, String>;
    /// Makes every volatile commit before it durable.
    fn make_durable(&self) -> Result<(), String>;
}

/// The answer to one append: `Err` carries what failed.
pub(crate) type Answer = Result<(), String>;

/// Longest an index commit stays volatile: the writer thread commits durably once this long
/// after the first volatile commit.
pub(crate) const DURABLE_EVERY: Duration = Duration::from_secs(1);

/// Most volatile commits in a row: redb frees the pages a commit replaced only at a durable
/// commit, so the state file grows with their number (in `entries_past_the_budget_cost_about_
/// their_size`: 16 KiB per entry with no limit, 716 bytes with 32, under 250 with 8).
pub(crate) const MAX_VOLATILE: u32 = 8;

/// Most appends written in one group.
const MAX_GROUP: usize = 512;

struct Job<A> {
    /// `None`: a barrier, answered once everything queued before it is written.
    append: Option<A>,
    /// `None`: the job of the caller writing the group.
    done: Option<oneshot::Sender<Answer>>,
}

struct State<A> {
    jobs: Vec<Job<A>>,
    /// A group (or a durable commit) is being written.
    busy: bool,
    closed: bool,
    /// Volatile index commits since the last durable one, and since when.
    volatile: u32,
    volatile_since: Option<Instant>,
}

impl<A> State<A> {
    /// The index must be made durable before the next group.
    fn durable_now(&self) -> bool {
        self.volatile >= MAX_VOLATILE
    }

    fn durable_due(&self) -> bool {
        self.durable_now()
            || self
                .volatile_since
                .is_some_and(|t| t.elapsed() >= DURABLE_EVERY)
    }

    fn account(&mut self, written: &Answer, volatile: bool) {
        if written.is_ok() {
            if volatile {
                self.volatile += 1;
                self.volatile_since.get_or_insert_with(Instant::now);
            } else {
                self.volatile = 0;
                self.volatile_since = None;
            }
        }
    }
}

struct Shared<A> {
    state: Mutex<State<A>>,
    /// Wakes the writer thread: jobs queued, a durable commit due, or closing.
    wake: Condvar,
    sink: Box<dyn Sink<A>>,
    groups: AtomicU64,
}

impl<A: Send + 'static> Shared<A> {
    fn lock(&self) -> MutexGuard<'_, State<A>> {
        self.state.lock().expect("group commit lock")
    }

    /// Writes `group` and answers every job of it but the caller's; returns the caller's
    /// answer and whether the commit was volatile.
    fn write(&self, group: Vec<Job<A>>) -> (Answer, bool) {
        let appends: Vec<&A> = group.iter().filter_map(|j| j.append.as_ref()).collect();
        let result = if appends.is_empty() {
            Ok(false)
        } else {
            self.sink.write(&appends)
        };
        self.groups.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = &result {
            tracing::warn!(error = %e, entries = appends.len(), "trajectory append failed");
        }
        let answer = result.as_ref().map(|_| ()).map_err(Clone::clone);
        for job in group {
            if let Some(done) = job.done {
                let _ = done.send(answer.clone());
            }
        }
        (answer, result.unwrap_or(false))
    }

    /// Makes the index durable (marking the state busy meanwhile); returns the guard again.
    fn make_durable<'a>(&'a self, mut st: MutexGuard<'a, State<A>>) -> MutexGuard<'a, State<A>> {
        st.busy = true;
        drop(st);
        let result = self.sink.make_durable();
        let mut st = self.lock();
        st.busy = false;
        if let Err(e) = result {
            tracing::warn!(error = %e, "trajectory index not committed durably");
            // Tried again after a while, not at once.
            st.volatile = 0;
            st.volatile_since = Some(Instant::now());
        } else {
            st.volatile = 0;
            st.volatile_since = None;
        }
        st
    }
}

/// The queue of appends and the writer thread behind it.
pub(crate) struct Committer<A: Send + 'static> {
    shared: Arc<Shared<A>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// A queued append, to wait for with [`Pending::wait`].
pub(crate) enum Pending<A: Send + 'static> {
    /// Nothing was being written: the caller writes this group (its own append last).
    Lead(Lead<A>),
    /// Behind a group being written: answered by whoever writes it.
    Queued(oneshot::Receiver<Answer>),
    /// A barrier with nothing before it: answered already.
    Done,
}

/// The group a caller writes itself. Dropped unwritten (the caller gave up), it goes back to
/// the queue for the writer thread.
pub(crate) struct Lead<A: Send + 'static> {
    shared: Arc<Shared<A>>,
    group: Vec<Job<A>>,
}

impl<A: Send + 'static> Drop for Lead<A> {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        let mut group = std::mem::take(&mut self.group);
        if !group.is_empty() {
            group.append(&mut st.jobs);
            st.jobs = group;
        }
        st.busy = false;
        drop(st);
        self.shared.wake.notify_one();
    }
}

impl<A: Send + 'static> Lead<A> {
    fn run(mut self) -> Answer {
        let group = std::mem::take(&mut self.group);
        let (answer, volatile) = self.shared.write(group);
        self.shared.lock().account(&answer, volatile);
        // Drop: no longer busy; the writer thread takes what queued meanwhile.
        answer
    }
}

impl<A: Send + 'static> Pending<A> {
    /// Waits until the append is written (the caller writes it when it leads).
    pub(crate) async fn wait(self) -> Option<Answer> {
        match self {
            Pending::Done => Some(Ok(())),
            Pending::Queued(rx) => rx.await.ok(),
            Pending::Lead(lead) => Some(if on_multi_thread_runtime() {
                tokio::task::block_in_place(|| lead.run())
            } else {
                lead.run()
            }),
        }
    }
}

/// Whether blocking this thread for a write is allowed through `block_in_place`.
fn on_multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

impl<A: Send + 'static> Committer<A> {
    /// Starts the writer thread over `sink`.
    pub(crate) fn start(sink: Box<dyn Sink<A>>) -> Committer<A> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                jobs: Vec::new(),
                busy: false,
                closed: false,
                volatile: 0,
                volatile_since: None,
            }),
            wake: Condvar::new(),
            sink,
            groups: AtomicU64::new(0),
        });
        let s = shared.clone();
        let writer = std::thread::Builder::new()
            .name("trajectory-writer".into())
            .spawn(move || writer(&s))
            .expect("spawn the trajectory writer thread");
        Committer {
            shared,
            writer: Mutex::new(Some(writer)),
        }
    }

    /// Groups written so far (appends and barriers share them).
    pub(crate) fn groups(&self) -> u64 {
        self.shared.groups.load(Ordering::Relaxed)
    }

    /// Queues an append (`None`: a barrier, answered once everything queued before it is
    /// written); `None` once closed. Queue order is write order. The caller writes the group
    /// itself when nothing is being written and it runs on a multi-threaded runtime.
    pub(crate) fn queue(&self, append: Option<A>) -> Option<Pending<A>> {
        let mut st = self.shared.lock();
        if st.closed {
            return None;
        }
        if !st.busy && st.jobs.is_empty() && append.is_none() {
            return Some(Pending::Done);
        }
        if !st.busy
            && !st.durable_now()
            && st.jobs.len() < MAX_GROUP
            && append.is_some()
            && on_multi_thread_runtime()
        {
            st.busy = true;
            let mut group = std::mem::take(&mut st.jobs);
            group.push(Job { append, done: None });
            return Some(Pending::Lead(Lead {
                shared: self.shared.clone(),
                group,
            }));
        }
        let (done, rx) = oneshot::channel();
        st.jobs.push(Job {
            append,
            done: Some(done),
        });
        let idle = !st.busy;
        drop(st);
        if idle {
            self.shared.wake.notify_one();
        }
        Some(Pending::Queued(rx))
    }
}

impl<A: Send + 'static> Drop for Committer<A> {
    fn drop(&mut self) {
        // The writer writes what is queued, makes the index durable, and ends; joining it
        // releases its handle on the database, so the file can be opened again at once.
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
        if let Some(w) = self.writer.lock().expect("writer lock").take() {
            let _ = w.join();
        }
    }
}

fn writer<A: Send + 'static>(shared: &Shared<A>) {
    let mut st = shared.lock();
    loop {
        if st.busy {
            // A caller is writing a group; it wakes this thread when done.
            st = shared.wake.wait(st).expect("group commit lock");
            continue;
        }
        if st.durable_now() {
            st = shared.make_durable(st);
            continue;
        }
        if !st.jobs.is_empty() {
            let n = st.jobs.len().min(MAX_GROUP);
            let group: Vec<Job<A>> = st.jobs.drain(..n).collect();
            st.busy = true;
            drop(st);
            let (answer, volatile) = shared.write(group);
            st = shared.lock();
            st.busy = false;
            st.account(&answer, volatile);
            continue;
        }
        if st.closed {
            // What the index holds becomes durable, so the next start has nothing to scan.
            if st.volatile_since.is_some() {
                drop(shared.make_durable(st));
            }
            return;
        }
        if st.durable_due() {
            st = shared.make_durable(st);
            continue;
        }
        let wait = match st.volatile_since {
            Some(t) => DURABLE_EVERY.saturating_sub(t.elapsed()),
            None => DURABLE_EVERY,
        };
        st = shared
            .wake
            .wait_timeout(st, wait)
            .expect("group commit lock")
            .0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records each group (its appends and the thread that wrote it) and durable commits;
    /// `hold` keeps a write waiting until it is released.
    #[derive(Default)]
    struct Record {
        groups: Mutex<Vec<(Vec<u32>, String)>>,
        durable: AtomicU64,
        entered: AtomicU64,
        hold: Mutex<bool>,
        held: Condvar,
    }

    struct Fake(Arc<Record>);

    impl Sink<u32> for Fake {
        fn write(&self, group: &[&u32]) -> Result<bool, String> {
            self.0.entered.fetch_add(1, Ordering::SeqCst);
            let mut hold = self.0.hold.lock().unwrap();
            while *hold {
                hold = self.0.held.wait(hold).unwrap();
            }
            let thread = std::thread::current().name().unwrap_or("").to_string();
            let appends = group.iter().map(|a| **a).collect();
            self.0.groups.lock().unwrap().push((appends, thread));
            Ok(true)
        }

        fn make_durable(&self) -> Result<(), String> {
            self.0.durable.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    fn committer() -> (Committer<u32>, Arc<Record>) {
        let record = Arc::new(Record::default());
        (Committer::start(Box::new(Fake(record.clone()))), record)
    }

    fn set_hold(r: &Record, on: bool) {
        *r.hold.lock().unwrap() = on;
        r.held.notify_all();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lone_append_is_written_by_its_caller() {
        let (c, record) = committer();
        for i in 0..3 {
            let p = c.queue(Some(i)).unwrap();
            assert!(matches!(p, Pending::Lead(_)));
            assert_eq!(p.wait().await, Some(Ok(())));
        }
        let groups = record.groups.lock().unwrap().clone();
        assert_eq!(groups.len(), 3);
        for (i, (appends, thread)) in groups.iter().enumerate() {
            assert_eq!(appends, &[i as u32]);
            assert_ne!(
                thread, "trajectory-writer",
                "no hand-off to the writer thread"
            );
        }
        assert!(
            matches!(c.queue(None), Some(Pending::Done)),
            "nothing to wait for"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_behind_a_group_share_the_next_one_in_order() {
        let (c, record) = committer();
        set_hold(&record, true);
        let first = c.queue(Some(0)).unwrap();
        let first = tokio::spawn(first.wait());
        while record.entered.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let p = c.queue(Some(1)).unwrap();
        assert!(matches!(p, Pending::Queued(_)), "one writer at a time");
        let rest: Vec<_> = (2..6).map(|i| c.queue(Some(i)).unwrap()).collect();
        let barrier = c.queue(None).unwrap();
        set_hold(&record, false);
        assert_eq!(first.await.unwrap(), Some(Ok(())));
        assert_eq!(p.wait().await, Some(Ok(())));
        for p in rest {
            assert_eq!(p.wait().await, Some(Ok(())));
        }
        assert_eq!(barrier.wait().await, Some(Ok(())));
        let groups = record.groups.lock().unwrap().clone();
        assert_eq!(groups.len(), 2, "{groups:?}");
        assert_eq!(groups[0].0, [0]);
        assert_eq!(groups[1].0, [1, 2, 3, 4, 5]);
        assert_eq!(groups[1].1, "trajectory-writer");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_group_its_caller_gave_up_on_is_still_written() {
        let (c, record) = committer();
        let p = c.queue(Some(7)).unwrap();
        assert!(matches!(p, Pending::Lead(_)));
        drop(p);
        // The writer thread takes it; a barrier after it answers once it is written.
        assert_eq!(c.queue(None).unwrap().wait().await, Some(Ok(())));
        let groups = record.groups.lock().unwrap().clone();
        assert_eq!(groups, [(vec![7], "trajectory-writer".to_string())]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn volatile_commits_are_made_durable_by_count_and_at_the_end() {
        let (c, record) = committer();
        for i in 0..MAX_VOLATILE {
            c.queue(Some(i)).unwrap().wait().await.unwrap().unwrap();
        }
        // The next append waits for the durable commit, off the previous callers' paths.
        c.queue(Some(99)).unwrap().wait().await.unwrap().unwrap();
        assert_eq!(record.durable.load(Ordering::Relaxed), 1);
        drop(c);
        assert_eq!(record.durable.load(Ordering::Relaxed), 2, "at the end");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_single_threaded_runtime_leaves_writing_to_the_writer_thread() {
        let (c, record) = committer();
        let p = c.queue(Some(1)).unwrap();
        assert!(matches!(p, Pending::Queued(_)));
        assert_eq!(p.wait().await, Some(Ok(())));
        assert_eq!(record.groups.lock().unwrap()[0].1, "trajectory-writer");
        drop(c);
    }

    #[test]
    fn appends_after_the_end_are_refused_and_queued_ones_written() {
        let (c, record) = committer();
        let p = c.queue(Some(1)).unwrap();
        c.shared.lock().closed = true;
        assert!(c.queue(Some(2)).is_none());
        drop(c);
        drop(p);
        assert_eq!(record.groups.lock().unwrap()[0].0, [1]);
    }
}
