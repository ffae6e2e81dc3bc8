//! Admission of a message: everything checked before a command is applied,
//! each failure with its own reason (the label of
//! `denorm_messages_rejected_total`, and later the dead-letter reason).

use crate::codec::{Codec, DecodeError, Decoded};
use crate::command::control::Control;
use crate::command::Envelope;

/// An admitted message.
#[derive(Debug, Clone, PartialEq)]
pub enum Admitted {
    Command(Envelope),
    /// An operator's control message (`denorm dlq`).
    Control(Control),
    /// A chunk of a cross-key move, written by the source's worker.
    Move(crate::command::moves::MoveIn),
}

/// Why a message is not admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotAdmitted {
    /// For good: the message is dead-lettered.
    Rejected(Rejection),
    /// Not now (the schema registry is unavailable): retry the message.
    Unavailable(String),
}

/// Why a message is not applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Low-cardinality reason.
    pub reason: &'static str,
    pub detail: String,
    /// A chunk of a cross-key move that decoded but is not valid here: the
    /// destination dead-letters it and still plays its part in its move
    /// (without its files), so that the move ends.
    pub chunk: Option<Box<crate::command::moves::MoveIn>>,
    /// Whether the message's key is parked behind it (with `--on-abort
    /// park`): not when the message names another tenant than its key's,
    /// since a producer of one tenant must not hold another tenant's key.
    pub parks: bool,
}

pub mod reason {
    pub const EMPTY_PAYLOAD: &str = "empty_payload";
    pub const OVERSIZED: &str = "oversized";
    pub const NOT_SINGLE_OBJECT: &str = "not_single_object";
    pub const UNKNOWN_SCHEMA: &str = "unknown_schema";
    pub const UNDECODABLE: &str = "undecodable";
    pub const INVALID_COMMAND: &str = "invalid_command";
    pub const MISSING_KEY: &str = "missing_key";
    pub const KEY_MISMATCH: &str = "key_mismatch";
    pub const INVALID_TENANT: &str = "invalid_tenant";
    /// A key longer than any valid command's ([`super::MAX_KEY_BYTES`]):
    /// dead-lettered without it, and no key is parked.
    pub const OVERSIZED_KEY: &str = "oversized_key";
    pub const ALL: &[&str] = &[EMPTY_PAYLOAD, OVERSIZED, NOT_SINGLE_OBJECT, UNKNOWN_SCHEMA, UNDECODABLE, INVALID_COMMAND, MISSING_KEY, KEY_MISMATCH, INVALID_TENANT, OVERSIZED_KEY];
}

/// The longest key a valid message has: a path's top-level directory (at
/// most a whole path, [`crate::command::MAX_TERM_LEN`] bytes) scoped by
/// the longest tenant and its separator.
pub const MAX_KEY_BYTES: usize = crate::command::MAX_TERM_LEN + crate::command::tenant::MAX_TENANT_LEN + 1;

/// The largest of denorm's own messages (a move's chunk, a control
/// message) a worker with `--max-message-bytes` `max_bytes` takes: a chunk
/// is at most [`crate::command::moves::MAX_CHUNK_BYTES`] of files, a
/// `REPLAY` a command of at most `max_bytes`, each with 64 KiB for its
/// framing, paths and key.
pub fn own_message_bytes(max_bytes: usize) -> usize {
    max_bytes.max(crate::command::moves::MAX_CHUNK_BYTES) + (64 << 10)
}

/// A key for messages and letters: the key itself when it is short, else
/// its length and its first bytes (a key over [`MAX_KEY_BYTES`] is never
/// shown or kept whole).
pub fn shown_key(key: &[u8]) -> String {
    match key.len() {
        n if n > MAX_KEY_BYTES => format!("{:?}... ({n} bytes)", String::from_utf8_lossy(&key[..64])),
        _ => format!("{:?}", String::from_utf8_lossy(key)),
    }
}

/// One input of the `admit` fuzz target (`fuzz/`): its first byte says how
/// many of the next bytes are the key, the rest is the payload. Whatever
/// is admitted must re-encode and decode to itself; a payload that is
/// UTF-8 goes through the JSONL parser too (the model's, when `c` reads a
/// model's commands). Panics where a property fails; returns whether the
/// input was admitted. Here rather than in `fuzz/`, so that it compiles
/// with the crate and the suite runs it on the fuzzer's seeds.
pub fn fuzz_input(c: &Codec, data: &[u8]) -> bool {
    let (key, payload) = match data.split_first() {
        Some((&n, rest)) => rest.split_at((n as usize).min(rest.len())),
        None => (&[][..], data),
    };
    let admitted = admit(c, Some(key), Some(payload), 1 << 20);
    match &admitted {
        Ok(Admitted::Command(e)) => assert_eq!(&c.decode(&c.encode(e)).unwrap(), e),
        Ok(Admitted::Control(x)) => assert_eq!(c.decode_message(&c.encode_control(x)).unwrap(), Decoded::Control(x.clone())),
        Ok(Admitted::Move(m)) => assert_eq!(c.decode_message(&c.encode_move(m)).unwrap(), Decoded::Move(m.clone())),
        Err(_) => {}
    }
    if let Ok(line) = std::str::from_utf8(payload) {
        let _ = crate::command::jsonl::parse_line(1, line);
        if let Some(d) = c.model() {
            // What the parser accepts (checked against the model) reads
            // back from its own line as itself.
            if let Ok(Some(e)) = crate::command::generic::jsonl::parse_line(d, 1, line) {
                let again = crate::command::generic::jsonl::parse_line(d, 1, &crate::command::generic::jsonl::line(d, &e)).unwrap().unwrap();
                assert_eq!((&again.tenant, &again.command), (&e.tenant, &e.command));
            }
        }
    }
    admitted.is_ok()
}

/// Decodes and validates a message, and checks that it is keyed by its
/// command's ordering domain (a wrong key would put it in the wrong
/// partition's order). Control messages must carry their key too.
pub fn admit(codec: &Codec, key: Option<&[u8]>, payload: Option<&[u8]>, max_bytes: usize) -> Result<Admitted, NotAdmitted> {
    let reject = |reason, detail: String| Err(NotAdmitted::Rejected(Rejection { reason, detail, chunk: None, parks: true }));
    if let Some(k) = key.filter(|k| k.len() > MAX_KEY_BYTES) {
        return reject(reason::OVERSIZED_KEY, format!("the key is {} bytes, more than the {MAX_KEY_BYTES} of the longest valid key: {}", k.len(), shown_key(k)));
    }
    let payload = match payload {
        None | Some([]) => return reject(reason::EMPTY_PAYLOAD, "the message has no payload".into()),
        // A cross-key move's documents are written by a worker, in chunks
        // of at most MAX_CHUNK_BYTES, and an operator's replay carries a
        // command accepted once: held to the larger bound of
        // `own_message_bytes`, checked before they are decoded.
        Some(p) if p.len() > max_bytes && !codec.is_denorms_own(p) => return reject(reason::OVERSIZED, format!("{} bytes, more than the {max_bytes} accepted", p.len())),
        Some(p) if p.len() > own_message_bytes(max_bytes) => {
            return reject(reason::OVERSIZED, format!("{} bytes, more than the {} a move's chunk or a control message of denorm's may take", p.len(), own_message_bytes(max_bytes)))
        }
        Some(p) => p,
    };
    let envelope = match codec.decode_message(payload) {
        Ok(Decoded::Command(e)) => e,
        Ok(Decoded::Control(c)) => {
            let got = key.unwrap_or_default();
            return if got == c.key.as_bytes() {
                Ok(Admitted::Control(c))
            } else {
                reject(reason::KEY_MISMATCH, format!("a control message for key {:?} is keyed {:?}", c.key, String::from_utf8_lossy(got)))
            };
        }
        Ok(Decoded::Move(m)) => {
            let got = key.unwrap_or_default();
            let (reason, detail) = match m.validate() {
                Ok(()) if got == m.key().as_bytes() => return Ok(Admitted::Move(m)),
                Ok(()) => (reason::KEY_MISMATCH, format!("a move into {:?} is keyed {:?}", m.to, String::from_utf8_lossy(got))),
                Err(e) => (reason::INVALID_COMMAND, e.to_string()),
            };
            let parks = crate::command::tenant::of_key(key) == crate::command::tenant::of(m.to.as_str());
            return Err(NotAdmitted::Rejected(Rejection { reason, detail, chunk: Some(Box::new(m)), parks }));
        }
        Err(e) if e.is_retryable() => return Err(NotAdmitted::Unavailable(e.to_string())),
        Err(e) => {
            let reason = match e {
                DecodeError::TooShort(_) | DecodeError::BadMarker(..) => reason::NOT_SINGLE_OBJECT,
                DecodeError::UnknownFingerprint(_) | DecodeError::UnknownSchemaId { .. } => reason::UNKNOWN_SCHEMA,
                _ => reason::UNDECODABLE,
            };
            return reject(reason, e.to_string());
        }
    };
    // From here on the envelope names its tenant: a message of another
    // tenant than its key's parks nothing.
    let parks = crate::command::tenant::of_key(key) == envelope.tenant.as_deref();
    let reject = |reason, detail: String| Err(NotAdmitted::Rejected(Rejection { reason, detail, chunk: None, parks }));
    if let Err(e) = envelope.validate() {
        let why = match e {
            crate::command::CommandError::InvalidTenant { .. } => reason::INVALID_TENANT,
            _ => reason::INVALID_COMMAND,
        };
        return reject(why, e.to_string());
    }
    if envelope.repair.is_some() && !crate::apply::repairable(&envelope.command) {
        let detail = format!("a repair carries an upsert or a delete of one document, not an owner change: found {}", envelope.command.kind());
        return reject(reason::INVALID_COMMAND, detail);
    }
    let expected = envelope.command.key();
    match key {
        None | Some([]) => reject(reason::MISSING_KEY, format!("the message has no key; its command's key is {expected:?}")),
        Some(k) if k != expected.as_bytes() => reject(reason::KEY_MISMATCH, format!("the message is keyed {:?} but its command's key is {expected:?}", String::from_utf8_lossy(k))),
        Some(_) => Ok(Admitted::Command(envelope)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Command;

    fn file(path: &str) -> Vec<u8> {
        Codec::new().encode(&Envelope::new(Command::UpsertFile { id: "f".into(), path: path.into(), contents: "x".into(), previous_path: None }))
    }

    fn tenant_file(tenant: &str, path: &str) -> Vec<u8> {
        let e = Envelope::new(Command::UpsertFile { id: "f".into(), path: path.into(), contents: "x".into(), previous_path: None });
        Codec::new().encode(&e.of_tenant(Some(tenant)))
    }

    /// Issue 47: a tenant's message is keyed by its scoped key, and a
    /// producer's id that smuggles a scope's separator is refused.
    #[test]
    fn a_tenants_command_is_admitted_under_its_scoped_key_only() {
        let c = Codec::new();
        let msg = tenant_file("acme", "/a/b.txt");
        let Ok(Admitted::Command(e)) = admit(&c, Some(b"acme\x1f/a"), Some(&msg), 1000) else { panic!("not admitted") };
        assert_eq!(e.tenant.as_deref(), Some("acme"));
        assert_eq!(e.command.key(), "acme\u{1f}/a");
        let Err(NotAdmitted::Rejected(r)) = admit(&c, Some(b"/a"), Some(&msg), 1000) else { panic!("admitted under the unscoped key") };
        assert_eq!(r.reason, reason::KEY_MISMATCH);
        // Written by a producer of the default tenant, with a separator in
        // its id.
        let mut e = Envelope::new(Command::UpsertFile { id: "acme\u{1f}f".into(), path: "/a/b.txt".into(), contents: "x".into(), previous_path: None });
        e.tenant = None;
        let smuggled = c.encode(&e);
        let Err(NotAdmitted::Rejected(r)) = admit(&c, Some(b"/a"), Some(&smuggled), 1000) else { panic!("admitted") };
        assert_eq!(r.reason, reason::INVALID_COMMAND, "{}", r.detail);
        let long = tenant_file(&"t".repeat(65), "/a/b.txt");
        let Err(NotAdmitted::Rejected(r)) = admit(&c, Some(b"x"), Some(&long), 1000) else { panic!("admitted") };
        assert_eq!(r.reason, reason::INVALID_TENANT);
        assert!(r.detail.contains("longer than 64"), "{}", r.detail);
    }

    /// The bound on keys lets every valid key through: a tenant's rename
    /// of a top-level directory, with the longest tenant and path allowed.
    #[test]
    fn the_longest_valid_key_is_admitted_and_one_byte_more_is_not() {
        let c = Codec::new();
        let (tenant, path) = ("t".repeat(crate::command::tenant::MAX_TENANT_LEN), format!("/{}", "p".repeat(crate::command::MAX_TERM_LEN - 1)));
        let rename = Envelope::new(Command::RenamePath { from: path.clone(), to: "/q".into() }).of_tenant(Some(&tenant));
        let msg = c.encode(&rename);
        let key = format!("{tenant}\u{1f}{path}");
        assert_eq!(key.len(), MAX_KEY_BYTES);
        assert!(matches!(admit(&c, Some(key.as_bytes()), Some(&msg), 1 << 20), Ok(Admitted::Command(_))), "{:?}", admit(&c, Some(key.as_bytes()), Some(&msg), 1 << 20));
        let longer = format!("{key}p");
        let Err(NotAdmitted::Rejected(r)) = admit(&c, Some(longer.as_bytes()), Some(&msg), 1 << 20) else { panic!("admitted") };
        assert_eq!(r.reason, reason::OVERSIZED_KEY);
        assert!(r.detail.len() < 300, "the key is not repeated whole: {}", r.detail);
    }

    #[test]
    fn each_failure_has_its_own_reason() {
        let c = Codec::new();
        let good = file("/a/b.txt");
        let mut unknown = good.clone();
        unknown[3] ^= 0xff;
        // The key, the payload, the reason expected.
        let long_key = vec![b'k'; MAX_KEY_BYTES + 1];
        type Case<'a> = (Option<&'a [u8]>, Option<Vec<u8>>, &'a str);
        let cases: Vec<Case> = vec![
            (Some(b"/a"), None, reason::EMPTY_PAYLOAD),
            (Some(b"/a"), Some(vec![0u8; 2000]), reason::OVERSIZED),
            (Some(b"/a"), Some(b"random garbage bytes".to_vec()), reason::NOT_SINGLE_OBJECT),
            (Some(b"/a"), Some(unknown), reason::UNKNOWN_SCHEMA),
            (Some(b"/a"), Some(good[..good.len() - 3].to_vec()), reason::UNDECODABLE),
            (Some(b"/a"), Some(file("/a/../etc")), reason::INVALID_COMMAND),
            (None, Some(good.clone()), reason::MISSING_KEY),
            (Some(b"/other"), Some(good.clone()), reason::KEY_MISMATCH),
            (Some(b"Acme\x1f/a"), Some(tenant_file("Acme", "/a/b.txt")), reason::INVALID_TENANT),
            (Some(&long_key), Some(good.clone()), reason::OVERSIZED_KEY),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (key, payload, want) in cases {
            let Err(NotAdmitted::Rejected(got)) = admit(&c, key, payload.as_deref(), 1000) else { panic!("{want} admitted") };
            assert_eq!(got.reason, want, "{}", got.detail);
            seen.insert(got.reason);
        }
        assert_eq!(seen.len(), reason::ALL.len(), "every reason is reachable");
        assert!(admit(&c, Some(b"/a"), Some(&good), 1000).is_ok());
        // A move's documents are never refused for size: a worker wrote them.
        let files = (0..40).map(|i| crate::command::moves::MovedFile { id: format!("f{i}"), path: format!("/d/f{i}"), contents: "x".repeat(50) }).collect();
        let mv =
            crate::command::moves::MoveIn { move_id: "m".into(), source_partition: 0, source_offset: 1, from: "/s".into(), to: "/d".into(), chunk: 0, last: true, issued_at: 0, files, aborted: false };
        let bytes = c.encode_move(&mv);
        // Its bound is checked before decoding: a forged move's files
        // would decode at many times their size.
        let mut forged = bytes[..10].to_vec();
        forged.resize(own_message_bytes(1000) + 1, 0x02);
        let Err(NotAdmitted::Rejected(r)) = admit(&c, Some(b"/d"), Some(&forged), 1000) else { panic!("a forged move over the bound admitted") };
        assert_eq!(r.reason, reason::OVERSIZED, "{}", r.detail);
        forged.truncate(own_message_bytes(1000));
        let Err(NotAdmitted::Rejected(r)) = admit(&c, Some(b"/d"), Some(&forged), 1000) else { panic!("garbage admitted") };
        assert_eq!(r.reason, reason::UNDECODABLE, "within the bound it is decoded, and refused for what it is: {}", r.detail);
        assert!(bytes.len() > 1000);
        assert!(matches!(admit(&c, Some(b"/d"), Some(&bytes), 1000), Ok(Admitted::Move(_))));
        let Err(NotAdmitted::Rejected(r)) = admit(&c, Some(b"/s"), Some(&bytes), 1000) else { panic!("a move under the wrong key admitted") };
        assert_eq!(r.reason, reason::KEY_MISMATCH);
        assert_eq!(r.chunk.as_deref(), Some(&mv), "the refused chunk is handed back, for its move to end");
        // Schema-registry framing without a registry: the id is unknown here.
        let framed = crate::codec::registry::frame(7, &c.datum(&Envelope::new(Command::DeleteFile { id: "f".into(), path: "/a/b".into() })));
        let Err(NotAdmitted::Rejected(r)) = admit(&c, Some(b"/a"), Some(&framed), 1000) else { panic!("admitted") };
        assert_eq!(r.reason, reason::UNKNOWN_SCHEMA);
        assert!(r.detail.contains("schema id 7"), "{}", r.detail);
    }
}
