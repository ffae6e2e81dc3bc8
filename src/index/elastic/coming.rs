//! The owners of the fan-outs about to run ([`Shard::prefetch_scans`]),
//! which `super::dependents` reads together.
//!
//! [`Shard::prefetch_scans`]: crate::index::Shard::prefetch_scans

use crate::index::Scan;

/// The owners whose fan-outs the shard was told are coming
/// ([`Shard::prefetch_scans`]), in log order, until each one's scan runs:
/// when a refresh dropped what was read ahead before an owner's scan, the
/// owners still to come are read again together instead of one by one.
///
/// [`Shard::prefetch_scans`]: crate::index::Shard::prefetch_scans
#[derive(Debug, Default)]
pub(super) struct Coming(Vec<String>);

impl Coming {
    /// The owners of the fan-outs about to run: those that read an owner's
    /// dependents (`Scan::PostsOfUserNotNamed`), each once.
    pub(super) fn expect(&mut self, scans: &[Scan]) {
        self.0.clear();
        for scan in scans {
            if let Scan::PostsOfUserNotNamed { user_id, .. } = scan {
                if !self.0.contains(user_id) {
                    self.0.push(user_id.clone());
                }
            }
        }
    }

    /// The owners still to come, in log order.
    pub(super) fn owners(&self) -> &[String] {
        &self.0
    }

    /// `owner`'s scan runs now: whether it was expected.
    pub(super) fn arrived(&mut self, owner: &str) -> bool {
        match self.0.iter().position(|o| o == owner) {
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
        assert_eq!(c.0, ["u1", "u2"]);
        assert!(c.arrived("u1") && !c.arrived("u1"), "once");
        assert!(!c.arrived("u7"), "not expected");
        c.expect(&[posts("u3")]);
        assert_eq!(c.0, ["u3"], "a new window replaces the last");
    }
}
