//! Provenance of denorm's own messages. A cross-key move's chunks and the
//! operators' control messages (`REPLAY`, `DISCARD`, `RESOLVE`, `PLACE`)
//! travel on the command topic, which producers write too. With a signing
//! key (`--signing-key-file`), whoever writes one of them (a worker, `dlq
//! reprocess`/`clear`, `rebuild`, `migrate`) adds a Kafka header holding
//! an HMAC-SHA256 of the topic, the key and the payload, and workers
//! refuse every such message without a valid one: a producer without the
//! key cannot forge them (docs/reliability.md, "Security model").

use std::path::Path;

use ring::hmac;

/// The Kafka header that carries the signature, as lowercase hex.
pub const HEADER: &str = "denorm-signature";
/// The shortest key accepted, in bytes (HMAC-SHA256's own output size).
pub const MIN_KEY_BYTES: usize = 32;
/// What every signed text starts with: a signature of this scheme is of
/// no other.
const DOMAIN: &[u8] = b"denorm-signature-v1\0";

/// The keys of a deployment: the first signs, every one verifies (a key is
/// rotated by adding the new one first, then, once every worker runs with
/// it and the topic holds no message signed by the old one that is still
/// to be read, removing the old).
#[derive(Clone)]
pub struct Signing {
    keys: Vec<hmac::Key>,
}

impl std::fmt::Debug for Signing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Signing({} keys)", self.keys.len())
    }
}

/// How a message of denorm's own stands against the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provenance {
    Signed,
    /// No `denorm-signature` header.
    Unsigned,
    /// A header that no key made.
    BadSignature,
}

impl Signing {
    /// Keys from text: one per line, blank lines and `#` comments skipped,
    /// each at least [`MIN_KEY_BYTES`] bytes. An error names the line,
    /// never its value.
    pub fn from_text(text: &str) -> Result<Signing, String> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.trim_start().starts_with('#') {
                continue;
            }
            if line.len() < MIN_KEY_BYTES {
                return Err(format!("line {}: a key of {} bytes, fewer than the {MIN_KEY_BYTES} required (e.g. `openssl rand -hex 32`)", i + 1, line.len()));
            }
            keys.push(hmac::Key::new(hmac::HMAC_SHA256, line.as_bytes()));
        }
        if keys.is_empty() {
            return Err("no key (one per line)".into());
        }
        Ok(Signing { keys })
    }

    /// Keys from the file at `path` (see [`Signing::from_text`]).
    pub fn read(path: &Path) -> Result<Signing, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Signing::from_text(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The header value for a message of `topic` with `key` and `payload`.
    pub fn sign(&self, topic: &str, key: Option<&[u8]>, payload: &[u8]) -> String {
        let tag = hmac::sign(&self.keys[0], &signed_text(topic, key, payload));
        tag.as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Whether `signature` (the header's value, if any) was made by one of
    /// the keys for this message. Compared in constant time.
    pub fn check(&self, topic: &str, key: Option<&[u8]>, payload: &[u8], signature: Option<&[u8]>) -> Provenance {
        let Some(sig) = signature else { return Provenance::Unsigned };
        let Some(tag) = unhex(sig) else { return Provenance::BadSignature };
        let text = signed_text(topic, key, payload);
        match self.keys.iter().any(|k| hmac::verify(k, &text, &tag).is_ok()) {
            true => Provenance::Signed,
            false => Provenance::BadSignature,
        }
    }
}

/// What is signed: the scheme, the topic, the key (its length first, so
/// that no key and payload can be cut another way) and the payload.
fn signed_text(topic: &str, key: Option<&[u8]>, payload: &[u8]) -> Vec<u8> {
    let key = key.unwrap_or_default();
    let mut out = Vec::with_capacity(DOMAIN.len() + topic.len() + 9 + key.len() + payload.len());
    out.extend_from_slice(DOMAIN);
    out.extend_from_slice(topic.as_bytes());
    out.push(0);
    out.extend_from_slice(&(key.len() as u64).to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(payload);
    out
}

fn unhex(s: &[u8]) -> Option<Vec<u8>> {
    if s.len() != 64 {
        return None;
    }
    s.chunks(2).map(|p| std::str::from_utf8(p).ok().and_then(|h| u8::from_str_radix(h, 16).ok())).collect()
}

/// The signature header's value in a message's headers, if any.
pub fn signature_in<H: rdkafka::message::Headers>(headers: Option<&H>) -> Option<Vec<u8>> {
    headers?.iter().find(|h| h.key == HEADER).and_then(|h| h.value.map(<[u8]>::to_vec))
}

/// Headers carrying `payload`'s signature when there are keys; none
/// otherwise.
pub fn headers(signing: Option<&Signing>, topic: &str, key: Option<&[u8]>, payload: &[u8]) -> rdkafka::message::OwnedHeaders {
    let h = rdkafka::message::OwnedHeaders::new();
    match signing {
        Some(s) => h.insert(rdkafka::message::Header { key: HEADER, value: Some(&s.sign(topic, key, payload)) }),
        None => h,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "0123456789abcdef0123456789abcdef";
    const K2: &str = "fedcba9876543210fedcba9876543210";

    #[test]
    fn a_signature_holds_for_its_message_only() {
        let s = Signing::from_text(K1).unwrap();
        let sig = s.sign("t", Some(b"acme\x1f/docs"), b"payload");
        assert_eq!(sig.len(), 64);
        assert_eq!(s.check("t", Some(b"acme\x1f/docs"), b"payload", Some(sig.as_bytes())), Provenance::Signed);
        for (topic, key, payload) in [("u", &b"acme\x1f/docs"[..], &b"payload"[..]), ("t", b"acme\x1f/doc", b"payload"), ("t", b"acme\x1f/docs", b"payloaD")] {
            assert_eq!(s.check(topic, Some(key), payload, Some(sig.as_bytes())), Provenance::BadSignature, "{topic} {key:?} {payload:?}");
        }
        // The key's length is signed: moving a byte between key and
        // payload breaks the signature.
        assert_eq!(s.check("t", Some(b"acme\x1f/doc"), b"spayload", Some(sig.as_bytes())), Provenance::BadSignature);
        assert_eq!(s.check("t", Some(b"acme\x1f/docs"), b"payload", None), Provenance::Unsigned);
        assert_eq!(s.check("t", Some(b"acme\x1f/docs"), b"payload", Some(b"zz")), Provenance::BadSignature);
        let other = Signing::from_text(K2).unwrap();
        assert_eq!(other.check("t", Some(b"acme\x1f/docs"), b"payload", Some(sig.as_bytes())), Provenance::BadSignature);
    }

    #[test]
    fn the_first_key_signs_and_every_key_verifies() {
        let old = Signing::from_text(K1).unwrap();
        let rotated = Signing::from_text(&format!("# new first\n{K2}\n\n{K1}\n")).unwrap();
        let by_old = old.sign("t", None, b"p");
        assert_eq!(rotated.check("t", None, b"p", Some(by_old.as_bytes())), Provenance::Signed);
        let by_new = rotated.sign("t", None, b"p");
        assert_ne!(by_new, by_old);
        assert_eq!(old.check("t", None, b"p", Some(by_new.as_bytes())), Provenance::BadSignature);
    }

    #[test]
    fn short_or_missing_keys_are_refused_without_showing_them() {
        let e = Signing::from_text("# keys\ntooshort\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("fewer than the 32") && !e.contains("tooshort"), "{e}");
        assert!(Signing::from_text("# none\n\n").unwrap_err().contains("no key"));
        assert_eq!(format!("{:?}", Signing::from_text(K1).unwrap()), "Signing(1 keys)");
    }
}
