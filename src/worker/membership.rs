//! Whether the worker's membership of the group is making progress: a
//! rebalance that does not complete, or a worker left holding no partition
//! while the group has lag (seen on two Kafka emulators, tansu and
//! noida-db's, after members were killed: neither started a rebalance when
//! a dead member's session expired, and the live members waited with no
//! partition for good; docs/reliability.md). Decisions only, in-process:
//! the consumer loop acts on them.

use std::time::{Duration, Instant};

/// What the consumer loop is told to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Fine,
    /// A rebalance has not completed for this long (said once per
    /// rebalance).
    RebalanceStuck(Duration),
    /// No partition held for this long while the group has this much lag:
    /// leave the group and join it again, as a new member would.
    Rejoin {
        idle: Duration,
        lag: i64,
    },
}

/// The state of this member, as the rebalance callbacks see it.
#[derive(Debug)]
pub(crate) struct Membership {
    /// A stalled membership is acted on after this (the group's session
    /// timeout: a broker evicts a silent member by then).
    patience: Duration,
    /// Since when a rebalance is in progress (revoked or joining, no
    /// assignment yet).
    rebalancing: Option<Instant>,
    warned: bool,
    /// Since when this member holds no partition.
    empty: Option<Instant>,
}

impl Membership {
    /// A member that is joining (nothing held yet).
    pub(crate) fn joining(now: Instant, patience: Duration) -> Self {
        Membership { patience, rebalancing: Some(now), warned: false, empty: Some(now) }
    }

    /// Partitions were revoked: a rebalance is under way.
    pub(crate) fn revoked(&mut self, now: Instant, holding: usize) {
        self.rebalancing.get_or_insert(now);
        self.held(now, holding);
    }

    /// An assignment arrived: the rebalance is over.
    pub(crate) fn assigned(&mut self, now: Instant, holding: usize) {
        self.rebalancing = None;
        self.warned = false;
        self.held(now, holding);
    }

    fn held(&mut self, now: Instant, holding: usize) {
        if holding > 0 {
            self.empty = None;
        } else {
            self.empty.get_or_insert(now);
        }
    }

    /// How long the current rebalance has taken (zero when none is under way).
    pub(crate) fn rebalance_age(&self, now: Instant) -> Duration {
        self.rebalancing.map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
    }

    /// Whether the lag of the group matters now: this member has held no
    /// partition for at least the patience.
    pub(crate) fn idle_for(&self, now: Instant) -> Option<Duration> {
        self.empty.map(|t| now.saturating_duration_since(t)).filter(|d| *d >= self.patience)
    }

    /// What to do, given the group's lag (`None`: not known).
    pub(crate) fn check(&mut self, now: Instant, group_lag: Option<i64>) -> Verdict {
        if let (Some(idle), Some(lag)) = (self.idle_for(now), group_lag) {
            if lag > 0 {
                // Joining again is a rebalance: patience starts over.
                self.rebalancing = Some(now);
                self.warned = false;
                self.empty = Some(now);
                return Verdict::Rejoin { idle, lag };
            }
        }
        let age = self.rebalance_age(now);
        if age >= self.patience && !std::mem::replace(&mut self.warned, true) {
            return Verdict::RebalanceStuck(age);
        }
        Verdict::Fine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(45);

    #[test]
    fn a_member_holding_nothing_past_the_session_timeout_rejoins_only_while_the_group_has_lag() {
        let t0 = Instant::now();
        let mut m = Membership::joining(t0, S);
        m.assigned(t0 + Duration::from_secs(1), 0);
        // Before the patience: nothing, whatever the lag.
        assert_eq!(m.check(t0 + Duration::from_secs(30), Some(8)), Verdict::Fine);
        // Idle without lag (more members than partitions): nothing.
        assert_eq!(m.check(t0 + Duration::from_secs(60), Some(0)), Verdict::Fine);
        assert_eq!(m.check(t0 + Duration::from_secs(60), None), Verdict::Fine);
        // Idle with lag: rejoin, once; patience starts over.
        assert_eq!(m.check(t0 + Duration::from_secs(61), Some(8)), Verdict::Rejoin { idle: Duration::from_secs(61), lag: 8 }, "idle since it joined");
        assert_eq!(m.check(t0 + Duration::from_secs(62), Some(8)), Verdict::Fine);
        assert_eq!(m.check(t0 + Duration::from_secs(61 + 45), Some(8)), Verdict::Rejoin { idle: S, lag: 8 });
    }

    #[test]
    fn a_member_holding_partitions_never_rejoins() {
        let t0 = Instant::now();
        let mut m = Membership::joining(t0, S);
        m.assigned(t0, 3);
        assert_eq!(m.check(t0 + Duration::from_secs(600), Some(1_000)), Verdict::Fine);
        assert_eq!(m.rebalance_age(t0 + Duration::from_secs(600)), Duration::ZERO);
    }

    #[test]
    fn a_rebalance_that_does_not_complete_is_reported_once() {
        let t0 = Instant::now();
        let mut m = Membership::joining(t0, S);
        m.assigned(t0, 2);
        m.revoked(t0 + Duration::from_secs(10), 0);
        assert_eq!(m.rebalance_age(t0 + Duration::from_secs(20)), Duration::from_secs(10));
        assert_eq!(m.check(t0 + Duration::from_secs(40), None), Verdict::Fine);
        assert_eq!(m.check(t0 + Duration::from_secs(56), None), Verdict::RebalanceStuck(Duration::from_secs(46)));
        assert_eq!(m.check(t0 + Duration::from_secs(80), None), Verdict::Fine, "said once");
        // Once it completes, the next one is reported again.
        m.assigned(t0 + Duration::from_secs(90), 2);
        assert_eq!(m.rebalance_age(t0 + Duration::from_secs(91)), Duration::ZERO);
        m.revoked(t0 + Duration::from_secs(100), 0);
        assert_eq!(m.check(t0 + Duration::from_secs(150), None), Verdict::RebalanceStuck(Duration::from_secs(50)));
    }

    #[test]
    fn a_stuck_rebalance_with_lag_ends_in_a_rejoin() {
        let t0 = Instant::now();
        let mut m = Membership::joining(t0, S);
        m.assigned(t0, 4);
        m.revoked(t0 + Duration::from_secs(5), 0);
        assert_eq!(m.check(t0 + Duration::from_secs(51), Some(8)), Verdict::Rejoin { idle: Duration::from_secs(46), lag: 8 });
        assert_eq!(m.rebalance_age(t0 + Duration::from_secs(52)), Duration::from_secs(1), "the rejoin is a rebalance of its own");
    }
}
