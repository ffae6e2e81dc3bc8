//! The model file as written: TOML read with serde, every name and value
//! kept with its place in the file (`Spanned`) so that a check can name the
//! line. Nothing here is checked beyond its shape; `check.rs` makes a
//! [`super::Domain`] of it.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    pub name: Spanned<String>,
    pub version: Spanned<u32>,
    /// Files of earlier versions, relative to this one's directory.
    #[serde(default)]
    pub earlier: Vec<Spanned<String>>,
    #[serde(default)]
    pub kinds: BTreeMap<Spanned<String>, Spanned<KindFile>>,
}

/// Fields by name, as declared.
pub(super) type FieldsFile = BTreeMap<Spanned<String>, Spanned<FieldFile>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KindFile {
    pub key: Spanned<KeyFile>,
    #[serde(default)]
    pub fields: FieldsFile,
    #[serde(default)]
    pub copies: BTreeMap<Spanned<String>, Spanned<CopyFile>>,
    #[serde(default)]
    pub nested: BTreeMap<Spanned<String>, Spanned<FieldsFile>>,
}

/// A field: `"keyword"`, or a table (`{ type = "text", analyzer = "english" }`,
/// `{ type = "keyword", ref = "customer" }`).
#[derive(Debug, Default)]
pub(super) struct FieldFile {
    pub ty: Option<Spanned<String>>,
    pub analyzer: Option<Spanned<String>>,
    pub exact: Option<Spanned<bool>>,
    pub optional: Option<Spanned<bool>>,
    pub reference: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FieldTable {
    #[serde(rename = "type")]
    ty: Option<Spanned<String>>,
    analyzer: Option<Spanned<String>>,
    exact: Option<Spanned<bool>>,
    optional: Option<Spanned<bool>>,
    #[serde(rename = "ref")]
    reference: Option<Spanned<String>>,
}

impl StrOrTable for FieldFile {
    type Table = FieldTable;
    const EXPECTING: &'static str = "a type (\"keyword\") or a table ({ type = \"text\", analyzer = \"english\" })";
    fn from_str(s: &str) -> Self {
        // A bare type has no place of its own: the check names the field's.
        FieldFile { ty: Some(Spanned::new(0..0, s.to_owned())), ..FieldFile::default() }
    }
    fn from_table(t: FieldTable) -> Self {
        FieldFile { ty: t.ty, analyzer: t.analyzer, exact: t.exact, optional: t.optional, reference: t.reference }
    }
}

impl<'de> Deserialize<'de> for FieldFile {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        str_or_table(d)
    }
}

/// A kind's ordering key: `"id"`, `{ owner = "customer_id" }` or
/// `{ path = "path" }`.
#[derive(Debug)]
pub(super) enum KeyFile {
    Named(String),
    Table { owner: Option<Spanned<String>>, path: Option<Spanned<String>> },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KeyTable {
    owner: Option<Spanned<String>>,
    path: Option<Spanned<String>>,
}

impl StrOrTable for KeyFile {
    type Table = KeyTable;
    const EXPECTING: &'static str = "\"id\", { owner = \"<a ref field>\" } or { path = \"<a path field>\" }";
    fn from_str(s: &str) -> Self {
        KeyFile::Named(s.to_owned())
    }
    fn from_table(t: KeyTable) -> Self {
        KeyFile::Table { owner: t.owner, path: t.path }
    }
}

impl<'de> Deserialize<'de> for KeyFile {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        str_or_table(d)
    }
}

/// A copy of an owner's fields: `{ via = "customer_id", fields = ["name"] }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CopyFile {
    pub via: Spanned<String>,
    pub fields: Spanned<Vec<Spanned<String>>>,
}

/// A declaration written either as a string (the shorthand) or as a table.
pub(super) trait StrOrTable: Sized {
    type Table: de::DeserializeOwned;
    /// What the error for any other value says is expected.
    const EXPECTING: &'static str;
    fn from_str(s: &str) -> Self;
    fn from_table(t: Self::Table) -> Self;
}

fn str_or_table<'de, D: de::Deserializer<'de>, T: StrOrTable>(d: D) -> Result<T, D::Error> {
    struct V<T>(std::marker::PhantomData<T>);
    impl<'de, T: StrOrTable> Visitor<'de> for V<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(T::EXPECTING)
        }
        fn visit_str<E: de::Error>(self, s: &str) -> Result<T, E> {
            Ok(T::from_str(s))
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            T::Table::deserialize(de::value::MapAccessDeserializer::new(map)).map(T::from_table)
        }
    }
    d.deserialize_any(V(std::marker::PhantomData))
}
