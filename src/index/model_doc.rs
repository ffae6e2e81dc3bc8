//! A declared model's documents and scans as a shard holds them
//! (docs/model.md): beside the compiled-in kinds, every backend stores a
//! model's documents through the same [`super::Shard`] operations, so the
//! worker's guarantees (position guards, checkpoints, lanes, dead
//! letters) hold for them unchanged.
//!
//! As for the compiled-in kinds, a document's id and ordering key are
//! scoped to its tenant ([`crate::command::tenant`]); its field values are
//! as its producer wrote them.

use std::collections::BTreeMap;

use crate::command::generic::bound::Bound;
use crate::command::generic::value::Invalid;
use crate::command::generic::{ModelCommand, Object, Op, Value};
use crate::command::{path, tenant};
use crate::domain::{self, Domain};

/// A kind of a declared model ([`Domain::interned`]): `Copy` like the
/// compiled-in kinds, and ordered by its name.
#[derive(Debug, Clone, Copy)]
pub struct ModelKind {
    domain: &'static Domain,
    kind: &'static domain::Kind,
}

impl ModelKind {
    /// The kind `name` of `domain`.
    pub fn of(domain: &'static Domain, name: &str) -> Option<Self> {
        domain.kind(name).map(|kind| ModelKind { domain, kind })
    }

    /// Every kind of `domain`, in its order.
    pub fn all(domain: &'static Domain) -> Vec<Self> {
        domain.kinds.iter().map(|kind| ModelKind { domain, kind }).collect()
    }

    pub fn as_str(self) -> &'static str {
        &self.kind.name
    }

    /// Its declaration.
    pub fn decl(self) -> &'static domain::Kind {
        self.kind
    }

    pub fn domain(self) -> &'static Domain {
        self.domain
    }
}

impl PartialEq for ModelKind {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.kind, other.kind)
    }
}

impl Eq for ModelKind {}

impl PartialOrd for ModelKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ModelKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.as_str(), &self.domain.name, self.domain.version)
            .cmp(&(other.as_str(), &other.domain.name, other.domain.version))
            .then_with(|| (self.kind as *const domain::Kind).cmp(&(other.kind as *const _)))
    }
}

impl std::hash::Hash for ModelKind {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

/// A model's document: its declared fields and nested lists, and the
/// copies it carries of its owners.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDoc {
    pub kind: ModelKind,
    /// Scoped to its tenant.
    pub id: String,
    /// Its ordering key, scoped to its tenant.
    pub key: String,
    pub fields: Object,
    /// By copy name: the owner's copied fields the owner has.
    pub copies: BTreeMap<String, Object>,
    pub pos: u64,
}

// Floats in a model's documents are finite: every value is checked when
// its command is admitted.
impl Eq for ModelDoc {}

impl ModelDoc {
    /// The document `id` (scoped) of `kind`, keyed as its kind says.
    pub fn new(kind: ModelKind, id: String, fields: Object, copies: BTreeMap<String, Object>, pos: u64) -> Self {
        let key = key_of(kind.decl(), &id, &fields);
        ModelDoc { kind, id, key, fields, copies, pos }
    }

    pub fn tenant(&self) -> Option<&str> {
        tenant::of(&self.id)
    }

    /// The id as its producer wrote it.
    pub fn unscoped_id(&self) -> &str {
        tenant::unscoped(&self.id)
    }

    /// The upsert that writes this document as it is (its copies are the
    /// owner's when the upsert is applied), in its tenant.
    pub fn upsert(&self) -> Result<crate::command::Command, Invalid> {
        self.command(Op::Upsert { id: self.unscoped_id().to_string(), fields: self.fields.clone(), previous: None })
    }

    /// Its delete, under its key field's value (the key it is held by).
    pub fn delete(&self) -> Result<crate::command::Command, Invalid> {
        let at = match self.kind.decl().key_field() {
            None => None,
            Some(f) => match self.fields.get(f) {
                Some(Value::Str(v)) => Some(v.clone()),
                _ => return Err(Invalid { field: format!("fields.{f}"), reason: "the document has no key field".into() }),
            },
        };
        self.command(Op::Delete { id: self.unscoped_id().to_string(), at })
    }

    fn command(&self, op: Op) -> Result<crate::command::Command, Invalid> {
        let b = Bound::new(self.kind.domain(), self.tenant().map(str::to_string), ModelCommand { kind: self.kind.as_str().to_string(), op });
        b.validate()?;
        Ok(crate::command::Command::Model(Box::new(b)))
    }

    fn names(&self, field: &str, value: &str) -> bool {
        matches!(self.fields.get(field), Some(Value::Str(s)) if s == value)
    }
}

/// The ordering key (scoped) of a document `id` (scoped) of `kind` with
/// `fields`.
fn key_of(kind: &domain::Kind, id: &str, fields: &Object) -> String {
    let value = |f: &str| match fields.get(f) {
        Some(Value::Str(s)) => s.as_str(),
        _ => "",
    };
    let unscoped = match &kind.key {
        domain::OrderingKey::Id => return id.to_string(),
        domain::OrderingKey::Owner { field, .. } => value(field),
        domain::OrderingKey::PathTop { field } => path::top_level(value(field)),
    };
    tenant::scope(tenant::of(id), unscoped)
}

/// What a copy of an owner's fields becomes in its dependents of one kind.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyTarget {
    pub kind: ModelKind,
    /// The dependent's ref field naming the owner.
    pub via: String,
    pub copy: String,
    /// The owner's copied fields the owner has, as the command leaves
    /// them: the dependent's whole copy.
    pub values: Object,
}

/// The documents a model's fan-out reads.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelScan {
    /// An owner's dependents of one kind whose copy differs from the
    /// target's values.
    Dependents {
        /// The owner's ordering key, scoped: the dependents share it.
        key: String,
        tenant: Option<String>,
        /// The owner's id as its producer wrote it (what `via` holds).
        owner: String,
        target: CopyTarget,
    },
    /// Documents of `kind` whose path `field` is `path` or lies beneath it.
    Within { key: String, tenant: Option<String>, kind: ModelKind, field: String, path: String },
}

impl Eq for ModelScan {}

impl ModelScan {
    pub fn key(&self) -> &str {
        match self {
            ModelScan::Dependents { key, .. } | ModelScan::Within { key, .. } => key,
        }
    }

    /// The kind of the documents it reads.
    pub fn kind(&self) -> ModelKind {
        match self {
            ModelScan::Dependents { target, .. } => target.kind,
            ModelScan::Within { kind, .. } => *kind,
        }
    }

    pub fn tenant(&self) -> Option<&str> {
        match self {
            ModelScan::Dependents { tenant, .. } | ModelScan::Within { tenant, .. } => tenant.as_deref(),
        }
    }

    /// The copy target of `doc`, a dependent of this scan's owner.
    pub fn target_of(&self, doc: &ModelDoc) -> Option<&CopyTarget> {
        let ModelScan::Dependents { tenant, owner, target, .. } = self else { return None };
        (doc.tenant() == tenant.as_deref() && target.kind == doc.kind && doc.names(&target.via, owner)).then_some(target)
    }

    /// The scan's definition (the in-memory backend's; the others
    /// translate it into their queries).
    pub fn matches(&self, doc: &ModelDoc) -> bool {
        match self {
            ModelScan::Dependents { .. } => self.target_of(doc).is_some_and(|t| doc.copies.get(&t.copy) != Some(&t.values)),
            ModelScan::Within { tenant, kind, field, path: p, .. } => {
                doc.kind == *kind && doc.tenant() == tenant.as_deref() && matches!(doc.fields.get(field), Some(Value::Str(s)) if path::is_within(s, p))
            }
        }
    }
}
