//! What one call (a deployment) may make the host do through its targets,
//! and what it has done so far: bytes against each target's `max_gib`, its
//! puts and its publish interface and its own requests under a target
//! alike; puts (zero-byte ones too) against the manifest's `max_puts`, its
//! own requests under targets against `max_calls`, and the size of what
//! the deployment's record keeps of them against `max_records_kib`. Shared
//! by the call's `Publishing` and its HTTP gate; decides, never moves a
//! byte.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::human;
use crate::targets::Targets;

/// A deployment's puts, by default.
pub const DEFAULT_MAX_PUTS: u64 = 10_000;
/// A deployment's own requests under targets, by default.
pub const DEFAULT_MAX_CALLS: u64 = 1_000;
/// What a deployment's record keeps of its puts, by default: 4 MiB.
pub const DEFAULT_MAX_RECORDS_KIB: u64 = 4 << 10;

/// What a manifest caps of one deployment's records (`None`: the
/// default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    pub max_puts: Option<u64>,
    pub max_calls: Option<u64>,
    pub max_records_kib: Option<u64>,
}

/// The shared account of one call.
pub(crate) struct Spending {
    targets: Arc<Targets>,
    max_puts: u64,
    max_calls: u64,
    max_record_bytes: u64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Bytes by target name.
    bytes: HashMap<String, u64>,
    puts: u64,
    calls: u64,
    recorded: u64,
}

impl Spending {
    pub(crate) fn new(targets: Arc<Targets>, caps: Caps) -> Self {
        Self {
            targets,
            max_puts: caps.max_puts.unwrap_or(DEFAULT_MAX_PUTS),
            max_calls: caps.max_calls.unwrap_or(DEFAULT_MAX_CALLS),
            max_record_bytes: caps.max_records_kib.unwrap_or(DEFAULT_MAX_RECORDS_KIB) << 10,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("never poisoned")
    }

    /// Bytes this deployment has sent to the target `name`.
    pub(crate) fn sent(&self, name: &str) -> u64 {
        self.state().bytes.get(name).copied().unwrap_or(0)
    }

    /// Whether `size` more bytes for `what` keep what this deployment
    /// sends to the target `name` (`sent` so far) within its `max_gib`.
    pub(crate) fn within_budget(
        &self,
        name: &str,
        sent: u64,
        what: &str,
        size: u64,
    ) -> Result<(), String> {
        match self.targets.get(name).and_then(|t| t.max_bytes()) {
            Some(max) if sent.saturating_add(size) > max => Err(format!(
                "target {name:?} takes at most {} from one deployment (its max_gib); this one \
                 has sent {} and {what} is {} more",
                human::size(max),
                human::size(sent),
                human::size(size)
            )),
            _ => Ok(()),
        }
    }

    /// `bytes` more went to the target `name`.
    pub(crate) fn add(&self, name: &str, bytes: u64) {
        *self.state().bytes.entry(name.to_string()).or_default() += bytes;
    }

    /// `more` bytes of a request of the deployment's own go to or come
    /// from the target `name`, if they fit its `max_gib`.
    pub(crate) fn stream(&self, name: &str, more: u64, what: &str) -> Result<(), String> {
        let mut state = self.state();
        let sent = state.bytes.get(name).copied().unwrap_or(0);
        self.within_budget(name, sent, what, more)?;
        *state.bytes.entry(name.to_string()).or_default() += more;
        Ok(())
    }

    /// One more put may be made, or why not.
    pub(crate) fn put(&self) -> Result<(), String> {
        let mut state = self.state();
        self.recorded_within(&state)?;
        if state.puts >= self.max_puts {
            return Err(format!(
                "this deployment has made {} puts, the most its manifest allows (max_puts)",
                self.max_puts
            ));
        }
        state.puts += 1;
        Ok(())
    }

    /// One more request of the deployment's own under a target may be
    /// sent, or why not.
    pub(crate) fn call(&self) -> Result<(), String> {
        let mut state = self.state();
        self.recorded_within(&state)?;
        if state.calls >= self.max_calls {
            return Err(format!(
                "this deployment has sent {} requests of its own under targets, the most its \
                 manifest allows (max_calls)",
                self.max_calls
            ));
        }
        state.calls += 1;
        Ok(())
    }

    /// The record kept `bytes` more of a put.
    pub(crate) fn recorded(&self, bytes: u64) {
        self.state().recorded += bytes;
    }

    fn recorded_within(&self, state: &State) -> Result<(), String> {
        if state.recorded >= self.max_record_bytes {
            return Err(format!(
                "this deployment's record of what it published has reached {}, the most its \
                 manifest allows (max_records_kib)",
                human::size(self.max_record_bytes)
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spending(caps: Caps) -> Spending {
        let sources = "[[target]]\nname = \"m\"\nurl = \"http://h/\"\nmax_gib = 1\n";
        let targets = Targets::parse(sources, "sources.toml", |_| None).unwrap();
        Spending::new(Arc::new(targets), caps)
    }

    #[test]
    fn puts_calls_and_the_record_are_counted_to_their_caps() {
        let spending = spending(Caps {
            max_puts: Some(2),
            max_calls: Some(1),
            max_records_kib: Some(1),
        });
        assert_eq!(spending.put(), Ok(()));
        assert_eq!(spending.put(), Ok(()));
        assert_eq!(
            spending.put().unwrap_err(),
            "this deployment has made 2 puts, the most its manifest allows (max_puts)"
        );
        assert_eq!(spending.call(), Ok(()));
        assert!(spending.call().unwrap_err().contains("(max_calls)"));
        let fresh = Spending::new(spending.targets.clone(), Caps::default());
        fresh.recorded(1023);
        assert_eq!(fresh.put(), Ok(()));
        fresh.recorded(DEFAULT_MAX_RECORDS_KIB << 10);
        assert_eq!(
            fresh.put().unwrap_err(),
            "this deployment's record of what it published has reached 4 MiB, the most its \
             manifest allows (max_records_kib)"
        );
        assert!(fresh.call().unwrap_err().contains("max_records_kib"));
    }

    #[test]
    fn a_targets_bytes_are_shared_by_puts_and_own_requests() {
        let spending = spending(Caps::default());
        spending.add("m", (1 << 30) - 10);
        assert_eq!(spending.stream("m", 10, "a PUT of its own"), Ok(()));
        assert_eq!(
            spending.stream("m", 1, "a PUT of its own").unwrap_err(),
            "target \"m\" takes at most 1 GiB from one deployment (its max_gib); this one has \
             sent 1 GiB and a PUT of its own is 1 bytes more"
        );
        assert_eq!(spending.sent("m"), 1 << 30);
        assert_eq!(spending.stream("other", 1 << 40, "x"), Ok(()));
    }
}
