//! The tantivy schema of a declared model (docs/model.md, "On the embedded
//! index"), a model document's tantivy documents, and the searches a model
//! promises ([`Filter`]): a term, a text match, a numeric range, and a
//! nested match within one object of a list.
//!
//! A kind's field is the tantivy field `<kind>.<field>`; a copy's
//! `<kind>.<copy>.<field>`; a path's ancestors `<kind>.<path>.tree`; a
//! text's exact value `<kind>.<field>.raw`. A nested list's objects are
//! documents of their own beside their parent's (`<kind>.<list>.<field>`,
//! naming the parent), so that a nested match is one object's: the
//! equivalent of Elasticsearch's `nested`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;

use tantivy::collector::DocSetCollector;
use tantivy::query::{BooleanQuery, Occur, Query, QueryParser, RangeQuery, TermQuery};
use tantivy::schema::{Field, IndexRecordOption, Schema, SchemaBuilder, TextFieldIndexing, TextOptions, Value as _, FAST, INDEXED, STORED, STRING};
use tantivy::{Searcher, TantivyDocument, Term};

use crate::command::generic::{value, Object, Value};
use crate::command::{path, tenant};
use crate::domain::{Analyzer, Domain, Field as DeclaredField, FieldType};
use crate::index::filter::Filter;

/// What a field of the schema holds, for building its terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holds {
    Str,
    Text,
    I64,
    F64,
    Bool,
}

/// A model's part of the shards' schema, with its fields by name: a
/// model's document uses the shards' own key, kind and id fields
/// (`super::schema`), so that every read and write of a shard finds it as
/// it finds a compiled-in kind's.
pub struct ModelSchema {
    domain: &'static Domain,
    schema: Schema,
    /// A document's place ([`doc_key_of`]).
    key: Field,
    /// The kind term ([`marked`]: `@order`, `acme\u{1f}@order`; a nested
    /// list's objects: `@order.lines`).
    kind: Field,
    /// The id, scoped to its tenant.
    id: Field,
    /// A nested object's parent's key.
    parent: Field,
    /// The document as JSON.
    source: Field,
    /// Every field by its full name (`order.customer.name`), for searches.
    fields: BTreeMap<String, (Field, Holds)>,
    /// Each kind's fields by their names, for writing documents.
    kinds: HashMap<String, KindSlots>,
}

/// What [`ModelSchema::declare`] adds to the shards' schema builder.
pub(super) struct Declared {
    parent: Field,
    source: Field,
    fields: BTreeMap<String, (Field, Holds)>,
}

/// A kind's fields, found by name without formatting their full names:
/// its own, and those of each copy and nested list.
struct KindSlots {
    /// The kind's term ([`marked`]).
    marked: String,
    own: HashMap<String, Slot>,
    /// By copy or nested list name.
    within: HashMap<String, HashMap<String, Slot>>,
}

/// A field and those that index its value again: a text's exact value,
/// a path's ancestors.
#[derive(Clone, Copy)]
struct Slot {
    field: Field,
    raw: Option<Field>,
    tree: Option<Field>,
}

/// The shards' fields a model's documents share.
pub(super) struct Shared {
    pub(super) key: Field,
    pub(super) kind: Field,
    pub(super) id: Field,
}

impl ModelSchema {
    /// Adds the fields of `d` to the shards' schema builder `b`.
    pub(super) fn declare(b: &mut SchemaBuilder, d: &Domain) -> Declared {
        let (parent, source) = (b.add_text_field("_parent", STRING | STORED), b.add_text_field("_source", STORED));
        let mut fields = BTreeMap::new();
        let mut add = |name: String, f: &DeclaredField| {
            let (field, holds) = match &f.ty {
                FieldType::Text { analyzer, exact } => {
                    let tokenizer = match analyzer {
                        Analyzer::Standard => "default",
                        Analyzer::Whitespace => "whitespace",
                        Analyzer::English => "en_stem",
                    };
                    let indexing = TextFieldIndexing::default().set_tokenizer(tokenizer).set_index_option(IndexRecordOption::WithFreqsAndPositions);
                    if *exact {
                        fields.insert(format!("{name}.raw"), (b.add_text_field(&format!("{name}.raw"), STRING), Holds::Str));
                    }
                    (b.add_text_field(&name, TextOptions::default().set_indexing_options(indexing)), Holds::Text)
                }
                FieldType::Integer => (b.add_i64_field(&name, INDEXED | FAST), Holds::I64),
                FieldType::Float => (b.add_f64_field(&name, INDEXED | FAST), Holds::F64),
                FieldType::Boolean => (b.add_bool_field(&name, INDEXED), Holds::Bool),
                FieldType::Path => {
                    fields.insert(format!("{name}.tree"), (b.add_text_field(&format!("{name}.tree"), STRING), Holds::Str));
                    (b.add_text_field(&name, STRING), Holds::Str)
                }
                FieldType::Keyword | FieldType::Ref { .. } | FieldType::Keywords | FieldType::Date => (b.add_text_field(&name, STRING), Holds::Str),
            };
            fields.insert(name, (field, holds));
        };
        for k in &d.kinds {
            for f in &k.fields {
                add(format!("{}.{}", k.name, f.name), f);
            }
            for c in &k.copies {
                let owner = d.kind(&c.owner).expect("a checked model's copies name kinds");
                for f in &c.fields {
                    add(format!("{}.{}.{f}", k.name, c.name), owner.field(f).expect("a checked copy names its owner's fields"));
                }
            }
            for n in &k.nested {
                for f in &n.fields {
                    add(format!("{}.{}.{}", k.name, n.name, f.name), f);
                }
            }
        }
        Declared { parent, source, fields }
    }

    pub(super) fn finish(domain: &'static Domain, schema: Schema, shared: Shared, declared: Declared) -> Self {
        let Declared { parent, source, fields } = declared;
        let slot = |name: String| fields.get(&name).map(|&(field, _)| Slot { field, raw: fields.get(&format!("{name}.raw")).map(|f| f.0), tree: fields.get(&format!("{name}.tree")).map(|f| f.0) });
        let slots = |prefix: String, names: &mut dyn Iterator<Item = &String>| -> HashMap<String, Slot> { names.filter_map(|n| slot(format!("{prefix}.{n}")).map(|s| (n.clone(), s))).collect() };
        let kinds = domain
            .kinds
            .iter()
            .map(|k| {
                let mut within: HashMap<String, HashMap<String, Slot>> = k.copies.iter().map(|c| (c.name.clone(), slots(format!("{}.{}", k.name, c.name), &mut c.fields.iter()))).collect();
                within.extend(k.nested.iter().map(|n| (n.name.clone(), slots(format!("{}.{}", k.name, n.name), &mut n.fields.iter().map(|f| &f.name)))));
                (k.name.clone(), KindSlots { marked: marked(&k.name), own: slots(k.name.clone(), &mut k.fields.iter().map(|f| &f.name)), within })
            })
            .collect();
        ModelSchema { domain, schema, key: shared.key, kind: shared.kind, id: shared.id, parent, source, fields, kinds }
    }

    pub fn schema(&self) -> Schema {
        self.schema.clone()
    }

    /// The term of a document's place.
    pub fn key_term(&self, tenant: Option<&str>, kind: &str, id: &str) -> Term {
        Term::from_field_text(self.key, &doc_key_of(&marked(kind), &tenant::scope(tenant, id)))
    }

    /// The tantivy documents of one model document: its own, then one per
    /// object of its nested lists. Delete them all by [`Self::key_term`]
    /// and the parent term ([`Self::parent_term`]) before a rewrite.
    pub fn documents(&self, tenant: Option<&str>, kind: &str, id: &str, fields: &Object, copies: &BTreeMap<String, Object>) -> Vec<TantivyDocument> {
        let slots = self.kinds.get(kind).expect("a model document is of a kind of its model");
        let scoped = tenant::scope(tenant, id);
        let key = doc_key_of(&slots.marked, &scoped);
        let mut own = TantivyDocument::new();
        own.add_text(self.key, &key);
        own.add_text(self.kind, tenant::scope(tenant, &slots.marked));
        own.add_text(self.id, scoped);
        own.add_text(self.source, value::document_json_text(id, fields, copies));
        let mut out = vec![own];
        for (name, v) in fields {
            match v {
                Value::Objects(objects) => {
                    let within = slots.within.get(name);
                    let marked = tenant::scope(tenant, &marked(&format!("{kind}.{name}")));
                    for o in objects {
                        let mut child = TantivyDocument::new();
                        child.add_text(self.kind, &marked);
                        child.add_text(self.parent, &key);
                        Self::add_all(&mut child, within, o);
                        out.push(child);
                    }
                }
                _ => {
                    if let Some(slot) = slots.own.get(name) {
                        Self::add(&mut out[0], slot, v);
                    }
                }
            }
        }
        for (copy, o) in copies {
            Self::add_all(&mut out[0], slots.within.get(copy), o);
        }
        out
    }

    /// The term of every nested object of the document at `key`'s place.
    pub fn parent_term(&self, tenant: Option<&str>, kind: &str, id: &str) -> Term {
        Term::from_field_text(self.parent, &doc_key_of(&marked(kind), &tenant::scope(tenant, id)))
    }

    /// The kind `name` of the model.
    pub(super) fn kind_named(&self, name: &str) -> Option<crate::index::ModelKind> {
        crate::index::ModelKind::of(self.domain, name)
    }

    /// Whether `kind` has nested lists, whose objects are documents of
    /// their own beside their parent's.
    pub(super) fn has_nested(&self, kind: &crate::domain::Kind) -> bool {
        !kind.nested.is_empty()
    }

    /// Whether `t` is an object of a nested list, not a document.
    pub(super) fn is_nested_object(&self, t: &TantivyDocument) -> bool {
        t.get_first(self.parent).is_some()
    }

    /// The stored JSON of a model document.
    pub(super) fn source_of<'t>(&self, t: &'t TantivyDocument) -> Option<&'t str> {
        t.get_first(self.source).and_then(|v| v.as_str())
    }

    /// The field `<kind>.<field>` (a path's ancestors: `<kind>.<field>.tree`).
    pub(super) fn field_named(&self, name: &str) -> Option<Field> {
        self.fields.get(name).map(|(f, _)| *f)
    }

    fn add_all(t: &mut TantivyDocument, slots: Option<&HashMap<String, Slot>>, o: &Object) {
        let Some(slots) = slots else { return };
        for (name, v) in o {
            if let Some(slot) = slots.get(name) {
                Self::add(t, slot, v);
            }
        }
    }

    fn add(t: &mut TantivyDocument, slot: &Slot, v: &Value) {
        let field = slot.field;
        match v {
            Value::Str(s) => {
                t.add_text(field, s);
                if let Some(raw) = slot.raw {
                    t.add_text(raw, s);
                }
                if let Some(tree) = slot.tree {
                    for a in path::tree(s) {
                        t.add_text(tree, a);
                    }
                }
            }
            Value::Int(i) => t.add_i64(field, *i),
            Value::Float(x) => t.add_f64(field, *x),
            Value::Bool(b) => t.add_bool(field, *b),
            Value::List(items) => items.iter().for_each(|s| t.add_text(field, s)),
            Value::Objects(_) => {}
        }
    }

    /// The ids of the documents of `kind` in `tenant` that every filter
    /// matches, sorted.
    pub fn search(&self, searcher: &Searcher, tenant: Option<&str>, kind: &str, filters: &[Filter]) -> tantivy::Result<Vec<String>> {
        Ok(self.matching(searcher, tenant, kind, filters)?.into_iter().map(|(id, _)| id).collect())
    }

    /// [`Self::search`]'s documents: each id with its stored JSON, by id.
    pub fn matching(&self, searcher: &Searcher, tenant: Option<&str>, kind: &str, filters: &[Filter]) -> tantivy::Result<Vec<(String, String)>> {
        if !self.domain.kinds.iter().any(|k| k.name == kind) {
            return Err(tantivy::TantivyError::InvalidArgument(format!("{kind:?} is not a kind of model {}", self.domain.name)));
        }
        let mut all: Vec<(Occur, Box<dyn Query>)> = vec![(Occur::Must, self.term(self.kind, &tenant::scope(tenant, &marked(kind))))];
        for f in filters {
            all.push((Occur::Must, self.query(searcher, tenant, kind, f)?));
        }
        let mut out = Vec::new();
        for a in searcher.search(&BooleanQuery::new(all), &DocSetCollector)? {
            let doc: TantivyDocument = searcher.doc(a)?;
            let id = doc.get_first(self.id).and_then(|v| v.as_str()).map(|id| tenant::unscoped(id).to_string());
            if let Some(id) = id {
                out.push((id, self.source_of(&doc).unwrap_or("{}").to_string()));
            }
        }
        out.sort();
        Ok(out)
    }

    fn term(&self, field: Field, value: &str) -> Box<dyn Query> {
        Box::new(TermQuery::new(Term::from_field_text(field, value), IndexRecordOption::Basic))
    }

    fn field(&self, name: &str) -> tantivy::Result<(Field, Holds)> {
        self.fields.get(name).copied().ok_or_else(|| tantivy::TantivyError::FieldNotFound(name.to_string()))
    }

    /// The query of one filter on the documents of `scope` (a kind, or a
    /// kind's nested list).
    fn query(&self, searcher: &Searcher, tenant: Option<&str>, scope: &str, f: &Filter) -> tantivy::Result<Box<dyn Query>> {
        Ok(match f {
            Filter::Term { field, value } => {
                let (fd, holds) = self.field(&format!("{scope}.{field}"))?;
                // A checked filter's value is of its field's type ([`Filter::check`]).
                let unchecked = || tantivy::TantivyError::InvalidArgument(format!("{field}: {value:?} is not of the field's type"));
                let exact = |t: Term| -> Box<dyn Query> { Box::new(TermQuery::new(t, IndexRecordOption::Basic)) };
                match holds {
                    Holds::Bool => exact(Term::from_field_bool(fd, value == "true")),
                    Holds::I64 => exact(Term::from_field_i64(fd, value.parse().map_err(|_| unchecked())?)),
                    Holds::F64 => exact(Term::from_field_f64(fd, value.parse().map_err(|_| unchecked())?)),
                    _ => self.term(fd, value),
                }
            }
            Filter::Match { field, text } => {
                let (fd, _) = self.field(&format!("{scope}.{field}"))?;
                let mut parser = QueryParser::new(self.schema.clone(), vec![fd], tantivy::tokenizer::TokenizerManager::default());
                parser.set_conjunction_by_default();
                // Words only: the parser's syntax is not the model's.
                let words: String = text.chars().map(|c| if c.is_alphanumeric() { c } else { ' ' }).collect();
                parser.parse_query(&words).map_err(|e| tantivy::TantivyError::InvalidArgument(e.to_string()))?
            }
            Filter::Above { field, gt } => {
                let (fd, holds) = self.field(&format!("{scope}.{field}"))?;
                let lower = match holds {
                    Holds::I64 => Term::from_field_i64(fd, gt.floor() as i64 + 1),
                    Holds::F64 => Term::from_field_f64(fd, gt.next_up()),
                    _ => return Err(tantivy::TantivyError::InvalidArgument(format!("{field} is not a number"))),
                };
                Box::new(RangeQuery::new(Bound::Included(lower), Bound::Unbounded))
            }
            Filter::Nested { list, all } => {
                let within = format!("{scope}.{list}");
                let mut q: Vec<(Occur, Box<dyn Query>)> = vec![(Occur::Must, self.term(self.kind, &tenant::scope(tenant, &marked(&within))))];
                for f in all {
                    q.push((Occur::Must, self.query(searcher, tenant, &within, f)?));
                }
                let mut parents = BTreeSet::new();
                for a in searcher.search(&BooleanQuery::new(q), &DocSetCollector)? {
                    let doc: TantivyDocument = searcher.doc(a)?;
                    parents.extend(doc.get_first(self.parent).and_then(|v| v.as_str()).map(str::to_string));
                }
                let keys: Vec<(Occur, Box<dyn Query>)> = parents.iter().map(|k| (Occur::Should, self.term(self.key, k))).collect();
                Box::new(BooleanQuery::new(keys))
            }
        })
    }
}

/// A document's place as one term (`super::schema::doc_key`) for a kind
/// by name: `kind:id`, and `kind;<tenant>\u{1f}<id>` for a tenant's.
pub(super) fn doc_key_of(kind: &str, id: &str) -> String {
    match tenant::of(id) {
        None => format!("{kind}:{id}"),
        Some(_) => format!("{kind};{id}"),
    }
}

/// A model's kind as the shards' `kind` and key terms name it: marked, so
/// that a model's `file` is never the compiled-in kind of that name.
pub(super) fn marked(kind: &str) -> String {
    format!("{MARK}{kind}")
}

/// What [`marked`] puts before a model's kind.
pub(super) const MARK: char = '@';
