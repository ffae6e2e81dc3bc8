//! Which of the N processes of one replay this is: the members of a
//! `denorm rebuild` (see `rebuild::members`) or of a `denorm verify`, run as
//! a Kubernetes Job with `parallelism` and `completions` N in `Indexed`
//! mode, each pod given its completion index.

/// Member `me` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Members {
    pub count: u32,
    /// Member 0 leads: it begins a rebuild, decides its stop and cuts over.
    pub me: u32,
}

impl Default for Members {
    fn default() -> Self {
        Members { count: 1, me: 0 }
    }
}

impl Members {
    /// Member `me` of `count`, or why not.
    pub fn new(count: u32, me: u32) -> Result<Self, String> {
        match (count, me) {
            (0, _) => Err("there is at least one member".into()),
            (n, i) if i >= n => Err(format!("member {i} of {n}: members are numbered 0 to {}", n - 1)),
            (count, me) => Ok(Members { count, me }),
        }
    }

    pub fn leads(&self) -> bool {
        self.me == 0
    }

    /// The other members.
    pub fn others(&self) -> impl Iterator<Item = u32> + use<> {
        let me = self.me;
        (0..self.count).filter(move |i| *i != me)
    }

    /// Whether this member's share of a fixed split holds `partition`
    /// (`denorm verify --members`): partitions `me`, `me + count`, …
    pub fn owns(&self, partition: i32) -> bool {
        partition.rem_euclid(self.count as i32) == self.me as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_split_gives_every_partition_to_exactly_one_member() {
        for count in 1..=5 {
            for p in 0..17 {
                let owners: Vec<u32> = (0..count).filter(|me| Members::new(count, *me).unwrap().owns(p)).collect();
                assert_eq!(owners.len(), 1, "partition {p} of {count} members: {owners:?}");
            }
        }
        assert!(Members::new(2, 2).unwrap_err().contains("0 to 1"));
        assert!(Members::new(0, 0).is_err());
        assert_eq!(Members::new(3, 1).unwrap().others().collect::<Vec<_>>(), vec![0, 2]);
    }
}
