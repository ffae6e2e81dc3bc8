//! Tenants: who a command and its documents belong to. No I/O.
//!
//! A command names its tenant in the envelope (`tenant`, absent for the
//! default tenant). Inside denorm, the tenant is part of every identifier
//! the command carries: a tenant's ids, user ids and paths are *scoped*,
//! `<tenant>` [`SEP`] `<value>` (`acme\u{1f}/docs/a.txt`, `acme\u{1f}7`),
//! from the moment a message is decoded until a document is stored or
//! shown. So two tenants' `/docs` are two keys, two sets of documents, two
//! scans, and nothing downstream (the key lanes, the rules of `apply`, the
//! moves, the reference model, the verify) can mix them up: they compare
//! strings that differ. The default tenant's identifiers are unscoped,
//! exactly as before tenants existed, so existing topics replay unchanged.
//!
//! A raw identifier can never look scoped: ids and paths refuse control
//! characters, and [`SEP`] is one. See docs/tenants.md.

use super::{Command, CommandError};

/// Between a tenant and the identifier it scopes: the ASCII unit
/// separator, which no id, path or tenant may contain, and which sorts
/// before every character a tenant id may hold (so a tenant's scoped ids
/// sort by tenant, then id).
pub const SEP: char = '\u{1f}';

/// Longest tenant id, in bytes.
pub const MAX_TENANT_LEN: usize = 64;

/// Checks a tenant id: 1 to 64 of `a-z`, `0-9`, `_` and `-`, beginning
/// with a letter or digit. Lower case only, so that a tenant's id can name
/// its Elasticsearch aliases and indexes as it is.
pub fn validate(tenant: &str) -> Result<(), CommandError> {
    let invalid = |reason: String| CommandError::InvalidTenant { tenant: tenant.to_string(), reason };
    if tenant.is_empty() {
        return Err(invalid("is empty (leave the tenant out for the default tenant)".into()));
    }
    if tenant.len() > MAX_TENANT_LEN {
        return Err(invalid(format!("is {} bytes, longer than {MAX_TENANT_LEN}", tenant.len())));
    }
    if let Some(c) = tenant.chars().find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '_' | '-')) {
        return Err(invalid(format!("has {c:?}: a tenant id holds a-z, 0-9, '_' and '-' only")));
    }
    if !tenant.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(invalid("must begin with a letter or a digit".into()));
    }
    Ok(())
}

/// `value` scoped to `tenant` (unchanged for the default tenant, `None`).
pub fn scope(tenant: Option<&str>, value: &str) -> String {
    match tenant {
        None => value.to_string(),
        Some(t) => format!("{t}{SEP}{value}"),
    }
}

/// A scoped identifier's tenant (`None`: the default tenant's) and its
/// value as the producer wrote it.
pub fn split(scoped: &str) -> (Option<&str>, &str) {
    match scoped.split_once(SEP) {
        Some((t, v)) => (Some(t), v),
        None => (None, scoped),
    }
}

/// The tenant of a scoped identifier.
pub fn of(scoped: &str) -> Option<&str> {
    split(scoped).0
}

/// The tenant a message's key names (`None`: the default tenant's, no
/// key, or a key that is not UTF-8).
pub fn of_key(key: Option<&[u8]>) -> Option<&str> {
    key.and_then(|k| std::str::from_utf8(k).ok()).and_then(of)
}

/// The identifier as the producer wrote it, without its tenant.
pub fn unscoped(scoped: &str) -> &str {
    split(scoped).1
}

/// A scoped identifier as people read it (logs, reports): as its producer
/// wrote it, then its tenant, `/docs (tenant acme)`; the default tenant's
/// as it is. The separator never shows. Its `Debug` is the same text,
/// quoted (a log field's `?`, as a `&str`'s would be).
pub struct Shown<'a>(pub &'a str);

impl std::fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl std::fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match split(self.0) {
            (Some(t), v) => write!(f, "{v} (tenant {t})"),
            (None, v) => f.write_str(v),
        }
    }
}

/// Checks a scoped path: its tenant and the path as its producer wrote it.
pub fn validate_path(field: &'static str, scoped: &str) -> Result<(), CommandError> {
    let (tenant, raw) = split(scoped);
    if let Some(t) = tenant {
        validate(t)?;
    }
    super::path::validate(field, raw)
}

impl Command {
    /// The command with every identifier scoped to `tenant` (see the
    /// module's documentation). The default tenant's is the command itself.
    pub fn scoped(self, tenant: Option<&str>) -> Command {
        let Some(t) = tenant else { return self };
        let s = |v: String| scope(Some(t), &v);
        match self {
            Command::UpsertFile { id, path, contents, previous_path } => Command::UpsertFile { id: s(id), path: s(path), contents, previous_path: previous_path.map(s) },
            Command::DeleteFile { id, path } => Command::DeleteFile { id: s(id), path: s(path) },
            Command::RenamePath { from, to } => Command::RenamePath { from: s(from), to: s(to) },
            Command::UpsertUser { id, name, email, dob } => Command::UpsertUser { id: s(id), name, email, dob },
            Command::UpsertPost { id, user_id, title, body, previous_user_id } => Command::UpsertPost { id: s(id), user_id: s(user_id), title, body, previous_user_id: previous_user_id.map(s) },
            Command::DeletePost { id, user_id } => Command::DeletePost { id: s(id), user_id: s(user_id) },
            Command::DeleteUser { id } => Command::DeleteUser { id: s(id) },
            Command::Model(b) => Command::Model(Box::new(b.in_tenant(Some(t)))),
        }
    }

    /// The identifiers a scoped command carries, each with its field name.
    fn identifiers(&self) -> Vec<(&'static str, &str)> {
        let mut out = match self {
            Command::UpsertFile { id, path, .. } | Command::DeleteFile { id, path } => vec![("id", id.as_str()), ("path", path.as_str())],
            Command::RenamePath { from, to } => vec![("from", from.as_str()), ("to", to.as_str())],
            Command::UpsertUser { id, .. } | Command::DeleteUser { id } => vec![("id", id.as_str())],
            Command::UpsertPost { id, user_id, .. } | Command::DeletePost { id, user_id } => vec![("id", id.as_str()), ("user_id", user_id.as_str())],
            // Its identifiers are its producer's; the tenant travels beside them.
            Command::Model(_) => Vec::new(),
        };
        match self {
            Command::UpsertFile { previous_path: Some(p), .. } => out.push(("previous_path", p)),
            Command::UpsertPost { previous_user_id: Some(u), .. } => out.push(("previous_user_id", u)),
            _ => {}
        }
        out
    }

    /// The tenant a scoped command belongs to (`None`: the default tenant),
    /// as its first identifier says.
    pub fn tenant(&self) -> Option<&str> {
        if let Command::Model(b) = self {
            return b.tenant.as_deref();
        }
        of(match self {
            Command::UpsertFile { id, .. }
            | Command::DeleteFile { id, .. }
            | Command::UpsertUser { id, .. }
            | Command::UpsertPost { id, .. }
            | Command::DeletePost { id, .. }
            | Command::DeleteUser { id } => id,
            Command::RenamePath { from, .. } => from,
            Command::Model(_) => unreachable!("answered above"),
        })
    }

    /// The command as its producer wrote it, without its tenant (what is
    /// encoded, validated and shown). Identifiers of another tenant than
    /// the first one's are kept whole, which [`Command::validate_scoped`]
    /// refuses.
    pub fn unscoped(&self) -> Command {
        let t = self.tenant();
        let u = |v: &String| match split(v) {
            (Some(x), raw) if Some(x) == t => raw.to_string(),
            _ => v.clone(),
        };
        match self {
            Command::UpsertFile { id, path, contents, previous_path } => Command::UpsertFile { id: u(id), path: u(path), contents: contents.clone(), previous_path: previous_path.as_ref().map(u) },
            Command::DeleteFile { id, path } => Command::DeleteFile { id: u(id), path: u(path) },
            Command::RenamePath { from, to } => Command::RenamePath { from: u(from), to: u(to) },
            Command::UpsertUser { id, name, email, dob } => Command::UpsertUser { id: u(id), name: name.clone(), email: email.clone(), dob: dob.clone() },
            Command::UpsertPost { id, user_id, title, body, previous_user_id } => {
                Command::UpsertPost { id: u(id), user_id: u(user_id), title: title.clone(), body: body.clone(), previous_user_id: previous_user_id.as_ref().map(u) }
            }
            Command::DeletePost { id, user_id } => Command::DeletePost { id: u(id), user_id: u(user_id) },
            Command::DeleteUser { id } => Command::DeleteUser { id: u(id) },
            Command::Model(b) => Command::Model(Box::new(b.as_ref().clone().in_tenant(None))),
        }
    }

    /// Validates a scoped command: its tenant, every identifier of that
    /// one tenant (a move or an owner change never crosses tenants), and
    /// the command as its producer wrote it ([`Command::validate`]).
    pub fn validate_scoped(&self) -> Result<(), CommandError> {
        let tenant = self.tenant();
        if let Some(t) = tenant {
            validate(t)?;
        }
        for (field, value) in self.identifiers() {
            if of(value) != tenant {
                return Err(CommandError::CrossTenant { field, tenant: tenant.unwrap_or("").to_string(), other: of(value).unwrap_or("").to_string() });
            }
            // A scoped id is a document's `_id` on Elasticsearch, at most
            // 512 bytes there too.
            let is_id = !matches!(field, "path" | "from" | "to" | "previous_path");
            if is_id && tenant.is_some() && value.len() > super::MAX_ID_LEN {
                let reason = format!("is {} bytes with its tenant's scope, longer than {}", value.len(), super::MAX_ID_LEN);
                return Err(CommandError::InvalidField { field, reason });
            }
        }
        match tenant {
            None => self.validate(),
            Some(_) => self.unscoped().validate(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::path;

    fn upsert(id: &str, p: &str) -> Command {
        Command::UpsertFile { id: id.into(), path: p.into(), contents: "c".into(), previous_path: None }
    }

    /// Logs and reports show an identifier as its producer wrote it, with
    /// its tenant beside it, never the separator.
    #[test]
    fn a_scoped_identifier_is_shown_without_its_separator() {
        let k = scope(Some("acme"), "/docs");
        assert_eq!(Shown(&k).to_string(), "/docs (tenant acme)");
        assert_eq!(format!("{:?}", Shown(&k)), "\"/docs (tenant acme)\"");
        assert_eq!(Shown("/docs").to_string(), "/docs");
        assert_eq!(format!("{:?}", Shown("/docs")), format!("{:?}", "/docs"));
    }

    #[test]
    fn tenant_ids_are_short_lower_case_names() {
        for ok in ["acme", "a", "tenant-7", "t_1", "0x", &"a".repeat(64)] {
            assert_eq!(validate(ok), Ok(()), "{ok}");
        }
        for bad in ["", "Acme", "a b", "a/b", "-a", "_a", "ä", "a\u{1f}b", &"a".repeat(65)] {
            assert!(matches!(validate(bad), Err(CommandError::InvalidTenant { .. })), "{bad:?} accepted");
        }
    }

    #[test]
    fn scoping_keeps_two_tenants_apart_and_the_default_unchanged() {
        let raw = upsert("f1", "/docs/a.txt");
        assert_eq!(raw.clone().scoped(None), raw);
        let a = raw.clone().scoped(Some("a"));
        let b = raw.clone().scoped(Some("b"));
        assert_ne!(a.key(), b.key());
        assert_ne!(a.key(), raw.key());
        assert_eq!(a.key(), "a\u{1f}/docs");
        assert_eq!(a.tenant(), Some("a"));
        assert_eq!(raw.tenant(), None);
        assert_eq!(a.unscoped(), raw);
        assert_eq!(a.validate_scoped(), Ok(()));
        // A rename of a tenant's path stays in the tenant: its key, its
        // destination key, the paths it moves.
        let r = Command::RenamePath { from: "/docs".into(), to: "/work".into() }.scoped(Some("a"));
        assert_eq!(r.key(), "a\u{1f}/docs");
        let moved = Command::RenamePath { from: "/docs/x".into(), to: "/work/x".into() }.scoped(Some("a"));
        assert_eq!(moved.destination_key(), Some("a\u{1f}/work"));
        assert_eq!(path::renamed("a\u{1f}/docs/x/f.txt", "a\u{1f}/docs/x", "a\u{1f}/work/x").as_deref(), Some("a\u{1f}/work/x/f.txt"));
        assert_eq!(path::renamed("b\u{1f}/docs/x/f.txt", "a\u{1f}/docs/x", "a\u{1f}/work/x"), None, "another tenant's file is not beneath");
        let post = Command::UpsertPost { id: "p".into(), user_id: "7".into(), title: "t".into(), body: "b".into(), previous_user_id: Some("3".into()) }.scoped(Some("a"));
        assert_eq!(post.key(), "a\u{1f}7");
        assert_eq!(post.previous_key(), Some("a\u{1f}3"));
    }

    #[test]
    fn a_raw_identifier_cannot_pass_for_another_tenants() {
        // The default tenant's command naming tenant b's file.
        let smuggled = upsert("b\u{1f}f1", "/docs/a.txt");
        assert!(smuggled.validate_scoped().is_err());
        // Tenant a's command whose id smuggles tenant b's.
        let nested = upsert("b\u{1f}f1", "/docs/a.txt").scoped(Some("a"));
        assert!(nested.validate_scoped().is_err());
        // An owner change from another tenant's directory.
        let cross = Command::UpsertFile { id: "a\u{1f}f".into(), path: "a\u{1f}/x/f".into(), contents: String::new(), previous_path: Some("b\u{1f}/y/f".into()) };
        let e = cross.validate_scoped().unwrap_err();
        assert!(matches!(e, CommandError::CrossTenant { field: "previous_path", .. }), "{e}");
        assert!(e.to_string().contains("tenant"), "{e}");
        // An id that fits alone, but not with its tenant's scope.
        let long = upsert(&"x".repeat(510), "/docs/a").scoped(Some("acme"));
        assert!(matches!(long.validate_scoped(), Err(CommandError::InvalidField { field: "id", .. })), "{:?}", long.validate_scoped());
        assert!(upsert(&"x".repeat(510), "/docs/a").validate_scoped().is_ok());
        let bad_tenant = upsert("f", "/docs/a").scoped(Some("Acme"));
        assert!(matches!(bad_tenant.validate_scoped(), Err(CommandError::InvalidTenant { .. })));
    }
}
