//! A plugin's memory budget: the sum of all its linear memories and tables,
//! not a per-memory cap, because Python and JavaScript components run several
//! core instances, each with a memory of its own.

use wasmtime::ResourceLimiter;

pub(crate) struct MemoryBudget {
    limit_bytes: usize,
    used_bytes: usize,
    /// Set when a grow was refused, so a later trap can be explained as
    /// running out of memory rather than as a crash.
    pub(crate) exhausted: bool,
}

impl MemoryBudget {
    pub(crate) fn new(limit_bytes: usize) -> Self {
        Self {
            limit_bytes,
            used_bytes: 0,
            exhausted: false,
        }
    }

    fn grow(&mut self, current: usize, desired: usize) -> bool {
        let extra = desired.saturating_sub(current);
        if self.used_bytes.saturating_add(extra) > self.limit_bytes {
            self.exhausted = true;
            return false;
        }
        self.used_bytes += extra;
        true
    }
}

impl ResourceLimiter for MemoryBudget {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(current, desired))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // A table element is a pointer; charging 8 bytes each keeps a table
        // bomb inside the same budget.
        Ok(self.grow(current * 8, desired * 8))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_is_charged_across_memories_and_refused_past_the_limit() {
        let mut budget = MemoryBudget::new(100);
        assert!(budget.grow(0, 60));
        assert!(budget.grow(0, 40), "a second memory shares the budget");
        assert!(!budget.exhausted);
        assert!(!budget.grow(60, 61));
        assert!(budget.exhausted);
    }
}
