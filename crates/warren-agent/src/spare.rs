//! The one spare a function container keeps ready for its next call, as a state machine
//! apart from how a spare is made: empty, being made, or ready; a call takes the ready one,
//! waits for the one being made, or makes its own.

use std::cell::{Cell, RefCell};
use tokio::sync::Notify;

pub(crate) struct Spare<T> {
    ready: RefCell<Option<T>>,
    making: Cell<bool>,
    /// Woken when a making ends (with a spare or without).
    made: Notify,
}

impl<T> Default for Spare<T> {
    fn default() -> Self {
        Spare {
            ready: RefCell::new(None),
            making: Cell::new(false),
            made: Notify::new(),
        }
    }
}

impl<T> Spare<T> {
    /// True when the caller should start making a spare (none is ready or being made); it
    /// then must call [`Spare::made`] when done.
    pub fn begin(&self) -> bool {
        if self.making.get() || self.ready.borrow().is_some() {
            return false;
        }
        self.making.set(true);
        true
    }

    /// Ends a making begun with [`Spare::begin`], with its spare if it succeeded. Returns a
    /// spare this one replaced (the caller disposes of it).
    pub fn made(&self, spare: Option<T>) -> Option<T> {
        let old = spare.and_then(|s| self.ready.borrow_mut().replace(s));
        self.making.set(false);
        self.made.notify_waiters();
        old
    }

    /// The ready spare, without waiting.
    pub fn ready(&self) -> Option<T> {
        self.ready.borrow_mut().take()
    }

    /// The ready spare; while one is being made, waits for it (it has a head start). `None`
    /// when there is none to wait for: the caller makes its own.
    pub async fn take(&self) -> Option<T> {
        loop {
            if let Some(s) = self.ready.borrow_mut().take() {
                return Some(s);
            }
            if !self.making.get() {
                return None;
            }
            // Single-threaded: nothing runs between the check above and this registration.
            self.made.notified().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn one_spare_is_made_at_a_time_and_taken_once() {
        let s = Spare::default();
        assert!(s.begin(), "empty: make one");
        assert!(!s.begin(), "one is being made");
        assert_eq!(s.made(Some(1)), None);
        assert!(!s.begin(), "one is ready");
        assert_eq!(block_on(s.take()), Some(1));
        assert_eq!(block_on(s.take()), None, "taken: the caller makes its own");
        assert!(s.begin());
        assert_eq!(s.made(None), None, "a failed making leaves it empty");
        assert_eq!(block_on(s.take()), None);
        assert!(s.begin(), "and it can be tried again");
    }

    #[test]
    fn a_spare_made_over_a_ready_one_hands_back_the_old() {
        let s = Spare::default();
        assert!(s.begin());
        s.made(Some("a"));
        // A making that was begun before "a" was ready would end like this.
        s.making.set(true);
        assert_eq!(s.made(Some("b")), Some("a"));
        assert_eq!(block_on(s.take()), Some("b"));
    }

    #[test]
    fn a_call_waits_for_the_spare_being_made() {
        let s = Spare::default();
        assert!(s.begin());
        let got = block_on(async {
            let finish = async {
                // Runs after `take` has registered as a waiter.
                tokio::task::yield_now().await;
                s.made(Some(7));
            };
            tokio::join!(s.take(), finish).0
        });
        assert_eq!(got, Some(7));
        assert!(s.begin(), "taken: empty again");
    }

    #[test]
    fn a_call_waiting_for_a_failed_making_makes_its_own() {
        let s: Spare<u8> = Spare::default();
        assert!(s.begin());
        let got = block_on(async {
            let finish = async {
                tokio::task::yield_now().await;
                s.made(None);
            };
            tokio::join!(s.take(), finish).0
        });
        assert_eq!(got, None);
    }
}
