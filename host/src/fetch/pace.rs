//! How many connections one large file is read over, chosen by
//! measurement: a fixed number is wrong both ways (on a fast source extra
//! connections only compete with the hash for the CPU; on a source that
//! caps each connection, too few leave the link idle; some sources refuse
//! more than a few per client).
//!
//! The rule, like TCP's slow start but bolder, since a step costs a
//! request rather than a lost packet: the file starts on one connection.
//! Each window (`WINDOW`) the total rate is measured; the window after a
//! change is skipped while new connections warm up. While the rate grows
//! with the connections (by at least half of what the added ones would
//! bring at the current rate per connection), the number is multiplied by
//! `GROWTH`, up to the maximum (`--fetch-connections`): 1 → 4 → 16 takes
//! about half a second. A step that did not pay is taken back, and that
//! number becomes a ceiling; the next step goes halfway towards it, so the
//! count settles where more stopped paying, and one noisy window costs a
//! smaller step rather than the rest of the file. A connection the source
//! refuses or cuts (429, 503, refused, reset) gives its piece back to the
//! others and the number never goes above what was working since. Pure
//! arithmetic on counts and instants; `pieces` acts on its answers.

use std::time::{Duration, Instant};

/// How long each measurement lasts: at 50 MB/s a connection, 5 MB.
pub(crate) const WINDOW: Duration = Duration::from_millis(100);

/// How much each step that pays multiplies the connections by.
const GROWTH: usize = 4;

/// What to do with the connections now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Hold,
    /// Open this many more.
    Add(usize),
    /// Let this many finish their piece and stop.
    Drop(usize),
}

#[derive(Debug)]
pub(crate) struct Pace {
    /// The most the file may use: `--fetch-connections`, lowered when the
    /// source refuses one.
    limit: usize,
    /// The fewest connections tried that did not pay: no step reaches it.
    ceiling: usize,
    /// Connections now.
    now: usize,
    /// The last window's start and the bytes received by then.
    window: (Instant, u64),
    /// The rate before the last step, with the connections then, while
    /// its outcome is pending.
    probe: Option<(f64, usize)>,
    /// A window to skip: connections just changed.
    warming: bool,
}

impl Pace {
    pub(crate) fn new(limit: usize, now: Instant) -> Self {
        let limit = limit.max(1);
        Self {
            limit,
            ceiling: limit + 1,
            now: 1,
            window: (now, 0),
            probe: None,
            warming: true,
        }
    }

    /// Called each `WINDOW` with the bytes received so far.
    pub(crate) fn tick(&mut self, received: u64, at: Instant) -> Step {
        let (start, before) = self.window;
        let seconds = at.duration_since(start).as_secs_f64();
        self.window = (at, received);
        if self.warming || seconds <= 0.0 {
            self.warming = false;
            return Step::Hold;
        }
        let rate = received.saturating_sub(before) as f64 / seconds;
        match self.probe.take() {
            Some((rate_before, connections_before)) => {
                let added = self.now - connections_before;
                let per_connection = rate_before / connections_before as f64;
                if rate - rate_before >= 0.5 * per_connection * added as f64 {
                    self.step_up(rate)
                } else {
                    self.ceiling = self.now;
                    self.change(connections_before);
                    Step::Drop(added)
                }
            }
            None => self.step_up(rate),
        }
    }

    /// A connection was refused or cut, while `working` others still read:
    /// the source allows no more than those.
    pub(crate) fn refused(&mut self, working: usize) {
        self.limit = working.max(1);
        self.now = self.limit;
        self.probe = None;
    }

    /// Only `got` of the `asked` connections of the last `Step::Add`
    /// opened: the files fetched at the same time hold the others. A step
    /// that opened none is no step; the next window asks again.
    pub(crate) fn granted(&mut self, asked: usize, got: usize) {
        if got >= asked {
            return;
        }
        self.now -= asked - got;
        if got == 0 {
            self.probe = None;
            self.warming = false;
        }
    }

    fn step_up(&mut self, rate: f64) -> Step {
        let mut target = (self.now * GROWTH).min(self.limit);
        // `now < ceiling` always, so this ends at `now` at the latest.
        while target >= self.ceiling {
            target = self.now + (target - self.now) / 2;
        }
        if target <= self.now {
            return Step::Hold;
        }
        self.probe = Some((rate, self.now));
        let added = target - self.now;
        self.change(target);
        Step::Add(added)
    }

    fn change(&mut self, connections: usize) {
        self.now = connections;
        self.warming = true;
    }

    /// Connections the rule wants now.
    pub(crate) fn connections(&self) -> usize {
        self.now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the rule against a source where `rate(n)` bytes per second
    /// arrive over n connections; answers the connections after each
    /// window.
    fn run(limit: usize, windows: usize, mut rate: impl FnMut(usize) -> f64) -> Vec<usize> {
        let start = Instant::now();
        let mut pace = Pace::new(limit, start);
        let mut received = 0.0;
        let mut seen = Vec::new();
        for w in 1..=windows {
            received += rate(pace.connections()) * WINDOW.as_secs_f64();
            pace.tick(received as u64, start + WINDOW * w as u32);
            seen.push(pace.connections());
        }
        seen
    }

    #[test]
    fn a_source_that_caps_each_connection_gets_every_connection_allowed() {
        let capped = |n: usize| 50e6 * n as f64;
        let seen = run(16, 8, capped);
        assert_eq!(seen, [1, 4, 4, 16, 16, 16, 16, 16]);
    }

    #[test]
    fn a_fast_source_stays_on_one_connection() {
        // The CPU is the bound: a second connection only competes.
        let fast = |n: usize| if n == 1 { 1.2e9 } else { 1.1e9 };
        let seen = run(16, 12, fast);
        assert_eq!(seen, [1, 4, 4, 1, 1, 2, 2, 1, 1, 1, 1, 1]);
    }

    #[test]
    fn a_link_that_fills_up_stops_where_more_stopped_paying() {
        // A 300 MB/s link over 50 MB/s connections: 1 → 4 paid, 4 → 16
        // did not and is taken back; halfway to each ceiling, 7 paid (200 →
        // 300 MB/s) and nothing above it did.
        let link = |n: usize| (50e6 * n as f64).min(300e6);
        let seen = run(16, 24, link);
        assert_eq!(
            seen,
            [
                1, 4, 4, 16, 16, 4, 4, 10, 10, 4, 4, 7, 7, 9, 9, 7, 7, 8, 8, 7, 7, 7, 7, 7
            ]
        );
    }

    #[test]
    fn one_slow_window_costs_a_smaller_step_not_the_rest_of_the_file() {
        // The window that measures 4 → 16 is slowed by something else on
        // the machine: the next step goes halfway, and on from there.
        let mut windows = 0;
        let noisy = |n: usize| {
            windows += 1;
            if windows == 6 { 150e6 } else { 50e6 * n as f64 }
        };
        let seen = run(16, 10, noisy);
        assert_eq!(seen, [1, 4, 4, 16, 16, 4, 4, 10, 10, 13]);
    }

    #[test]
    fn a_refused_connection_caps_the_rest_of_the_file() {
        let start = Instant::now();
        let mut pace = Pace::new(16, start);
        pace.tick(0, start + WINDOW);
        assert_eq!(pace.tick(10_000_000, start + WINDOW * 2), Step::Add(3));
        pace.refused(1);
        for w in 3..10 {
            assert_eq!(
                pace.tick(10_000_000 * w, start + WINDOW * w as u32),
                Step::Hold
            );
        }
        assert_eq!(pace.connections(), 1);
    }

    #[test]
    fn a_step_granted_in_part_is_judged_by_what_opened() {
        let start = Instant::now();
        let mut pace = Pace::new(16, start);
        pace.tick(0, start + WINDOW);
        // 1 → 4 asked, none free: no step, and the next window asks again.
        assert_eq!(pace.tick(5_000_000, start + WINDOW * 2), Step::Add(3));
        pace.granted(3, 0);
        assert_eq!(pace.connections(), 1);
        assert_eq!(pace.tick(10_000_000, start + WINDOW * 3), Step::Add(3));
        // One opened: 1 → 2, which paid (5 → 10 MB a window), so the next
        // step multiplies 2.
        pace.granted(3, 1);
        assert_eq!(pace.connections(), 2);
        pace.tick(15_000_000, start + WINDOW * 4);
        assert_eq!(pace.tick(25_000_000, start + WINDOW * 5), Step::Add(6));
        assert_eq!(pace.connections(), 8);
    }

    #[test]
    fn one_connection_allowed_is_one_connection() {
        assert_eq!(run(1, 6, |n| 50e6 * n as f64), [1; 6]);
    }
}
