//! Dead letters and parking: a command given up on is written to the
//! dead-letter topic before its offset may be committed, and its key parked
//! behind it.

use super::*;

/// Where a message came from, for its dead letter. A replayed command keeps
/// the offset it was first written at.
pub(super) struct Origin<'a> {
    pub(super) key: Option<&'a [u8]>,
    pub(super) payload: Option<&'a [u8]>,
    pub(super) offset: i64,
    /// The command-topic offset of the message being handled (a replay's
    /// is its `REPLAY`'s): see [`crate::dlq::header::AT`].
    pub(super) at: i64,
}

impl<'a> Origin<'a> {
    /// The message key as parking knows it (borrowed when it is UTF-8).
    pub(super) fn key(&self) -> Option<std::borrow::Cow<'a, str>> {
        self.key.filter(|k| !k.is_empty()).map(String::from_utf8_lossy)
    }

    /// The abort that parked its key, handled again (read again after a
    /// restart, recorded neither below the checkpoint nor done above it):
    /// the key is as it was before the abort, parked again only if the
    /// command aborts again. It stayed parked behind a command that then
    /// succeeded (review of lanes, F15). Cheap when nothing is parked.
    pub(super) fn handled_again(&self, shard: &mut dyn Shard) {
        let parking = shard.parking();
        if parking.is_empty() {
            return;
        }
        if let Some(k) = self.key() {
            if parking.get(k.as_ref()).is_some_and(|p| p.since == self.at) {
                parking.remove(k.as_ref());
            }
        }
    }

    /// What the key is parked behind, if it is parked. Cheap when nothing is.
    pub(super) fn parked_behind(&self, shard: &mut dyn Shard) -> Option<String> {
        let parking = shard.parking();
        if parking.is_empty() {
            return None;
        }
        parking.get(self.key()?.as_ref()).filter(|p| self.at > p.since).map(|p| p.behind.clone())
    }
}

impl Applier {
    /// Aborts `msg` after the index refused its writes at commit time.
    pub(super) fn abort_message(&self, shard: &mut dyn Shard, msg: &Record, error: &IndexError, attempts: u32) -> Step<Handled> {
        let (key, max) = (msg.key(), self.shared.cfg.max_message_bytes);
        let mut chunk = None;
        let (payload, offset, command_id) = match admit(&self.shared.codec, key, msg.payload(), max) {
            Ok(Admitted::Command(e)) => (msg.payload().map(<[u8]>::to_vec), msg.offset(), Some(e.command_id)),
            // A replay: the letter is the replayed command.
            Ok(Admitted::Control(c)) => {
                let id = match admit(&self.shared.codec, key, Some(&c.payload), max) {
                    Ok(Admitted::Command(e)) => Some(e.command_id),
                    _ => None,
                };
                (Some(c.payload), c.origin_offset, id)
            }
            Ok(Admitted::Move(mv)) => {
                chunk = Some(mv);
                (msg.payload().map(<[u8]>::to_vec), msg.offset(), None)
            }
            Err(_) => (msg.payload().map(<[u8]>::to_vec), msg.offset(), None),
        };
        let origin = Origin { key, payload: payload.as_deref(), offset, at: msg.offset() };
        let handled = self.abort(shard, &origin, dlq::reason::INDEX_REJECTED, error.to_string(), attempts, command_id)?;
        if let Some(mv) = chunk {
            // A chunk: dead-lettered with its files, its part in the move
            // played without them, so that the move ends.
            return self.move_in(shard, msg, &crate::command::moves::MoveIn { files: Vec::new(), ..mv });
        }
        self.mark(shard, msg);
        Ok(handled)
    }

    pub(super) fn parked_gauge(&self, shard: &mut dyn Shard) {
        gauge!(m::PARKED_KEYS, "partition" => self.partition.to_string()).set(shard.parking().len() as f64);
    }

    /// Dead-letters a command given up on and, with `--on-abort=park`,
    /// parks its key.
    pub(super) fn abort(&self, shard: &mut dyn Shard, origin: &Origin<'_>, reason: &'static str, detail: String, attempts: u32, command_id: Option<String>) -> Step<Handled> {
        self.abort_parking(shard, origin, reason, detail, attempts, command_id, true)
    }

    /// [`Applier::abort`], parking the key only if `parks` (a rejected
    /// message that names another tenant than its key's parks nothing).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn abort_parking(&self, shard: &mut dyn Shard, origin: &Origin<'_>, reason: &'static str, detail: String, attempts: u32, command_id: Option<String>, parks: bool) -> Step<Handled> {
        let behind = command_id.clone().unwrap_or_else(|| format!("p{}@{}", self.partition, origin.offset));
        // Parked keys are kept in every checkpoint: a partition parks at
        // most `--max-parked-keys`, whoever writes the keys.
        let (cap, parking) = (self.shared.cfg.max_parked_keys, shard.parking());
        let full = parks && origin.key().is_some_and(|k| parking.len() >= cap && parking.get(k.as_ref()).is_none());
        let detail = match full {
            true => format!("{detail} (its key is not parked: the partition parks {cap} keys already, --max-parked-keys; its later commands are applied)"),
            false => detail,
        };
        let at = self.dead_letter(origin, reason, detail.clone(), attempts, command_id, None)?;
        error!(partition = self.partition, offset = origin.offset, reason, %detail, key = ?origin.key().as_deref().map(crate::command::tenant::Shown), dlq_offset = at, "command aborted and dead-lettered");
        if full {
            counter!(m::PARKING_REFUSED_TOTAL, "partition" => self.partition.to_string()).increment(1);
            return Ok(Handled::Done { fan_out: false });
        }
        if let (OnAbort::Park, Some(k), true) = (self.shared.cfg.on_abort, origin.key(), parks) {
            warn!(partition = self.partition, key = %crate::command::tenant::Shown(&k), "key parked: its later commands wait in the dead-letter topic for `denorm dlq reprocess` or `clear`");
            let p = shard.parking().entry(k.into_owned()).or_insert(Parked { behind: String::new(), last_dlq: -1, replayed_through: -1, last_at: -1, since: -1 });
            p.behind = behind;
            p.since = origin.at;
            p.last_dlq = self.live_letter(origin).unwrap_or(at);
            p.last_at = origin.at;
        }
        Ok(Handled::Done { fan_out: false })
    }

    /// Dead-letters a command of a parked key.
    pub(super) fn park(&self, shard: &mut dyn Shard, origin: &Origin<'_>, command_id: Option<String>, behind: String, kind: &'static str) -> Step<Handled> {
        let detail = format!("its key is parked behind command {behind}");
        let at = self.dead_letter(origin, dlq::reason::PARKED, detail, 0, command_id, Some(behind))?;
        count(kind, outcome::PARKED);
        let live = self.live_letter(origin);
        if let Some(p) = origin.key().and_then(|k| shard.parking().get_mut(k.as_ref())) {
            p.last_dlq = live.unwrap_or(at);
            p.last_at = origin.at;
        }
        Ok(Handled::Done { fan_out: false })
    }

    /// In a replay, the dead-letter offset of the letter the live run
    /// wrote for `origin` (see [`Replay::letters_written`](crate::worker::Replay::letters_written)).
    fn live_letter(&self, origin: &Origin<'_>) -> Option<i64> {
        self.shared.cfg.mode.letter_written(self.partition, origin.at)
    }

    /// Writes the letter of `origin`, retrying for as long as the
    /// dead-letter topic fails. Its offset there.
    pub(super) fn dead_letter(&self, origin: &Origin<'_>, reason: &'static str, detail: String, attempts: u32, command_id: Option<String>, parked_behind: Option<String>) -> Step<i64> {
        let mut letter = Letter {
            key: origin.key,
            payload: origin.payload,
            reason,
            detail,
            origin_partition: self.partition,
            origin_offset: origin.offset,
            at: origin.at,
            attempts,
            command_id,
            parked_behind,
            payload_omitted: None,
        };
        let mut retry = self.retrying(Op::DeadLetter);
        let at = loop {
            match self.shared.outbox.dead_letter(&letter) {
                Ok(at) => break at,
                // Over the topic's limit for good: the letter goes without
                // the command, which stays in the command topic.
                Err(e) if crate::dlq::writer::too_large(&e) && letter.payload.is_some() => {
                    let n = letter.payload.take().map_or(0, <[u8]>::len);
                    warn!(
                        partition = self.partition,
                        offset = origin.offset,
                        bytes = n,
                        "the command is over the dead-letter topic's message limit: its letter carries its place in the command topic instead"
                    );
                    letter.payload_omitted = Some(n);
                    letter.detail = format!("{} (the command, {n} bytes, is not in this letter: over the topic's message limit; it stays in the command topic at its origin)", letter.detail);
                }
                Err(e) => retry.failed(&format_args!("{e} (topic {}; nothing is committed past this message meanwhile)", self.shared.outbox.dead_letter_topic()))?,
            }
        };
        counter!(m::DEAD_LETTERS_TOTAL, "reason" => reason).increment(1);
        m::tenants::dead_lettered(origin.key, reason);
        Ok(at)
    }

    pub(super) fn retry_dead_letter(&self, mut write: impl FnMut() -> Result<i64, rdkafka::error::KafkaError>) -> Step<i64> {
        let mut retry = self.retrying(Op::DeadLetter);
        loop {
            match write() {
                Ok(at) => return Ok(at),
                Err(e) => retry.failed(&format_args!("{e} (topic {}; nothing is committed past this message meanwhile)", self.shared.outbox.dead_letter_topic()))?,
            }
        }
    }
}
