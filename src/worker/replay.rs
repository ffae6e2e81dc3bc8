//! What a worker feeds: the live index, or a replay of the log into a copy
//! of it (`denorm rebuild`, `denorm verify`). One setting,
//! [`WorkerConfig::mode`](super::WorkerConfig::mode), says which, instead of
//! a flag per difference: what a replay does not do (commit the group's
//! offsets, write to Kafka again, count repairs again) and what only a
//! replay does (stop at given offsets, take some keys only, accept gaps)
//! are read from it.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::dlq::MarkerId;

/// What the worker feeds.
#[derive(Debug, Clone, Default)]
pub enum Mode {
    /// The live index (`denorm run`): the group's offsets are committed,
    /// and dead letters, markers and a move's chunks are written to Kafka.
    #[default]
    Live,
    /// A replay of the log into a copy of the index.
    Replay(Replay),
}

/// A replay of the log into a copy of the index. Its group's offsets are
/// never committed (positions come from the copy's checkpoints), and what
/// the live run already wrote to the dead-letter topic is not written
/// again.
#[derive(Debug, Clone, Default)]
pub struct Replay {
    /// Markers the dead-letter topic already holds: the operators' requests
    /// the live run carried out, which the replay replays without writing
    /// their markers again.
    pub markers_written: Arc<HashSet<MarkerId>>,
    /// The dead-letter offsets of the letters the live run wrote, by the
    /// command partition and offset whose handling wrote them. A key parked
    /// in a replay records the live letter's offset, not the one its own
    /// write got: an operator's request of an earlier format says which
    /// letters it covers by dead-letter offset alone (review of verify,
    /// F15).
    pub letters_written: Arc<LettersWritten>,
    pub of: ReplayOf,
}

/// Whose replay it is, and what only that one does.
#[derive(Debug, Clone)]
pub enum ReplayOf {
    /// `denorm rebuild`'s, into a new generation.
    Rebuild {
        /// Apply what is left of a partition whose offsets retention
        /// deleted before the index applied them (`--accept-gaps`), instead
        /// of stopping it.
        accept_gaps: bool,
    },
    /// `denorm rebuild --tenant`'s, into new indexes of one tenant's own:
    /// the other tenants' messages are passed as applied, without effect.
    Tenant {
        /// The tenant's keys (a sample of one tenant, all its keys).
        keys: Arc<KeySample>,
    },
    /// `denorm verify`'s, into a scratch copy. It writes nothing to Kafka:
    /// what it would write is already there (the live run wrote it), so it
    /// goes on as if written.
    Verify {
        /// Where it stops: per partition the last offset applied, -1 or
        /// absent for none; later messages are received and not applied.
        until: Arc<BTreeMap<i32, i64>>,
        /// Some keys only (`--keys`, `--sample`): the other keys' messages
        /// are passed as applied, without effect.
        keys: Option<Arc<KeySample>>,
    },
}

impl Default for ReplayOf {
    fn default() -> Self {
        ReplayOf::Rebuild { accept_gaps: false }
    }
}

impl Mode {
    /// Whether this worker replays the log into a copy of the index rather
    /// than serving the live one: what the live workers count (repairs) it
    /// does not count again.
    pub fn is_replay(&self) -> bool {
        matches!(self, Mode::Replay(_))
    }

    fn replay(&self) -> Option<&Replay> {
        match self {
            Mode::Live => None,
            Mode::Replay(r) => Some(r),
        }
    }

    /// A verify's replay's stop and keys.
    fn verify(&self) -> Option<(&BTreeMap<i32, i64>, Option<&KeySample>)> {
        match self.replay().map(|r| &r.of) {
            Some(ReplayOf::Verify { until, keys }) => Some((until, keys.as_deref())),
            _ => None,
        }
    }

    /// Whether the group's offsets are committed: only by the live workers.
    pub fn commits_offsets(&self) -> bool {
        !self.is_replay()
    }

    /// Whether dead letters, markers and a move's chunks are written to
    /// Kafka: by everyone but a verify's replay.
    pub fn writes_to_kafka(&self) -> bool {
        self.verify().is_none()
    }

    /// Whether the marker `id` is already in the dead-letter topic (a
    /// replay's knowledge; the live workers write every marker).
    pub fn marker_written(&self, id: &MarkerId) -> bool {
        self.replay().is_some_and(|r| r.markers_written.contains(id))
    }

    /// The live run's letter for the command at `(partition, offset)`,
    /// when this is a replay that knows it.
    pub fn letter_written(&self, partition: i32, offset: i64) -> Option<i64> {
        self.replay().and_then(|r| r.letters_written.get(&(partition, offset)).copied())
    }

    /// Whether a partition's offsets deleted by retention are applied past.
    pub fn accepts_gaps(&self) -> bool {
        matches!(self.replay().map(|r| &r.of), Some(ReplayOf::Rebuild { accept_gaps: true }))
    }

    /// The last offset a verify's replay applies in `partition` (-1:
    /// none); `None` when the worker does not stop at given offsets.
    pub fn until(&self, partition: i32) -> Option<i64> {
        self.verify().map(|(until, _)| until.get(&partition).copied().unwrap_or(-1))
    }

    /// The keys a verify's or a tenant's rebuild's replay takes, when it
    /// takes some only.
    pub fn keys(&self) -> Option<&KeySample> {
        match self.replay().map(|r| &r.of) {
            Some(ReplayOf::Tenant { keys }) => Some(keys),
            _ => self.verify().and_then(|(_, keys)| keys),
        }
    }
}

/// See [`Replay::letters_written`].
pub type LettersWritten = std::collections::HashMap<(i32, i64), i64>;

/// [`LettersWritten`] of the letters `entries` of a dead-letter topic: a
/// command dead-lettered more than once (re-applied after a crash) keeps
/// its last letter's offset, as the live run's parking did.
pub fn letters_written(entries: &[crate::dlq::admin::Entry]) -> LettersWritten {
    let mut out = LettersWritten::new();
    for e in entries {
        let at = out.entry((e.origin_partition, e.at.unwrap_or(e.origin_offset))).or_insert(e.dlq_offset);
        *at = (*at).max(e.dlq_offset);
    }
    out
}

/// Keys chosen by name, or a share of all keys chosen by a hash of the
/// key (the same keys on every run), or both; or one tenant's keys, all
/// of them or those chosen so.
#[derive(Debug, Clone, Default)]
pub struct KeySample {
    /// Keys as they are on the wire (scoped to their tenant).
    pub keys: std::collections::BTreeSet<String>,
    /// Only this tenant's keys (`--tenant`): all of them, unless `keys`
    /// or `percent` choose some.
    pub tenant: Option<String>,
    /// Percent of all keys, 0 to 100.
    pub percent: Option<f64>,
    /// Which sample of that share: another number chooses other keys (0:
    /// the sample of earlier versions). Review of verify, F8: a sample that
    /// never rotates never looks at the other keys.
    pub rotation: u64,
}

impl KeySample {
    /// Whether `key` is in the sample. A message without a key is not.
    pub fn admits(&self, key: &str) -> bool {
        if let Some(t) = &self.tenant {
            if crate::command::tenant::of(key) != Some(t.as_str()) {
                return false;
            }
            if self.keys.is_empty() && self.percent.is_none() {
                return true;
            }
        }
        if self.keys.contains(key) {
            return true;
        }
        // A hash of its own, not the partitioner's (whose buckets the
        // sample would follow).
        let salted = match self.rotation {
            0 => format!("denorm-sample:{key}"),
            r => format!("denorm-sample:{r}:{key}"),
        };
        self.percent.is_some_and(|p| (crate::command::partitioner::partition_of(&salted, 10_000) as f64) < p * 100.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_mode_does_what_its_replay_says() {
        let live = Mode::Live;
        assert!(!live.is_replay() && live.commits_offsets() && live.writes_to_kafka() && !live.accepts_gaps());
        assert_eq!((live.until(0), live.keys().is_some()), (None, false));
        let id: MarkerId = ("/k".into(), 0, crate::dlq::MarkerKind::Cleared, 3);
        let letters: LettersWritten = [((1, 7), 40)].into();
        let rebuild = Mode::Replay(Replay { markers_written: Arc::new([id.clone()].into()), letters_written: Arc::new(letters.clone()), of: ReplayOf::Rebuild { accept_gaps: true } });
        assert!(rebuild.is_replay() && !rebuild.commits_offsets() && rebuild.writes_to_kafka() && rebuild.accepts_gaps());
        assert!(rebuild.marker_written(&id) && !live.marker_written(&id));
        assert_eq!((rebuild.letter_written(1, 7), rebuild.letter_written(1, 8), live.letter_written(1, 7)), (Some(40), None, None));
        assert_eq!(rebuild.until(0), None);
        let sample = KeySample { keys: ["/a".to_string()].into(), ..Default::default() };
        let verify = Mode::Replay(Replay { letters_written: Arc::new(letters), of: ReplayOf::Verify { until: Arc::new([(0, 5)].into()), keys: Some(Arc::new(sample)) }, ..Default::default() });
        assert!(verify.is_replay() && !verify.commits_offsets() && !verify.writes_to_kafka() && !verify.accepts_gaps());
        assert_eq!((verify.until(0), verify.until(3)), (Some(5), Some(-1)));
        assert!(verify.keys().is_some_and(|k| k.admits("/a") && !k.admits("/b")));
        assert_eq!(verify.letter_written(1, 7), Some(40));
    }

    /// Named keys are in; a percent takes about that share of all keys,
    /// the same ones every time.
    #[test]
    fn a_sample_takes_its_named_keys_and_about_its_share_of_the_others() {
        let named = KeySample { keys: ["/a".to_string()].into(), percent: None, rotation: 0, tenant: None };
        assert!(named.admits("/a") && !named.admits("/b"));
        let half = KeySample { keys: Default::default(), percent: Some(50.0), rotation: 0, tenant: None };
        let chosen: Vec<bool> = (0..2000).map(|i| half.admits(&format!("/k{i}"))).collect();
        let n = chosen.iter().filter(|c| **c).count();
        assert!((850..1150).contains(&n), "{n} of 2000 keys in a 50% sample");
        assert_eq!(chosen, (0..2000).map(|i| half.admits(&format!("/k{i}"))).collect::<Vec<_>>());
        let all = KeySample { keys: Default::default(), percent: Some(100.0), rotation: 0, tenant: None };
        assert!((0..2000).all(|i| all.admits(&format!("/k{i}"))));
    }

    /// Issue 47: a tenant's sample is its keys, all of them or those
    /// chosen among them, and never another tenant's or the default's.
    #[test]
    fn a_tenants_sample_takes_only_its_keys() {
        let acme = KeySample { tenant: Some("acme".into()), ..Default::default() };
        assert!(acme.admits("acme\u{1f}/a") && acme.admits("acme\u{1f}7"));
        assert!(!acme.admits("/a") && !acme.admits("globex\u{1f}/a") && !acme.admits("acme"));
        let named = KeySample { tenant: Some("acme".into()), keys: ["acme\u{1f}/a".to_string()].into(), ..Default::default() };
        assert!(named.admits("acme\u{1f}/a") && !named.admits("acme\u{1f}/b"));
        let all = KeySample { tenant: Some("acme".into()), percent: Some(100.0), ..Default::default() };
        assert!(all.admits("acme\u{1f}/b") && !all.admits("/b"));
    }

    /// Review of verify, F8: the sample was always the same keys. Another
    /// rotation takes about the same share of other keys; the same
    /// rotation, the same keys.
    #[test]
    fn another_rotation_of_a_sample_takes_other_keys() {
        let sample = |rotation| KeySample { keys: Default::default(), percent: Some(10.0), rotation, tenant: None };
        let chosen = |s: &KeySample| (0..5000).filter(|i| s.admits(&format!("/k{i}"))).collect::<std::collections::BTreeSet<_>>();
        let (day1, day2) = (chosen(&sample(20_000)), chosen(&sample(20_001)));
        assert!((400..600).contains(&day1.len()) && (400..600).contains(&day2.len()), "{} {}", day1.len(), day2.len());
        assert!(day1.intersection(&day2).count() < 100, "two rotations share {} of ~500 keys", day1.intersection(&day2).count());
        assert_eq!(day1, chosen(&sample(20_000)));
    }
}
