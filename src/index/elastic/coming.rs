//! The owners of the fan-outs about to run ([`Shard::prefetch_scans`]),
//! which `super::dependents` reads together.
//!
//! [`Shard::prefetch_scans`]: crate::index::Shard::prefetch_scans

use super::recent::ahead_slot;
use crate::index::Scan;

/// The fan-outs of owners' dependents the shard was told are coming
/// ([`Shard::prefetch_scans`]), in log order, until each one's scan runs:
/// when a refresh dropped what was read ahead before an owner's scan, the
/// owners still to come are read again together instead of one by one.
///
/// [`Shard::prefetch_scans`]: crate::index::Shard::prefetch_scans
#[derive(Debug, Default)]
pub(super) struct Coming(Vec<(String, Scan)>);

impl Coming {
    /// The fan-outs about to run that read an owner's dependents (those
    /// with an [`ahead_slot`]), each owner once.
    pub(super) fn expect(&mut self, scans: &[Scan]) {
        self.0.clear();
        for scan in scans {
            if let Some(slot) = ahead_slot(scan) {
                if !self.0.iter().any(|(s, _)| *s == slot) {
                    self.0.push((slot, scan.clone()));
                }
            }
        }
    }

    /// The scans still to come, in log order.
    pub(super) fn scans(&self) -> impl Iterator<Item = &Scan> {
        self.0.iter().map(|(_, scan)| scan)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The scan of the owner `slot` ([`ahead_slot`]) runs now: whether it
    /// was expected.
    pub(super) fn arrived(&mut self, slot: &str) -> bool {
        match self.0.iter().position(|(s, _)| s == slot) {
            Some(i) => {
                self.0.remove(i);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coming_owners_are_each_expected_once_and_leave_as_their_scans_run() {
        let posts = |u: &str| Scan::PostsOfUserNotNamed { user_id: u.into(), name: "N".into() };
        let mut c = Coming::default();
        c.expect(&[posts("u1"), Scan::FilesWithin { path: "/d".into() }, posts("u2"), posts("u1")]);
        let slots = |c: &Coming| c.0.iter().map(|(s, _)| s.clone()).collect::<Vec<_>>();
        assert_eq!(slots(&c), ["u1", "u2"]);
        assert_eq!(c.scans().collect::<Vec<_>>(), [&posts("u1"), &posts("u2")]);
        assert!(c.arrived("u1") && !c.arrived("u1"), "once");
        assert!(!c.arrived("u7"), "not expected");
        c.expect(&[posts("u3")]);
        assert_eq!(slots(&c), ["u3"], "a new window replaces the last");
    }
}
