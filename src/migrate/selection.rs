//! What a copy leaves out and how it signs: the tenants dropped from the
//! log (off-boarding, erasure), and the signature each message of denorm's
//! own carries into the new topic.

use std::collections::BTreeSet;

use rdkafka::message::{Message, OwnedHeaders, OwnedMessage};

use crate::codec::Codec;
use crate::kafka::KafkaConfig;
use crate::signing::Provenance;

/// The copy's choices besides the topics.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Tenants whose messages are not copied: every message keyed with the
    /// tenant's scope (its commands, its keys' move chunks and control
    /// messages).
    pub drop_tenants: BTreeSet<String>,
    /// Sign the messages of denorm's own that carry no valid signature in
    /// the old topic (signing turned on for a history the operator
    /// trusts). Without it they are copied unsigned, and workers with the
    /// keys dead-letter them as forged, as they would in the old topic.
    pub sign_unsigned: bool,
}

/// How a message of denorm's own was copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signed {
    /// Not one of denorm's own, or no keys: copied without a signature.
    NotSigned,
    /// Signed in the old topic, signed for the new.
    Kept,
    /// Without a valid signature in the old topic and signed for the new
    /// (`sign_unsigned`).
    Anew,
    /// Without a valid signature in the old topic, copied without one.
    Unsigned,
}

impl Selection {
    /// Whether the message keyed `key` is left out.
    pub fn drops(&self, key: Option<&[u8]>) -> bool {
        if self.drop_tenants.is_empty() {
            return false;
        }
        crate::command::tenant::of_key(key).is_some_and(|t| self.drop_tenants.contains(t))
    }

    /// The headers of `m`'s copy into `to`, carrying `payload` (the copy's
    /// payload, rewritten or not): a signature when it is one of denorm's
    /// own messages, the topics have keys, and it was signed in `from` or
    /// `sign_unsigned` says to sign it.
    pub fn headers(&self, codec: &Codec, from: &KafkaConfig, to: &KafkaConfig, m: &OwnedMessage, payload: Option<&[u8]>) -> (OwnedHeaders, Signed) {
        let (Some(keys), Some(payload)) = (to.signing.as_deref(), payload) else { return (OwnedHeaders::new(), Signed::NotSigned) };
        if !codec.is_denorms_own(payload) {
            return (OwnedHeaders::new(), Signed::NotSigned);
        }
        let was = match from.signing.as_deref() {
            Some(k) => k.check(&from.topic, m.key(), m.payload().unwrap_or_default(), crate::signing::signature_in(m.headers()).as_deref()),
            None => Provenance::Unsigned,
        };
        let signed = match (was, self.sign_unsigned) {
            (Provenance::Signed, _) => Signed::Kept,
            (_, true) => Signed::Anew,
            (_, false) => return (OwnedHeaders::new(), Signed::Unsigned),
        };
        (crate::signing::headers(Some(keys), &to.topic, m.key(), payload), signed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_tenant_is_matched_by_its_scope_only() {
        let s = Selection { drop_tenants: ["acme".to_string()].into(), sign_unsigned: false };
        assert!(s.drops(Some(b"acme\x1f/docs")));
        assert!(s.drops(Some(b"acme\x1fu1")));
        // Another tenant whose name begins with the dropped one's, the
        // default tenant, and keyless messages (PLACE) stay.
        assert!(!s.drops(Some(b"acme-corp\x1f/docs")));
        assert!(!s.drops(Some(b"/acme")));
        assert!(!s.drops(None));
        assert!(!Selection::default().drops(Some(b"acme\x1f/docs")));
    }
}
