//! Metrics per tenant, with bounded cardinality: a label of its own for
//! each of the busiest tenants (at most `--metrics-tenants`), `_other` for
//! the rest, `_default` for the default tenant (see docs/tenants.md and
//! docs/metrics.md).
//!
//! Which tenants are the busiest is decided as commands arrive: the
//! commands of tenants without a label are counted in a bounded table
//! (Space-Saving: when it is full, the least counted entry makes room, and
//! the newcomer inherits its count, an overestimate, as its error). A
//! tenant whose count less that error, the commands it surely sent since
//! it entered the table, reaches [`PROMOTE_AFTER`] while a label is free
//! gets one and keeps it for the process's life: a counter that changed
//! label would break its rates. What it did before is in `_other`. Judged
//! by the count alone, a tenant of one command would get a label once the
//! inherited counts reach the threshold, after some 16,000 distinct
//! tenants.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{counter, histogram, SharedString};

pub const COMMANDS_TOTAL: &str = "denorm_tenant_commands_total";
pub const FAN_OUT_DOCUMENTS_TOTAL: &str = "denorm_tenant_fan_out_documents_total";
pub const DEAD_LETTERS_TOTAL: &str = "denorm_tenant_dead_letters_total";
pub const APPLY_DELAY_SECONDS: &str = "denorm_tenant_apply_delay_seconds";

/// The label of the default tenant's series (a tenant id cannot begin with
/// `_`).
pub const DEFAULT: &str = "_default";
/// The label of the tenants without one of their own.
pub const OTHER: &str = "_other";
/// Default number of tenants with a label of their own.
pub const DEFAULT_LABELED: usize = 20;
/// Commands a tenant sends before it may get a label of its own.
pub const PROMOTE_AFTER: u64 = 100;

/// A tenant's count in the candidates' table.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    count: u64,
    inherited: u64,
}

/// Which tenants have a label, and the counts of those that may get one.
#[derive(Debug)]
pub struct Labels {
    max: usize,
    /// The labelled tenants, each with its label (shared: a command's
    /// series cost no allocation).
    labeled: HashMap<String, Arc<str>>,
    /// At most `candidates_max` entries (Space-Saving): each tenant's
    /// count and the part of it inherited when it entered.
    candidates: HashMap<String, Candidate>,
    candidates_max: usize,
}

impl Labels {
    pub fn new(max: usize) -> Self {
        Labels { max, labeled: Default::default(), candidates: HashMap::new(), candidates_max: (8 * max).max(16) }
    }

    /// The label of one more command of `tenant`.
    pub fn label(&mut self, tenant: Option<&str>) -> SharedString {
        let Some(t) = tenant else { return SharedString::const_str(DEFAULT) };
        if let Some(l) = self.labeled.get(t) {
            return SharedString::from_shared(l.clone());
        }
        if self.labeled.len() >= self.max {
            return SharedString::const_str(OTHER);
        }
        let sure = match self.candidates.get_mut(t) {
            Some(c) => {
                c.count += 1;
                c.count - c.inherited
            }
            None => {
                let floor = match self.candidates.len() >= self.candidates_max {
                    true => {
                        let (least, n) = self.candidates.iter().min_by_key(|(_, c)| c.count).map(|(k, c)| (k.clone(), c.count)).expect("a full table");
                        self.candidates.remove(&least);
                        n
                    }
                    false => 0,
                };
                self.candidates.insert(t.to_string(), Candidate { count: floor + 1, inherited: floor });
                1
            }
        };
        if sure >= PROMOTE_AFTER {
            self.candidates.remove(t);
            let l: Arc<str> = t.into();
            self.labeled.insert(t.to_string(), l.clone());
            return SharedString::from_shared(l);
        }
        SharedString::const_str(OTHER)
    }

    /// The label `tenant` has now, without counting a command.
    pub fn of(&self, tenant: Option<&str>) -> SharedString {
        match tenant.map(|t| self.labeled.get(t)) {
            None => SharedString::const_str(DEFAULT),
            Some(Some(l)) => SharedString::from_shared(l.clone()),
            Some(None) => SharedString::const_str(OTHER),
        }
    }
}

fn labels() -> &'static Mutex<Labels> {
    static LABELS: OnceLock<Mutex<Labels>> = OnceLock::new();
    LABELS.get_or_init(|| Mutex::new(Labels::new(DEFAULT_LABELED)))
}

/// Sets how many tenants get a label of their own (`--metrics-tenants`),
/// before the first command.
pub fn set_labeled(max: usize) {
    *labels().lock().expect("tenant labels") = Labels::new(max);
}

/// A command of `tenant` applied: its count, its fan-out's documents, and
/// the time from its issue (`issued_at`, the producer's clock) to now.
pub fn applied(tenant: Option<&str>, fan_out_documents: Option<u64>, issued_at: i64) {
    let label = labels().lock().expect("tenant labels").label(tenant);
    counter!(COMMANDS_TOTAL, "tenant" => label.clone(), "outcome" => "applied").increment(1);
    if let Some(docs) = fan_out_documents {
        counter!(FAN_OUT_DOCUMENTS_TOTAL, "tenant" => label.clone()).increment(docs);
    }
    let delay = (crate::clock::now_millis() - issued_at).max(0) as f64 / 1000.0;
    histogram!(APPLY_DELAY_SECONDS, "tenant" => label).record(delay);
}

/// A message of the key `key` (on the wire) dead-lettered for `reason`.
pub fn dead_lettered(key: Option<&[u8]>, reason: &'static str) {
    let key = key.map(String::from_utf8_lossy);
    let tenant = key.as_deref().and_then(crate::command::tenant::of);
    let label = labels().lock().expect("tenant labels").of(tenant);
    counter!(DEAD_LETTERS_TOTAL, "tenant" => label, "reason" => reason).increment(1);
}

pub(super) fn describe() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(COMMANDS_TOTAL, Unit::Count, "Commands applied, by tenant (the busiest tenants each, _other for the rest, _default for the default tenant; see docs/tenants.md).");
    describe_counter!(FAN_OUT_DOCUMENTS_TOTAL, Unit::Count, "Documents rewritten by fan-outs (renames, profile changes), by tenant.");
    describe_counter!(DEAD_LETTERS_TOTAL, Unit::Count, "Messages dead-lettered, by tenant and reason.");
    describe_histogram!(APPLY_DELAY_SECONDS, Unit::Seconds, "Time from a command's issue (its issued_at, the producer's clock) to its application, by tenant: how far behind each tenant is.");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busiest_tenants_get_labels_and_the_rest_share_one() {
        let mut l = Labels::new(2);
        assert_eq!(l.label(None).to_string(), DEFAULT);
        // Many quiet tenants, once each: none gets a label.
        for i in 0..1000 {
            assert_eq!(l.label(Some(&format!("quiet{i}"))).to_string(), OTHER);
        }
        // Two busy ones get theirs once they have sent enough.
        let mut first = Vec::new();
        for _ in 0..PROMOTE_AFTER {
            first.push(l.label(Some("busy-a")).to_string());
            l.label(Some("busy-b"));
        }
        assert_eq!(first.last().map(String::as_str), Some("busy-a"));
        assert_eq!(first[0], OTHER, "counted in _other until it earns its label");
        assert_eq!(l.label(Some("busy-b")).to_string(), "busy-b");
        // The labels are taken: a third busy tenant stays in _other.
        for _ in 0..10 * PROMOTE_AFTER {
            assert_eq!(l.label(Some("busy-c")).to_string(), OTHER);
        }
        assert_eq!(l.of(Some("busy-a")).to_string(), "busy-a");
        assert_eq!(l.of(Some("busy-c")).to_string(), OTHER);
        assert!(l.candidates.len() <= l.candidates_max);
    }

    /// Tenants of one command each, however many, never get a label: the
    /// count they inherit is not theirs.
    #[test]
    fn tenants_of_one_command_never_get_a_label() {
        let mut l = Labels::new(2);
        for i in 0..50_000 {
            l.label(Some(&format!("once{i}")));
        }
        assert!(l.labeled.is_empty(), "labelled: {:?}", l.labeled.keys().collect::<Vec<_>>());
        for _ in 0..PROMOTE_AFTER {
            l.label(Some("busy"));
        }
        assert_eq!(l.of(Some("busy")).to_string(), "busy", "a busy tenant after them still gets its label");
    }

    #[test]
    fn the_candidates_table_stays_bounded_and_lets_a_heavy_hitter_through() {
        let mut l = Labels::new(1);
        let mut got = String::new();
        for i in 0..100_000u64 {
            // A heavy hitter among a stream of distinct tenants.
            if i % 10 == 0 {
                got = l.label(Some("heavy")).to_string();
            } else {
                l.label(Some(&format!("t{i}")));
            }
            assert!(l.candidates.len() <= l.candidates_max);
        }
        assert_eq!(got, "heavy");
    }
}
