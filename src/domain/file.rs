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
struct FieldTable {
    #[serde(rename = "type")]
    ty: Option<Spanned<String>>,
    analyzer: Option<Spanned<String>>,
    exact: Option<Spanned<bool>>,
    optional: Option<Spanned<bool>>,
    #[serde(rename = "ref")]
    reference: Option<Spanned<String>>,
}

impl<'de> Deserialize<'de> for FieldFile {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FieldFile;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a type (\"keyword\") or a table ({ type = \"text\", analyzer = \"english\" })")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<FieldFile, E> {
                // A bare type has no place of its own: the check names the field's.
                Ok(FieldFile { ty: Some(Spanned::new(0..0, s.to_owned())), ..FieldFile::default() })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<FieldFile, A::Error> {
                let t = FieldTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(FieldFile { ty: t.ty, analyzer: t.analyzer, exact: t.exact, optional: t.optional, reference: t.reference })
            }
        }
        d.deserialize_any(V)
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
struct KeyTable {
    owner: Option<Spanned<String>>,
    path: Option<Spanned<String>>,
}

impl<'de> Deserialize<'de> for KeyFile {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeyFile;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("\"id\", { owner = \"<a ref field>\" } or { path = \"<a path field>\" }")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<KeyFile, E> {
                Ok(KeyFile::Named(s.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<KeyFile, A::Error> {
                let t = KeyTable::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(KeyFile::Table { owner: t.owner, path: t.path })
            }
        }
        d.deserialize_any(V)
    }
}

/// A copy of an owner's fields: `{ via = "customer_id", fields = ["name"] }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CopyFile {
    pub via: Spanned<String>,
    pub fields: Spanned<Vec<Spanned<String>>>,
}
