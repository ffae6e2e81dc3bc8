//! A declared data model (the model file, docs/model.md): the kinds of
//! documents, their typed fields, each kind's ordering key, path fields
//! whose ancestors are indexed, the fields a document copies from its owner
//! and its nested lists of objects. Read from TOML and checked as it is
//! loaded, so that everything built from a `Domain` can rely on it: every
//! name valid and unique, every reference resolved, every limit kept.
//! An error names the file, the line, the column and the field.
//!
//! No I/O beyond reading the file, and no dependency on the rest of the
//! crate.

mod check;
mod earlier;
mod file;
#[cfg(test)]
pub(crate) mod tests;

use std::fmt;
use std::path::Path;

use serde::Serialize;

/// Limits a model must keep (docs/model.md, "Limits").
pub mod limits {
    /// Kinds in a model.
    pub const KINDS: usize = 64;
    /// Fields of one kind, or of one nested list's objects.
    pub const FIELDS: usize = 128;
    /// Copies of one kind, and fields in one copy.
    pub const COPIES: usize = 16;
    pub const COPIED_FIELDS: usize = 32;
    /// Nested lists of one kind.
    pub const NESTED: usize = 16;
    /// A name's length (kinds, fields, copies, lists, the model's).
    pub const NAME: usize = 64;
    /// Earlier versions a model reads the commands of.
    pub const EARLIER: usize = 16;
}

/// Names a model cannot give a field: what every document has already.
pub const RESERVED: &[&str] = &["id", "kind", "tenant", "pos"];

/// Two domains are equal when they declare the same thing, however their
/// files are written.
#[derive(Debug, Clone, Serialize)]
pub struct Domain {
    pub name: String,
    pub version: u32,
    /// By name.
    pub kinds: Vec<Kind>,
    /// The text of the file it was read from, which an index records with
    /// the model so that any process can read a generation's kinds again
    /// (not part of the fingerprint).
    #[serde(skip)]
    pub source: String,
    /// The earlier versions of the model whose commands the topic may
    /// still hold (`earlier = [...]`, loaded by [`Domain::load`]): read
    /// with their own schema, then checked against this one (not part of
    /// the fingerprint: the index does not depend on them).
    #[serde(skip)]
    pub earlier: Vec<Domain>,
    /// The files `earlier` names, as written, with their place in the file.
    #[serde(skip)]
    pub(crate) earlier_files: Vec<earlier::Declared>,
}

impl PartialEq for Domain {
    fn eq(&self, other: &Self) -> bool {
        (&self.name, self.version, &self.kinds) == (&other.name, other.version, &other.kinds)
    }
}

impl Eq for Domain {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Kind {
    pub name: String,
    pub key: OrderingKey,
    /// By name.
    pub fields: Vec<Field>,
    pub copies: Vec<OwnerCopy>,
    pub nested: Vec<Nested>,
}

/// What orders a kind's commands: the Kafka key its commands carry, and so
/// the partition and the lane they are applied in, one after another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum OrderingKey {
    /// The document's own id (a user, a customer).
    Id,
    /// The id of its owner (a post's `user_id`, an order's `customer_id`):
    /// `field` is a ref field of the kind, `owner` the kind it names.
    Owner { field: String, owner: String },
    /// The top segment of a path field (a file's `/acme/...` is keyed
    /// `/acme`): a rename of a prefix below the top is one command.
    PathTop { field: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Field {
    pub name: String,
    pub ty: FieldType,
    /// An upsert may leave it out.
    pub optional: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FieldType {
    Keyword,
    /// Analyzed text; `exact` also indexes the whole value as a keyword
    /// (exact filters, group-by).
    Text {
        analyzer: Analyzer,
        exact: bool,
    },
    Integer,
    Float,
    Boolean,
    /// A calendar date or a date and time, ISO 8601.
    Date,
    /// A list of keywords.
    Keywords,
    /// A `/`-separated path, with its ancestors indexed (a prefix search,
    /// a rename of a prefix).
    Path,
    /// The id of a document of another kind (a keyword).
    Ref {
        kind: String,
    },
}

impl FieldType {
    /// The types' names, as a model file writes them.
    pub const NAMES: &'static str = "keyword, text, integer, float, boolean, date, keywords or path";

    /// The name a model file gives the type.
    pub fn name(&self) -> &'static str {
        match self {
            FieldType::Keyword | FieldType::Ref { .. } => "keyword",
            FieldType::Text { .. } => "text",
            FieldType::Integer => "integer",
            FieldType::Float => "float",
            FieldType::Boolean => "boolean",
            FieldType::Date => "date",
            FieldType::Keywords => "keywords",
            FieldType::Path => "path",
        }
    }

    /// The types a field of a nested object, or a copied field, may have.
    pub fn is_scalar(&self) -> bool {
        !matches!(self, FieldType::Path | FieldType::Ref { .. })
    }
}

/// The analyzers a text field may choose, each available on both backends
/// (docs/model.md says how they differ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Analyzer {
    /// Split on word boundaries, lowercased.
    Standard,
    /// Split on whitespace only, case kept.
    Whitespace,
    /// Standard, then English stemming.
    English,
}

impl Analyzer {
    pub const ALL: [Analyzer; 3] = [Analyzer::Standard, Analyzer::Whitespace, Analyzer::English];

    /// The name a model file gives the analyzer.
    pub fn name(self) -> &'static str {
        match self {
            Analyzer::Standard => "standard",
            Analyzer::Whitespace => "whitespace",
            Analyzer::English => "english",
        }
    }
}

/// Fields of an owner that a dependent carries, indexed as
/// `<name>.<field>` and rewritten by a fan-out when the owner changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerCopy {
    pub name: String,
    /// The dependent's ref field naming the owner.
    pub via: String,
    /// The owner's kind.
    pub owner: String,
    pub fields: Vec<String>,
}

/// A list of objects inside a document (an order's lines), each object
/// searchable on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Nested {
    pub name: String,
    pub fields: Vec<Field>,
}

/// Why a model file was refused: where, which field, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelError {
    pub file: String,
    /// 1-based; 0 when the error has no place in the file (it could not
    /// be read).
    pub line: usize,
    pub column: usize,
    /// The dotted path of the declaration (`kinds.order.fields.total`),
    /// empty where the parser could not tell.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ModelError {}

impl Domain {
    /// Reads and checks a model file.
    pub fn load(path: &Path) -> Result<Domain, ModelError> {
        earlier::load(path, 0)
    }

    /// Checks a model file's text; `file` names it in errors. The earlier
    /// versions it names are not loaded (see [`Domain::load`]).
    pub fn parse(file: &str, text: &str) -> Result<Domain, ModelError> {
        check::parse(file, text)
    }

    pub fn kind(&self, name: &str) -> Option<&Kind> {
        self.kinds.iter().find(|k| k.name == name)
    }

    /// The model for the rest of the process: what a worker's commands and
    /// documents point to. One per fingerprint, however often a model is
    /// loaded.
    pub fn interned(self) -> &'static Domain {
        static MODELS: std::sync::Mutex<Vec<(String, &'static Domain)>> = std::sync::Mutex::new(Vec::new());
        let fingerprint = std::iter::once(self.fingerprint()).chain(self.earlier.iter().map(Domain::fingerprint)).collect::<Vec<_>>().join("+");
        let mut models = MODELS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, d)) = models.iter().find(|(f, _)| *f == fingerprint) {
            return d;
        }
        let d: &'static Domain = Box::leak(Box::new(self));
        models.push((fingerprint, d));
        d
    }

    /// A fingerprint of everything the index depends on: equal for two
    /// files that declare the same model, however written (comments,
    /// order, shorthands), and different otherwise. An index records it;
    /// a worker or a verify with another refuses to run.
    pub fn fingerprint(&self) -> String {
        let canonical = serde_json::to_vec(self).expect("a Domain serializes");
        let digest = ring::digest::digest(&ring::digest::SHA256, &canonical);
        digest.as_ref()[..16].iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl Kind {
    pub fn field(&self, name: &str) -> Option<&Field> {
        self.fields.iter().find(|f| f.name == name)
    }

    pub fn nested_list(&self, name: &str) -> Option<&Nested> {
        self.nested.iter().find(|n| n.name == name)
    }

    /// The field whose value is the kind's ordering key (the owner's ref
    /// field, the path field); `None` for a kind keyed by its own id.
    pub fn key_field(&self) -> Option<&str> {
        match &self.key {
            OrderingKey::Id => None,
            OrderingKey::Owner { field, .. } | OrderingKey::PathTop { field } => Some(field),
        }
    }
}
