//! Whose fan-out in a key lane runs the next page (issue 47): the tenants
//! in turn, and within a tenant its keys in turn. Taking the keys alone in
//! turn gave a tenant running seven renames seven pages for each of another
//! tenant's one. No I/O.

use std::collections::VecDeque;

use crate::command::tenant;

/// The keys whose fan-out runs, in turn by tenant.
#[derive(Debug, Default)]
pub(super) struct Turn {
    /// Every key in turn, in the order its tenant's pages go to them.
    keys: VecDeque<String>,
    /// The tenants with a key in turn, the next one first.
    tenants: VecDeque<Option<String>>,
}

impl Turn {
    /// Keys in turn.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Keys of tenant `t` in turn (the lanes it takes).
    pub fn of_tenant(&self, t: Option<&str>) -> usize {
        self.keys.iter().filter(|k| tenant::of(k) == t).count()
    }

    /// `key`'s fan-out runs (it started, or ran a page and is not done): it
    /// goes behind its tenant's other keys, and its tenant, if it had no
    /// key in turn, behind the other tenants.
    pub fn push(&mut self, key: String) {
        let t = tenant::of(&key).map(str::to_string);
        if !self.tenants.contains(&t) {
            self.tenants.push_back(t);
        }
        self.keys.push_back(key);
    }

    /// The key whose fan-out runs the next page, taken out of turn (put it
    /// back with [`Turn::push`] unless its fan-out is done): the first key
    /// of the next tenant.
    pub fn next(&mut self) -> Option<String> {
        while let Some(t) = self.tenants.pop_front() {
            let Some(at) = self.keys.iter().position(|k| tenant::of(k) == t.as_deref()) else { continue };
            let key = self.keys.remove(at).expect("found");
            if self.keys.iter().any(|k| tenant::of(k) == t.as_deref()) {
                self.tenants.push_back(t);
            }
            return Some(key);
        }
        None
    }

    pub fn clear(&mut self) {
        self.keys.clear();
        self.tenants.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys served by `n` pages, each put back after its page.
    fn serve(turn: &mut Turn, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                let k = turn.next().expect("a key in turn");
                turn.push(k.clone());
                k
            })
            .collect()
    }

    #[test]
    fn tenants_take_turns_whatever_their_number_of_fan_outs() {
        let mut turn = Turn::default();
        for k in ["acme\u{1f}/a1", "acme\u{1f}/a2", "acme\u{1f}/a3", "globex\u{1f}/b", "/d"] {
            turn.push(k.into());
        }
        let served = serve(&mut turn, 9);
        assert_eq!(served, ["acme\u{1f}/a1", "globex\u{1f}/b", "/d", "acme\u{1f}/a2", "globex\u{1f}/b", "/d", "acme\u{1f}/a3", "globex\u{1f}/b", "/d"]);
        assert_eq!(turn.len(), 5);
    }

    #[test]
    fn one_tenants_keys_keep_their_turns_and_a_finished_one_leaves() {
        let mut turn = Turn::default();
        for k in ["/a", "/b", "/c"] {
            turn.push(k.into());
        }
        assert_eq!(serve(&mut turn, 4), ["/a", "/b", "/c", "/a"]);
        // `/b` finishes: not put back.
        assert_eq!(turn.next().as_deref(), Some("/b"));
        assert_eq!(serve(&mut turn, 3), ["/c", "/a", "/c"]);
        turn.clear();
        assert!(turn.is_empty() && turn.next().is_none());
    }

    #[test]
    fn a_tenant_whose_last_fan_out_ended_rejoins_behind_the_others() {
        let mut turn = Turn::default();
        for k in ["acme\u{1f}/a", "globex\u{1f}/b1", "globex\u{1f}/b2"] {
            turn.push(k.into());
        }
        assert_eq!(turn.next().as_deref(), Some("acme\u{1f}/a"), "acme's only fan-out finishes");
        assert_eq!(serve(&mut turn, 2), ["globex\u{1f}/b1", "globex\u{1f}/b2"]);
        turn.push("acme\u{1f}/a9".into());
        assert_eq!(serve(&mut turn, 3), ["globex\u{1f}/b1", "acme\u{1f}/a9", "globex\u{1f}/b2"]);
    }
}
